// The prefill kernel specializations: their JIT spec and launch geometry.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "attention/prefill_shape.cuh"
#include "flashkv/dtype.h"
#include "ops/kernel_specs.h"

namespace flashkv::ops {

struct PrefillGeometry {
  unsigned threads = 0, smem = 0;
};

// The launch geometry, from the same constexpr function the kernel's config reads.
inline PrefillGeometry prefill_geometry(int head_dim, int rows, bool wgmma = false) {
  const PrefillShape s = wgmma ? prefill_hopper_shape(head_dim) : prefill_shape(head_dim, rows);
  // The Hopper kernel: the shape's two consumer warpgroups and a producer warpgroup.
  return {static_cast<unsigned>(s.threads + (wgmma ? 128 : 0)), static_cast<unsigned>(s.smem_bytes)};
}

// The query tile plan() uses when PrefillPlanOptions.tile_rows is 0: the paper's heuristic
// (scheduler::choose_query_tile_rows). Kept as the op's own entry point so a measured
// per-GPU adjustment has one place to live (a 64-row cap was tried and measured slower once the
// 128-row tile gave each warp two row tiles: P4 237 vs 263 TFLOP/s).
int default_prefill_tile_rows(std::span<const int64_t> qo_lens, int group);

// KV source of a specialization (PrefillKVSource in kernels/attention/prefill_params.cuh).
enum class PrefillKV : int { kRagged = 0, kPagedPow2 = 1, kPaged = 2 };
inline PrefillKV prefill_kv_source(bool paged, int page_size) {
  if (!paged) return PrefillKV::kRagged;
  return (page_size & (page_size - 1)) == 0 ? PrefillKV::kPagedPow2 : PrefillKV::kPaged;
}

// "flashkv::PrefillConfig<flashkv::half_t, 128, 64, 1>"
std::string prefill_config_type(DType dtype, int head_dim, int rows, PrefillKV kv);
// The kernel's name expression: flashkv::batch_prefill_kernel<config, variant type>.
std::string prefill_kernel_name(DType dtype, int head_dim, int rows, PrefillKV kv,
                                const VariantJit& variant = plain_variant_jit());
// The Hopper kernel's: flashkv::batch_prefill_hopper_ws_kernel<PrefillHopperConfig<...>, variant,
// kv_tma> (KV by TMA boxes, or by the producer warpgroup's cp.async gather).
std::string prefill_hopper_kernel_name(DType dtype, int head_dim, PrefillKV kv, bool kv_tma);

}  // namespace flashkv::ops
