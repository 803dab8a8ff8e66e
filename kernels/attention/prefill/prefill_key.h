// The host's name for one batch prefill kernel (prefill.cuh: PrefillConfig, mma.sync;
// prefill_hopper_ws.cuh: PrefillHopperConfig, the warp-specialized wgmma kernel), next to the
// Configs it names. Host code only (common/kernel_key.h says why it lives here). To add an
// instantiation parameter: add it to the Config's template, then here (a field, its place in
// config_type(), its mark in cache_id()).
//
// Page size: a prefill key carries only the page-size class (ragged, a power of two, any: the
// Configs' KV_SOURCE); the page size itself is a run-time parameter (PrefillParams::page_size and
// page_shift). Prefill is bound by the tensor cores, not by address arithmetic, so the exact size
// buys nothing there, and a key per size would multiply the instantiations (dtype x head_dim x
// tile rows x variant) by every page size in use. Decode keys carry the exact size (decode_key.h).
#pragma once

#include <string>
#include <vector>

#include "attention/prefill/prefill_shape.cuh"
#include "common/kernel_key.h"

namespace flashkv {

// Where a prefill kernel's KV comes from (PrefillKVSource in prefill_params.cuh).
enum class PrefillKV : int { kRagged = 0, kPagedPow2 = 1, kPaged = 2 };
inline PrefillKV prefill_kv_source(bool paged, int page_size) {
  if (!paged) return PrefillKV::kRagged;
  return (page_size & (page_size - 1)) == 0 ? PrefillKV::kPagedPow2 : PrefillKV::kPaged;
}

struct PrefillKernelKey {
  DType dtype = DType::f16;  // q, kv and out
  int head_dim = 128;
  int rows = 128;  // query-tile rows (the wgmma kernel: always 128)
  PrefillKV kv = PrefillKV::kPagedPow2;
  bool wgmma = false;     // the Hopper kernel (variants but key / value rewrites)
  KernelVariant variant;  // the kernel's attention variant
  // e4m3 / e5m2: an fp8 cache, widened to `dtype` in the kernel (the mma.sync kernel); any other
  // value: KV in `dtype`.
  DType fp8_kv = DType::f32;
  // The mma.sync kernel with fp8 KV: stage the tiles widened to `dtype` (a variant rewrites the
  // staged keys or values: kv/kv_chunk_copy.cuh).
  bool widen_kv = false;
  bool has_fp8_kv() const { return is_fp8_dtype(fp8_kv); }
  bool widened_kv() const { return has_fp8_kv() && widen_kv && !wgmma; }
  bool operator==(const PrefillKernelKey&) const = default;

  // PrefillConfig<T, HEAD_DIM, ROWS, KV_SOURCE[, KVT[, WIDEN_KV]]> or
  // PrefillHopperConfig<T, HEAD_DIM, KV_SOURCE[, KVT]>.
  std::string config_type() const {
    const std::string t = device_type_name(dtype, "q");
    const std::string hd = std::to_string(head_dim), src = std::to_string(static_cast<int>(kv));
    const std::string kvt =
        (has_fp8_kv() ? ", " + std::string(device_type_name(fp8_kv, "kv")) : "") +
        (widened_kv() ? ", true" : "");
    return wgmma ? "flashkv::PrefillHopperConfig<" + t + ", " + hd + ", " + src + kvt + ">"
                 : "flashkv::PrefillConfig<" + t + ", " + hd + ", " + std::to_string(rows) + ", " +
                       src + kvt + ">";
  }

  // The mma.sync kernel: batch_prefill_kernel<config, variant>. The Hopper kernel has two
  // instantiations, KV by TMA boxes and by the producer warpgroup's cp.async gather:
  // batch_prefill_hopper_ws_kernel<config, variant, KV_TMA>; run() launches the one its
  // tensors allow.
  std::string kernel_name(bool kv_tma = true) const {
    if (!wgmma) return "flashkv::batch_prefill_kernel<" + config_type() + ", " + variant.type + ">";
    return "flashkv::batch_prefill_hopper_ws_kernel<" + config_type() + ", " + variant.type + ", " +
           (kv_tma ? "true" : "false") + ">";
  }
  // (fp8 KV is always gathered: the Hopper kernel then has the one instantiation, and run()
  // launches the last one.)
  std::vector<std::string> name_expressions() const {
    if (!wgmma) return {kernel_name()};
    if (has_fp8_kv()) return {kernel_name(false)};
    return {kernel_name(true), kernel_name(false)};
  }

  // The kernel cache's id, e.g. "prefill<f16,d128,r64,paged>" or "prefill_wgmma<bf16,d128,ragged>".
  std::string cache_id() const {
    static const char* kNames[] = {"ragged", "paged", "paged_any"};
    const std::string head = std::string(dtype_name(dtype)) +
                             (has_fp8_kv() ? std::string(",kv_") + dtype_name(fp8_kv) : "") +
                             (widened_kv() ? ",widened" : "") + ",d" + std::to_string(head_dim);
    const char* src = kNames[static_cast<int>(kv)];
    if (wgmma)
      return "prefill_wgmma<" + head + "," + src + (variant.id.empty() ? "" : "," + variant.id) +
             ">";
    return "prefill<" + head + ",r" + std::to_string(rows) + "," + src +
           (variant.id.empty() ? "" : "," + variant.id) + ">";
  }

  const char* header() const {
    return wgmma ? "attention/prefill/prefill_hopper_ws.cuh" : "attention/prefill/prefill.cuh";
  }
  std::string preamble() const { return ""; }

  // The launch geometry, from the constexpr shape function the Config reads; the Hopper kernel
  // adds its producer warpgroup to the shape's two consumer warpgroups.
  LaunchGeometry geometry() const {
    const int kv_bytes = has_fp8_kv() && !widened_kv() ? 1 : 2;
    const PrefillShape s =
        wgmma ? prefill_hopper_shape(head_dim, kv_bytes) : prefill_shape(head_dim, rows, kv_bytes);
    return {static_cast<unsigned>(s.threads + (wgmma ? 128 : 0)),
            static_cast<unsigned>(s.smem_bytes)};
  }
};

}  // namespace flashkv
