// The prefill workspace: one caller-owned device buffer carved into the plan arrays and the
// partial-state buffers, sized once for the worst case of a BatchPrefillConfig so every pointer is
// fixed for the life of the object (what CUDA-graph replay needs).
//
// Layout: [plan: header | cta indptr | work items, merge items][partial lse][partial o][arrivals]
// Partial states: rows of head_dim floats + 1 lse; a plan of R-row query tiles has rows / R slots.
// max_split_slots(num_ctas) = 2 * num_ctas slots of 128 rows (the largest query tile) never limit
// splitting (prefill_scheduler.h proves the bound); a smaller caller's buffer holds as many rows as
// fit after the plan arrays, down to none (min_bytes), and the scheduler fits its splits into the
// slots there are (PrefillScheduleOptions::max_slots). The plan region is laid
// out for the most CTAs the config allows; a plan with fewer CTAs (a kernel with less occupancy)
// pads the CTA index array, so the device pointers never depend on the plan.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "attention/prefill/prefill_plan.cuh"
#include "flashkv/prefill.h"
#include "ops/common/workspace_fit.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::ops {

class PrefillWorkspace {
 public:
  PrefillWorkspace() = default;
  PrefillWorkspace(const BatchPrefillConfig& cfg, void* base, size_t bytes);
  static size_t required_bytes(const BatchPrefillConfig& cfg);  // never limits splitting
  static size_t min_bytes(const BatchPrefillConfig& cfg);       // plan arrays, no partial states

  int max_ctas() const { return sizes_.max_ctas; }
  int max_work_items() const { return sizes_.max_work_items; }
  int slot_capacity(int tile_rows) const;  // slots of tile_rows rows the partial states hold
  size_t bytes_used() const { return sizes_.total; }
  size_t full_bytes() const { return sizes_.full_total; }  // required_bytes of the config
  const scheduler::PrefillPlanLayout& plan_layout() const { return sizes_.layout; }
  CUdeviceptr plan_device_ptr() const { return reinterpret_cast<CUdeviceptr>(base_); }
  PrefillPlanPtrs plan_ptrs() const;

  struct Sizes {
    int sms = 0, max_ctas = 0, max_work_items = 0, max_merge_items = 0;
    scheduler::PrefillPlanLayout layout;
    PartialStateRegion states;  // after the plan image (common/workspace_fit.h)
    size_t partial_rows = 0, total = 0;
    size_t full_total = 0, min_total = 0;  // with every row the config may need; with none
  };
  // The layout in `bytes` on a GPU of `sms` SMs: every partial-state row the config may need, or
  // as many as fit (none when `bytes` < min_total). Pure: the CPU tests call it.
  static Sizes layout_for(const BatchPrefillConfig& cfg, int sms, size_t bytes);

 private:
  // layout_for on cfg.device.
  static Sizes sizes(const BatchPrefillConfig& cfg, size_t bytes);

  std::byte* base_ = nullptr;
  Sizes sizes_{};
};

}  // namespace flashkv::ops
