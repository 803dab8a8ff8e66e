// The prefill workspace: one caller-owned device buffer carved into the plan arrays and the
// partial-state buffers, sized once for the worst case of a BatchPrefillConfig so every pointer is
// fixed for the life of the object (what CUDA-graph replay needs).
//
// Layout: [plan: header | cta indptr | work items, merge items][partial lse][partial o][arrivals]
// Partial states: max_prefill_slots(num_ctas) = 2 * num_ctas slots of 128 rows (the largest query
// tile) of head_dim floats + 1 lse (prefill_scheduler.h proves the bound). The plan region is laid
// out for the most CTAs the config allows; a plan with fewer CTAs (a kernel with less occupancy)
// pads the CTA index array, so the device pointers never depend on the plan.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "attention/prefill_plan.cuh"
#include "flashkv/prefill.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::ops {

class PrefillWorkspace {
 public:
  PrefillWorkspace() = default;
  PrefillWorkspace(const BatchPrefillConfig& cfg, void* base, size_t bytes);
  static size_t required_bytes(const BatchPrefillConfig& cfg);

  int max_ctas() const { return sizes_.max_ctas; }
  int max_work_items() const { return sizes_.max_work_items; }
  int max_slots() const { return sizes_.max_slots; }
  const scheduler::PrefillPlanLayout& plan_layout() const { return sizes_.layout; }
  CUdeviceptr plan_device_ptr() const { return reinterpret_cast<CUdeviceptr>(base_); }
  PrefillPlanPtrs plan_ptrs() const;

 private:
  struct Sizes {
    int sms = 0, max_ctas = 0, max_work_items = 0, max_slots = 0, max_merge_items = 0;
    scheduler::PrefillPlanLayout layout;
    size_t lse_offset = 0, o_offset = 0, arrivals_offset = 0, total = 0;
  };
  static Sizes sizes(const BatchPrefillConfig& cfg);

  std::byte* base_ = nullptr;
  Sizes sizes_{};
};

}  // namespace flashkv::ops
