// When is a cascade worth it? A cost model over a CascadeLayout (prefix_sharing.h). Pure C++.
//
// Both paths are estimated in µs from the layout's byte counts, with terms for what the H200
// measurements showed each kernel does (bench/results/cascade-2026-12-02-*, `flashkv bench
// cascade`; NOTES.md "Cascade"). Token bytes: 2 × H_kv × D × dtype. k_dec(D), k_pre(D): the decode
// and prefill kernels' time per byte at head_dim D relative to D = 128.
//
// Plain batch decode reads every request's whole KV: the unique bytes U (each shared page once)
// come from DRAM, the re-reads R = plain − U of shared pages mostly hit L2, because the members'
// chunks of the same prefix run at about the same time (even for prefixes far beyond L2's 50 MB:
// 64 × 32k, 8.7 GB, ran at 9.2 TB/s). DRAM and L2 streams overlap partly (a power mean):
//   plain = decode_fixed + k_dec(D) × ((U/dram)^p + ((U + R)/l2)^p)^(1/p) + k_dec(D) × miss / dram
// miss: members whose lengths differ get differently cut chunks and read the prefix out of step;
// a group then re-fetches part of its prefix from DRAM:
//   miss = Σ shared groups misaligned_reread × prefix_bytes × min(1, length spread /
//          misaligned_spread_tokens) × min(1, prefix_bytes / misaligned_full_bytes).
//
// The cascade runs the shared levels on the prefill kernel (no mask; query tile from
// choose_query_tile_rows over the groups' rows, 128-row tiles at D <= 128 on the tensor-core
// wgmma kernel, one CTA per SM; other tiles on the mma.sync kernel, two per SM), the suffix level
// on the decode kernel, then gathers and merges the levels' states:
//   cascade = cascade_fixed + per_row × rows + (levels − 2) × extra_level
//           + Σ shared groups [k_pre(D) × bytes / prefix_bytes_per_us + FLOPs / F_kernel
//                              + chunks × tiles × chunk_cost × D / 128]
//           + k_dec(D) × suffix_bytes / dram + (suffix_split if the longest suffix is split)
//           + (2 L + 1) × rows × H_qo × (D + 1) × 4 / dram            (partial states, merge)
// FLOPs = 4 × rows × H_qo × kv_len × D; F_kernel is a marginal rate (part of the math hides under
// the loads, so the wgmma kernel's exceeds the 772 TFLOP/s GEMM peak). chunks: the prefill
// scheduler's KV split (chunk = max(128, ⌈Σ tiles × H_kv × kv_len / CTAs⌉)); each chunk's partial
// state is merged into its tile's output at the end (chunk_cost: wgmma per chunk, mma.sync per
// chunk and row of the tile). The suffix pass's decode splits its longest suffix when it exceeds
// max(128, Σ suffix tokens × H_kv / decode_ctas), and the split's merge costs suffix_split.
// The cascade is used when its estimate is below (1 − min_relative_gain) × the plain one.
//
// Fitted (least squares on log time, both paths, plus a penalty for a decision on the wrong side
// of, or within 2.5 % of, the measured faster path; tests/cpu/test_cascade_cost.cpp) on 174
// configurations of bench/results/cascade-2026-12-02-2b1fc0a.json (run with the previous model):
// GQA 32/8 D 128, n ∈ {1, 2, 4, 8, 16, 32, 64} × prompts {1k, 2k, 4k, 8k, 16k, 32k} × suffixes
// 128-1024, 16-128, 2048-4096; MHA 32/32 D 128 and GQA 32/8 D 64 / 256 (suffixes 128-1024).
// Calibrated for decode (one query row per request) on the H200; prefill / append cascades use
// the same terms, unmeasured. On the fit grid the defaults pick the faster path (or one within 3 %)
// in 156 of 159 shared configurations; the 3 misses cost 3.8-5.6 % (the test lists them).
#pragma once

#include <cstdint>

#include "scheduler/prefix_sharing.h"
#include "tuning/policy.cuh"

