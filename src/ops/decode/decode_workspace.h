// The decode workspace: one caller-owned device buffer carved into the plan arrays and the
// partial-state buffers. Sized once for the worst case of a BatchDecodeConfig, so every pointer
// is fixed for the life of the BatchDecode (what CUDA-graph replay needs).
//
// Layout: [plan: header | indptr | work items, merge items][partial lse][partial o][merge arrivals]
// Partial states: 2 * num_ctas * H_qo rows of (D floats + 1 lse), the scheduler's bound
// (docs/design.md "Workspace"); with GQA group g a slot holds g rows, so there are
// 2 * num_ctas * H_qo / g >= 2 * num_ctas slots. A config sized for fixed_split_size
// (max_kv_tokens) may raise the row count (decode_workspace.cpp). A caller's buffer smaller than
// that (FlashInfer's users pass one fixed buffer) holds as many rows as fit after the plan arrays,
// down to none (min_bytes): the scheduler then fits its splits into the slots there are
// (DecodeScheduleOptions::max_slots).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "attention/decode/decode_plan.cuh"
#include "flashkv/decode.h"
#include "ops/common/workspace_fit.h"
#include "scheduler/decode_scheduler.h"
#include "tuning/policy.cuh"

namespace flashkv::ops {

class DecodeWorkspace {
 public:
  DecodeWorkspace() = default;
  DecodeWorkspace(const BatchDecodeConfig& cfg, void* base, size_t bytes);
  static size_t required_bytes(const BatchDecodeConfig& cfg);  // never limits splitting
  static size_t min_bytes(const BatchDecodeConfig& cfg);       // plan arrays, no partial states

  // BatchDecodeConfig.ctas_per_sm = 0 (auto): room for this many CTAs per SM, the most auto picks.
  static constexpr int kAutoCtasPerSm = tuning::Policy::kDecodeAutoMaxCtasPerSm;
  int num_ctas() const { return num_ctas_; }  // the most a plan may use
  int sms() const { return sms_; }
  int max_work_items() const { return max_work_items_; }
  int slot_capacity(int group, int head_dim) const;
  size_t partial_rows() const { return partial_rows_; }
  size_t bytes_used() const { return bytes_used_; }
  size_t full_bytes() const { return full_bytes_; }  // required_bytes of the config
  const scheduler::DecodePlanLayout& plan_layout() const { return layout_; }
  CUdeviceptr plan_device_ptr() const { return reinterpret_cast<CUdeviceptr>(base_); }
  DecodePlanPtrs plan_ptrs() const;

  struct Sizes {
    int sms, num_ctas, max_work_items, max_merge_items;
    scheduler::DecodePlanLayout layout;
    PartialStateRegion states;  // after the plan image (common/workspace_fit.h)
    size_t partial_rows, total;
    size_t full_total, min_total;  // with every row the config may need; with none
  };
  // The layout in `bytes` on a GPU of `sms` SMs: every partial-state row the config may need, or
  // as many as fit (none when `bytes` < min_total). Pure: the CPU tests call it.
  static Sizes layout_for(const BatchDecodeConfig& cfg, int sms, size_t bytes);

 private:
  // layout_for on cfg.device.
  static Sizes sizes(const BatchDecodeConfig& cfg, size_t bytes);

  std::byte* base_ = nullptr;
  int sms_ = 0, num_ctas_ = 0, max_work_items_ = 0;
  size_t partial_rows_ = 0, lse_offset_ = 0, o_offset_ = 0, arrivals_offset_ = 0;
  size_t bytes_used_ = 0, full_bytes_ = 0;
  int max_merge_items_ = 0;
  int max_head_dim_ = 0;
  scheduler::DecodePlanLayout layout_{};
};

}  // namespace flashkv::ops
