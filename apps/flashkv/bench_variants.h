// flashkv bench variants: the built-in attention variants (variants.h) on the decode workloads
// D1-D6 and on a prefill workload (PV), each timed next to plain attention of the same run and
// checked against the CPU reference; fused RoPE against apply-RoPE-then-decode; and what a
// variant costs the JIT (cold NVRTC compile, warm cache lookup).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "flashkv/dtype.h"
#include "flashkv/host_tensor.h"
#include "flashkv/runtime.h"
#include "flashkv/variants.h"

namespace flashkv::cli {

struct VariantsBenchOptions {
  std::vector<std::string> workloads;              // decode workload ids; empty: all of them
  std::vector<std::string> shapes = {"gqa-32-8"};  // head shapes (workloads.h)
  std::vector<DType> dtypes = {DType::f16};
  int head_dim = 128;
  int page_size = 16;
  int reps = 30;
  int ctas_per_sm = 0;  // 0: the libraries' defaults
  std::string workloads_file;
};

// Prints one line per (workload, shape, dtype, variant) and one per JIT measurement; returns the
// rows (docs/benchmarks.md's schema plus "variant", "ratio_to_plain", "check"; JIT rows carry
// "jit_cold_ms" and "jit_warm_us"). A configuration that failed its reference check, or that the
// library refused, is a row with "check": "FAILED" (and "ERROR" on its printed line).
nlohmann::json bench_variants(const VariantsBenchOptions& opts, const Ceilings& ceil, Stream s);

// The JIT rows (bench_variants_jit.cpp): {"variant", "jit_cold_ms", "jit_warm_us", ...} for
// soft-cap, window+soft-cap+sinks and a user variant, decode kernel of GQA 32/8.
nlohmann::json bench_variants_jit(const VariantsBenchOptions& opts);

// The prefill rows (bench_variants_prefill.cpp), "kind": "prefill": workload PV (4 requests,
// qo_len = kv_len = 2048, ragged KV through BatchPrefillRagged), causal, per shape and dtype:
// plain, soft-cap, window, sinks, alibi, window+soft-cap+sinks, rope-fused, then plain-noncausal
// and custom-mask (a random mask with causal off, compared with plain-noncausal); workload PW (one
// 32k prompt): plain and a 4096-key window. Each row has "tflops" (of the pairs it keeps),
// "pct_gemm_f16", "ratio_to_plain", "kernel" and "check" (reference on the last 16 rows of two
// requests); failures are "check": "FAILED" rows as in bench_variants. bench_variants calls it;
// --workloads without PV / PW skips them.
nlohmann::json bench_variants_prefill(const VariantsBenchOptions& opts, const Ceilings& ceil,
                                      Stream s);

// The variant inputs both benchmarks use, on the host (the reference) and on the device (the
// kernels): random sinks in [-2, 2], the ALiBi paper's slopes, and a packed custom mask.
struct BenchVariantInputs {
  int Hq = 0, B = 0;
  HostTensor sinks, alibi;
  std::vector<uint8_t> mask;
  std::vector<int32_t> mask_indptr;
  DeviceBuffer d_sinks, d_alibi, d_mask, d_mask_indptr;

  // `bits`: each request's [qo_len, kv_len] mask, row-major, requests back to back.
  void build(int num_qo_heads, const std::vector<bool>& bits, const std::vector<int64_t>& qo_lens,
             const std::vector<int64_t>& kv_lens, std::mt19937& rng);
  // The built-in configuration `name` ("soft-cap", "window", "sinks", "alibi", "custom-mask",
  // "window+soft-cap+sinks", "rope-fused"; anything else: plain) with its tensors on the device
  // (dev) or the host.
  AttentionVariant describe(const std::string& name, int window_left, bool dev) const;
};

// Rows of bench_variants with "check": "FAILED".
int count_variant_failures(const nlohmann::json& rows);

}  // namespace flashkv::cli