namespace flashkv::scheduler {

// The parameters, each with the measurement behind it (bench/results/cascade-2026-12-02-2b1fc0a).
struct CascadeCostModel {
  // --- plain batch decode ---
  // n = 1 (no sharing): 9.6 µs at 1k tokens (4.7 MB), 41.6 µs at 32k (134 MB).
  double decode_fixed_us = 9.70181;
  double dram_bytes_per_us = 4.60568e+06;  // unique KV bytes (the run's read ceiling: 4.53 TB/s)
  // All KV bytes the decode kernel streams, L2 re-reads included: 64 × 32k GQA 950 µs for 8.7 GB;
  // MHA 64 × 32k 4069 µs for 35 GB.
  double l2_bytes_per_us = 9.4271e+06;
  double overlap_power = 1.97331;       // DRAM and L2 streams overlap: power mean exponent
  double decode_d64_factor = 1.32985;   // D 64: 1.3x the time per byte of D 128
  double decode_d256_factor = 2.60201;  // D 256: 2.6x (64 × 32k: 5334 µs vs 2x 950 µs)
  // n = 2, 32k, suffixes 128-1024: 69.0 µs, 16-128: 51.2 µs (one prefix read ~0.5x more).
  double misaligned_reread = 0.52199;
  double misaligned_spread_tokens = 512;       // spread of member lengths that misaligns fully
  double misaligned_full_bytes = 1.17995e+08;  // prefix bytes at which the miss is full
  // --- the cascade ---
  // Two levels, small prefix: n = 2, 1k: 26.1 µs (plain 12.2); 16-128 suffixes: 22.3 µs.
  double cascade_fixed_us = 22.4274;
  double extra_level_us = 12.0;              // a third or fourth level's pass (not measured)
  double per_row_us = 0.000663336;           // per query row (gather, merge, q/o loads)
  double prefix_bytes_per_us = 3.54598e+06;  // prefix pass stream (n = 2: 3.3 TB/s from 8k to 32k)
  double prefix_flops_per_us_wgmma = 9.83076e+08;  // marginal FLOP rate, 128-row tile, wgmma
  double prefix_flops_per_us = 7.37638e+08;        // marginal FLOP rate, other tiles, mma.sync
  double prefix_chunk_us_wgmma = 1.57639;  // per KV chunk per tile (n = 32: 1k 70 µs, 4k 89 µs)
  double prefix_chunk_row_us = 0.015921;   // per KV chunk per tile per row (n = 16 64-row tile)
  double prefix_d64_factor = 0.762584;
  double prefix_d256_factor = 2.00935;
  double suffix_split_us = 6.93794;  // the suffix decode's split merge
  // The schedulers' grids (the sm_90 policy's knobs, tuning/sm90.cuh; bench/cascade_cost_fit.py
  // has them as numbers: 132, 264, 2).
  int num_sms = tuning::Policy::kH200Sms;  // H200
  // The decode kernel's grid (2 per SM); the mma.sync prefill kernel's CTAs per SM (wgmma: 1).
  int decode_ctas = int{tuning::Policy::kH200Sms} * tuning::Policy::kDecodeDefaultCtasPerSm;
  int prefix_ctas_per_sm = tuning::Policy::kPrefillCtasPerSm;
  int wgmma_tile_rows = 128;     // the tile the wgmma kernel runs ...
  int wgmma_max_head_dim = 128;  // ... at these head dims (D 256 measured as mma.sync)
  // A margin makes more wrong choices on the grid (fit: 0 % and 2-10 % compared).
  double min_relative_gain = 0.0;
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
  int64_t plain_kv_bytes = 0;      // Σ requests kv_len × kv_token_bytes
  int64_t plain_reread_bytes = 0;  // plain_kv_bytes − cascade_kv_bytes: shared pages re-read
  int64_t misaligned_bytes = 0;    // the part of them plain fetches from DRAM again (the miss)
  int64_t cascade_kv_bytes = 0;    // Σ groups (all levels) kv_len × kv_token_bytes
  int64_t bytes_saved = 0;         // plain_kv_bytes − cascade_kv_bytes
  int64_t state_bytes = 0;         // extra partial-state traffic of the cascade
  double plain_us = 0, cascade_us = 0;
  // The cascade's parts: shared levels (stream + math + chunk merges) and the suffix pass.
  double prefix_us = 0, suffix_us = 0;
  bool use_cascade = false;
};

// Estimates both paths for `layout` and decides. Throws flashkv::Error on a non-positive shape
// (or num_qo_heads not a multiple of num_kv_heads, group > 128) or model parameter.
CascadeEstimate estimate_cascade(const CascadeLayout& layout, const CascadeProblemShape& shape,
                                 const CascadeCostModel& model = {});

// Whether a choice between the two paths was right, given both measured times (`flashkv bench
// cascade` fails a configuration where it was not): ok iff the chosen path's time is at most
// (1 + tolerance) x the faster one's. slowdown = chosen / fastest - 1 (0 when the choice was the
// faster path). Throws flashkv::Error on a non-positive time or a negative tolerance.
struct CascadeChoiceCheck {
  double chosen_us = 0, best_us = 0, slowdown = 0;
  bool ok = true;
};
CascadeChoiceCheck check_cascade_choice(double plain_us, double cascade_us, bool chose_cascade,
                                        double tolerance = 0.03);

}  // namespace flashkv::scheduler
