// When is a cascade worth it? A cost model over a CascadeLayout (prefix_sharing.h). Pure C++.
//
// Decode and short-append attention are memory-bound: the time is the bytes read. Plain batch
// attention reads each request's whole KV; the cascade reads each group's pages once, so it saves
//   bytes_saved = Σ over shared groups (group_size − 1) × group_kv_len × kv_token_bytes
// and pays for it with
//   - one more attention pass per extra level (a launch or a CUDA-graph node, plus the tail of a
//     grid that is not full): level_overhead_us each;
//   - the per-level partial states: every level writes (O, LSE) in f32 for every (row, qo head)
//     and the merge reads them all and writes the output: (2 L + 1) × rows × H_qo × (D + 1) × 4
//     bytes instead of the plain op's one output write;
//   - the prefix pass's large query tile runs at its own efficiency (tensor cores, few CTAs when
//     there are few groups): prefix_read_efficiency scales its bandwidth.
// The cascade is used when its estimated time is below (1 − min_relative_gain) × the plain time:
// the margin absorbs the model's error, so a near-tie keeps the plain op.
//
// Every parameter below is TO BE MEASURED ON THE GPU (issue 7, "Measure": n in {1, 4, 16, 64}
// sharing 1k/8k/32k tokens, suffixes 128-1024). The defaults are placeholders: the H200 read
// ceiling (4.50 TB/s, NOTES.md) at the decode kernel's large-batch efficiency (~0.9, D5/D6), and a
// guessed 5 µs per extra pass. The clear-cut decisions do not depend on them: a layout with
// nothing shared never cascades; 64 requests sharing 8k tokens always do (hundreds of µs saved).
#pragma once

#include <cstdint>

#include "scheduler/prefix_sharing.h"

namespace flashkv::scheduler {

struct CascadeCostModel {
  double read_bytes_per_us = 4.50e6 * 0.9;   // TO MEASURE: plain decode's achieved bandwidth
  double prefix_read_efficiency = 1.0;       // TO MEASURE: shared-prefix pass vs plain bandwidth
  double state_bytes_per_us = 4.25e6 * 0.8;  // TO MEASURE: partial-state write + merge read
  double level_overhead_us = 5.0;            // TO MEASURE: fixed cost of each extra level's pass
  double min_relative_gain = 0.05;           // cascade must be >= 5 % faster by the estimate
};

// Shapes the byte counts need (q/o rows are per query head, KV tokens per kv head).
struct CascadeProblemShape {
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int kv_dtype_bytes = 2;  // f16/bf16; 1 for fp8
  int64_t kv_token_bytes() const { return int64_t{2} * num_kv_heads * head_dim * kv_dtype_bytes; }
};

struct CascadeEstimate {
  int64_t plain_kv_bytes = 0;    // Σ requests kv_len × kv_token_bytes
  int64_t cascade_kv_bytes = 0;  // Σ groups (all levels) kv_len × kv_token_bytes
  int64_t bytes_saved = 0;       // plain_kv_bytes − cascade_kv_bytes
  int64_t state_bytes = 0;       // extra partial-state traffic of the cascade
  double plain_us = 0, cascade_us = 0;
  bool use_cascade = false;
};

// Estimates both paths for `layout` and decides. Throws flashkv::Error on a non-positive shape
// or model parameter.
CascadeEstimate estimate_cascade(const CascadeLayout& layout, const CascadeProblemShape& shape,
                                 const CascadeCostModel& model = {});

}  // namespace flashkv::scheduler
