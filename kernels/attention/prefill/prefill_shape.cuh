// The prefill kernels' geometry as a function of (head_dim, query-tile rows): warps, KV tile,
// pipeline depth, shared memory. One constexpr function per kernel (mma.sync: prefill.cuh; Hopper
// wgmma: prefill_hopper.cuh), read by both the kernel config and the host launch (src/ops), so
// the two can never disagree. Their tuning knobs (row tiles per warp, warps of small tiles, KV
// tiles, pipeline depth, query buffers) come from the sm_90 policy, tuning/sm90.cuh, which says
// what each was measured to do; this file includes nothing else.
#pragma once

#include "tuning/policy.cuh"

namespace flashkv {

struct PrefillShape {
  int row_tiles;  // 16-row MMA tiles per warp
  int warp_rows;  // 16 * row_tiles
  int warps_q;    // warps along the query rows
  int warps_kv;   // warps sharing a row block, splitting each KV tile between them
  int warps;
  int threads;
  int tile;  // KV tokens per pipeline stage
  int stages;
  int q_bytes;        // shared memory: the query tile,
  int stage_bytes;    // K (or V) of one stage,
  int smem_bytes;     // and in all (the warps' merge scratch reuses the KV stages)
  int q_buffers;      // query tiles in shared memory: 2 lets the next work item's load start early
  int staging_slots;  // the Hopper kernel with fp8 KV: fp8 K + V tiles before widening
  int staging_bytes;
};

// kv_elem_bytes: the KV element size (1: fp8, whose stages are half the bytes, so more fit).
constexpr PrefillShape prefill_shape(int head_dim, int rows, int kv_elem_bytes = 2) {
  PrefillShape s{};
  // Two 16-row MMA tiles per warp in the 128-row tile: each K/V fragment read from shared memory
  // then feeds two MMAs (shared-memory bandwidth, not the tensor cores, bounds one row tile per
  // warp). head_dim 256 keeps one: 128 output accumulators per row tile already.
  s.row_tiles = tuning::Policy::prefill_row_tiles_per_warp(head_dim, rows);
  s.warp_rows = 16 * s.row_tiles;
  s.warps_q = rows / s.warp_rows;
  // Small tiles (16, 32 rows: short queries) would leave most of a CTA idle: 4 warps there, the
  // warps of a row block splitting each KV tile.
  s.warps_kv = tuning::Policy::prefill_warps_kv(rows, s.warps_q);
  s.warps = s.warps_q * s.warps_kv;
  s.threads = 32 * s.warps;
  // 64 KV tokens per stage, or 32 at head_dim 256 where a warp has a whole tile (its S fragment
  // next to 128 output accumulators).
  s.tile = tuning::Policy::prefill_kv_tile(head_dim, s.warps_kv);
  s.q_bytes = rows * head_dim * 2;
  s.stage_bytes = s.tile * head_dim * kv_elem_bytes;
  // Pipeline depth: as many KV tiles in flight as fit two CTAs per SM (<= 112 KB each); a CTA of
  // 8 warps runs alone on its SM (registers) and takes 4.
  s.stages = tuning::Policy::prefill_stages(s.q_bytes, s.stage_bytes, s.threads);
  const int kv_bytes = 2 * s.stages * s.stage_bytes;
  const int merge_bytes = s.warps_kv > 1 ? s.warps * 16 * (head_dim + 2) * 4 : 0;
  s.smem_bytes = s.q_bytes + (kv_bytes > merge_bytes ? kv_bytes : merge_bytes);
  s.q_buffers = 1;
  return s;
}

// The Hopper kernel (prefill_hopper.cuh): a 128-row query tile, two warpgroups of 64 rows, one
// CTA per SM (its accumulators take most of the register file). A tile's V stays in use until
// the next tile's step (its P·V overlaps that tile's softmax), its K not: `stages` V stages and
// one K stage fewer, the loads running stages - 1 tiles ahead. KV tiles as long as shared memory
// allows, since every tile costs the same row statistics, barriers and O rescale whatever its
// length (on the H200 64-token tiles at head_dim 128 lost ~2 points of P4 to 128): 128 tokens at
// head_dim 64 and 128, 64 at 256 (S of a tile and its P next to 128 O accumulators per thread). Two
// query-tile buffers where they fit (not at 256), so the next work item's loads start while this
// one computes: with one CTA per SM nothing else hides them. Tiles start 1024-byte aligned (the
// 128-byte swizzle atom): the dynamic shared memory gets 1 KB of slack to align its base.
// kv_elem_bytes 1 (fp8 KV): the stages stay 16-bit (the producer widens each fp8 tile into
// them), behind two staging slots of fp8 K and V (tuning/sm90.cuh: prefill_hopper_fp8_kv_tile).
constexpr PrefillShape prefill_hopper_shape(int head_dim, int kv_elem_bytes = 2) {
  PrefillShape s{};
  s.row_tiles = 1;
  s.warp_rows = 16;
  s.warps_q = 8;
  s.warps_kv = 1;
  s.warps = 8;
  s.threads = 256;
  s.tile = kv_elem_bytes == 1 ? tuning::Policy::prefill_hopper_fp8_kv_tile(head_dim)
                              : tuning::Policy::prefill_hopper_kv_tile(head_dim);
  s.q_bytes = 128 * head_dim * 2;
  s.stage_bytes = s.tile * head_dim * 2;
  s.stages = kv_elem_bytes == 1 ? tuning::Policy::prefill_hopper_fp8_stages(head_dim)
                                : tuning::Policy::prefill_hopper_stages(head_dim);
  s.q_buffers =
      tuning::Policy::prefill_hopper_q_buffers(head_dim);  // d128: 2 x 32 + (2 + 3) x 32 KB
  s.staging_slots =
      kv_elem_bytes == 1 ? tuning::Policy::prefill_hopper_fp8_staging_slots(head_dim) : 0;
  s.staging_bytes = s.staging_slots * 2 * s.tile * head_dim;
  s.smem_bytes =
      1024 + s.q_buffers * s.q_bytes + (2 * s.stages - 1) * s.stage_bytes + s.staging_bytes;
  return s;
}

}  // namespace flashkv
