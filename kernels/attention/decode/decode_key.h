// The host's name for one batch decode kernel (decode.cuh: DecodeConfig on CUDA cores;
// decode_tc.cuh: DecodeTCConfig on tensor cores), next to the Configs it names. Host code only
// (common/kernel_key.h says why it lives here). To add an instantiation parameter: add it to the
// Config's template, then here (a field, its place in config_type(), its mark in cache_id()).
//
// Page size: a decode key carries the exact page size (PAGE_SIZE in both Configs). Decode's inner
// loop is address arithmetic over pages (a tile's rows step through page ids), and with the page
// size a compile-time constant the page split is a shift and the in-page offsets immediates: the
// address arithmetic was most of what a decode CTA issued (H200 profile of GQA D4, NOTES "Decode
// kernels"). Prefill keys carry only the page-size class instead (prefill_key.h).
#pragma once

#include <string>
#include <vector>

#include "attention/decode/decode_shape.cuh"
#include "common/kernel_key.h"

namespace flashkv {

// The tensor-core decode kernel's pipeline stages, warps and the CTAs per SM its grid is sized
// for (0: the defaults of decode_shape.cuh); the CUDA-core kernel has none.
struct DecodeTCTuning {
  int stages = 0;
  int warps = 0;
  int ctas = 0;
  bool operator==(const DecodeTCTuning&) const = default;
};

struct DecodeKernelKey {
  DType q = DType::f16, kv = DType::f16;  // the output is in q's dtype
  int head_dim = 128, group = 1, page_size = 16;
  bool tensor_cores = false;
  DecodeTCTuning tuning;     // tensor-core kernel only (ignored by the CUDA-core kernel)
  bool check_pages = false;  // also report page ids outside the cache (decode_common.cuh)
  KernelVariant variant;
  // With an fp8 cache: stage the tiles widened to q's dtype (a variant rewrites the staged keys
  // or values: kv/kv_chunk_copy.cuh).
  bool widen_kv = false;
  bool operator==(const DecodeKernelKey&) const = default;

  DecodeTCTuning tc_tuning() const { return tensor_cores ? tuning : DecodeTCTuning{}; }
  bool widened_kv() const { return is_fp8_dtype(kv) && widen_kv; }
  // The element size of the staged K / V tiles (the shape functions' kv_bytes).
  int stage_kv_bytes() const { return widened_kv() ? 2 : static_cast<int>(dtype_size(kv)); }

  // DecodeTCConfig<QT, KVT, HEAD_DIM, GROUP, PAGE_SIZE[, STAGES, WARPS, CTAS[, WIDEN_KV]]> or
  // DecodeConfig<QT, KVT, OT, HEAD_DIM, GROUP, PAGE_SIZE[, WIDEN_KV]>.
  std::string config_type() const {
    const std::string qt = device_type_name(q, "q");
    const std::string kvt = device_type_name(kv, "kv");
    const std::string dims =
        std::to_string(head_dim) + ", " + std::to_string(group) + ", " + std::to_string(page_size);
    const std::string widen = widened_kv() ? ", true" : "";
    if (!tensor_cores)
      return "flashkv::DecodeConfig<" + qt + ", " + kvt + ", " + qt + ", " + dims + widen + ">";
    const DecodeTCTuning t = tc_tuning();
    const std::string shape = t == DecodeTCTuning{} && !widened_kv()
                                  ? ""
                                  : ", " + std::to_string(t.stages) + ", " +
                                        std::to_string(t.warps) + ", " + std::to_string(t.ctas);
    return "flashkv::DecodeTCConfig<" + qt + ", " + kvt + ", " + dims + shape + widen + ">";
  }

  // The kernel's name expression: batch_decode[_tc]_kernel<config, variant>.
  std::string kernel_name() const {
    return (tensor_cores ? "flashkv::batch_decode_tc_kernel<" : "flashkv::batch_decode_kernel<") +
           config_type() + ", " + variant.type + ">";
  }
  std::vector<std::string> name_expressions() const { return {kernel_name()}; }

  // The kernel cache's id, e.g. "decode_tc<f16,f16,d128,g4,p16>" or
  // "decode<bf16,bf16,d64,g1,p1,b3,checked>".
  std::string cache_id() const {
    const DecodeTCTuning t = tc_tuning();
    const std::string tuned = t == DecodeTCTuning{}
                                  ? ""
                                  : ",s" + std::to_string(t.stages) + ",w" +
                                        std::to_string(t.warps) + ",c" + std::to_string(t.ctas);
    return std::string(tensor_cores ? "decode_tc<" : "decode<") + dtype_name(q) + "," +
           dtype_name(kv) + ",d" + std::to_string(head_dim) + ",g" + std::to_string(group) + ",p" +
           std::to_string(page_size) + tuned + (widened_kv() ? ",widened" : "") +
           (variant.id.empty() ? "" : "," + variant.id) + (check_pages ? ",checked" : "") + ">";
  }

  const char* header() const {
    return tensor_cores ? "attention/decode/decode_tc.cuh" : "attention/decode/decode.cuh";
  }
  // Compiled before the header: the one switch the decode headers read first (decode_common.cuh).
  std::string preamble() const {
    return check_pages ? "#define FLASHKV_DECODE_CHECK_PAGES 1\n" : "";
  }

  // The launch geometry, from the constexpr shape function the Config reads.
  LaunchGeometry geometry() const {
    if (tensor_cores) {
      const DecodeTCTuning t = tc_tuning();
      const DecodeTCShape s =
          decode_tc_shape(head_dim, group, t.stages, t.warps, t.ctas, stage_kv_bytes());
      return {static_cast<unsigned>(s.threads), static_cast<unsigned>(s.smem_bytes)};
    }
    const DecodeCudaCoreShape s = decode_cuda_core_shape(head_dim, stage_kv_bytes());
    return {static_cast<unsigned>(s.threads), static_cast<unsigned>(s.smem_bytes)};
  }
};

}  // namespace flashkv
