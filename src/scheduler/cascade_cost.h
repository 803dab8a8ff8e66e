// When is a cascade worth it? A cost model over a CascadeLayout (prefix_sharing.h). Pure C++.
//
// Decode and short-append attention are memory-bound: the time is the bytes read from DRAM. Plain
// batch attention reads each request's whole KV, but the members of a group read the same prefix
// pages at about the same time, so a prefix that fits in the L2 is fetched from DRAM about once
// anyway; a larger one is re-fetched for most members. The cascade reads each group's pages once,
// saving
//   bytes_saved = Σ over shared groups (group_size − 1) × group_kv_len × kv_token_bytes
// of which plain really pays the part that does not stay in L2 (miss fraction
// max(0, 1 − l2_reuse_bytes / prefix_bytes)), and pays for it with
//   - one more attention pass per extra level (a launch or a CUDA-graph node, the tail of a grid
//     that is not full, the gather and the merge): level_overhead_us each;
//   - the per-level partial states: every level writes (O, LSE) for every (row, qo head) and the
//     merge reads them all and writes the output: (2 L + 1) × rows × H_qo × (D + 1) × 4 bytes;
//   - the prefix pass's matrix work: with n rows per group it is 4 × rows × H_qo × kv_len × D
//     FLOPs, compute-bound for large groups: max(read time, FLOPs / prefix_flops_per_us).
// The cascade is used when its estimated time is below (1 − min_relative_gain) × the plain time.
//
// Calibrated on the H200 (bench/results/cascade-2026-11-29-*.json, `flashkv bench cascade`: n in
// {1, 4, 16, 64} sharing 1k / 8k / 32k tokens, suffixes 128-1024, GQA 32/8, D 128, f16): plain
// decode streams ~4.0 TB/s; the cascade's fixed cost was ~10 µs (n = 4, 1k: 41.2 vs 31.4 µs);
// with 1k prompts (4 MB per layer) plain was faster at every n (L2 reuse), with 32k prompts the
// cascade was 2.2-4.0x faster, with 8k 1.1-2.3x.
#pragma once

#include <cstdint>

#include "scheduler/prefix_sharing.h"

namespace flashkv::scheduler {

struct CascadeCostModel {
  double read_bytes_per_us = 4.0e6;       // plain decode's achieved bandwidth (H200: ~4.0 TB/s)
  double l2_reuse_bytes = 8.0 * (1 << 20);  // a shared prefix this small is re-read from L2
  double prefix_flops_per_us = 2.5e8;     // the prefill kernel on unmasked tiles (~250 TFLOP/s)
  double state_bytes_per_us = 3.4e6;      // partial-state writes + merge reads
  double level_overhead_us = 12.0;        // fixed cost of each extra level (pass, gather, merge)
  double min_relative_gain = 0.05;        // cascade must be >= 5 % faster by the estimate
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
  int64_t plain_dram_bytes = 0;  // what plain really fetches (shared prefixes beyond L2 reuse)
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
