// The multi-level cascade kernels' parameters (cascade_merge.cuh), shared with the host
// (src/ops/cascade/multi_level_cascade.cpp). Includes nothing.
#pragma once

namespace flashkv {

constexpr int kCascadeMaxLevels = 4;

struct CascadeRowsParams {
  const int* num_rows;  // device: cascade rows of the plan in force
  const int* rows;      // [num_rows] original row of each cascade row
  int num_heads, head_dim;
};

struct CascadeMergeParams {
  CascadeRowsParams r;
  int num_levels;
  const void* o[kCascadeMaxLevels];     // per level [num_rows, H, D] contiguous, cascade order
  const float* lse[kCascadeMaxLevels];  // per level [num_rows, H], natural log
  void* out;                            // [rows of the batch, H, D] in the caller's order
  float* out_lse;                       // [.., H] or nullptr
  long long o_stride_n, o_stride_h, lse_stride_n;
};

}  // namespace flashkv
