// flashkv bench variants, the JIT half: what a variant costs the decode kernel's JIT, cold (NVRTC)
// and warm (the kernel-cache lookup every plan() makes), for two built-ins and a user variant.
#include <chrono>
#include <cstdio>
#include <utility>

#include "bench_variants.h"
#include "flashkv/variant_spec.h"
#include "ops/jit/kernel_specs.h"
#include "ops/jit/variant_jit.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc_compiler.h"

namespace flashkv::cli {
namespace {

// A variant the library does not ship, as a user writes it: one scalar added to every logit.
VariantSpec scalar_bias_spec() {
  VariantSpec s;
  s.name = "ScalarBias";
  s.params = {{"bias", VariantParam::Kind::kF32}};
  s.source = R"(
struct ScalarBias {
  using Args = Params;
  __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition&,
                                           float s) { return s + a.bias; }
};
)";
  return s;
}

}  // namespace

// Cold: NVRTC on the decode kernel's request, straight (no memory or disk cache, whatever
// FLASHKV_CACHE_DIR holds). Warm: the cache lookup plan() does once the module is loaded.
nlohmann::json bench_variants_jit(const VariantsBenchOptions& o) {
  nlohmann::json rows = nlohmann::json::array();
  const DType dt = o.dtypes.empty() ? DType::f16 : o.dtypes.front();
  static float host_sinks[32];  // variant_jit reads which built-ins are on, not the values
  AttentionVariant cap, combo;
  cap.logits_soft_cap = 30.f;
  combo.window_left = 1024;
  combo.logits_soft_cap = 30.f;
  combo.sinks = TensorView(host_sinks, DType::f32, {32});
  const std::pair<std::string, Variant> vs[] = {
      {"soft-cap", Variant::builtin(cap)},
      {"window+soft-cap+sinks", Variant::builtin(combo)},
      {"user:ScalarBias", Variant::user(scalar_bias_spec(), VariantArgs().set("bias", 0.5f))}};
  const int group = 4;  // GQA 32/8
  const bool tc = decode_tc_supported(o.head_dim, group);
  for (const auto& [name, v] : vs) {
    try {
      const ops::KernelSpec spec =
          ops::kernel_spec(DecodeKernelKey{.q = dt,
                                           .kv = dt,
                                           .head_dim = o.head_dim,
                                           .group = group,
                                           .page_size = o.page_size,
                                           .tensor_cores = tc,
                                           .variant = ops::variant_jit(v).kernel()});
      runtime::CompileRequest req = spec.make();
      req.arch = runtime::device_arch(0);
      auto t0 = std::chrono::steady_clock::now();
      runtime::nvrtc_compile(req);
      const double cold_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      auto& cache = runtime::KernelCache::instance();
      cache.module(spec.id, 0, spec.make);  // loaded once; every later call is a memory hit
      constexpr int kReps = 2000;
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kReps; ++i) cache.module(spec.id, 0, spec.make);
      const double warm_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          kReps;
      std::printf("JIT %-22s cold %.0f ms / warm %.2f us  (%s)\n", name.c_str(), cold_ms, warm_us,
                  spec.id.c_str());
      rows.push_back({{"variant", name},
                      {"dtype", dtype_name(dt)},
                      {"kernel_id", spec.id},
                      {"jit_cold_ms", cold_ms},
                      {"jit_warm_us", warm_us}});
    } catch (const std::exception& e) {
      std::printf("JIT %-22s ERROR: %s\n", name.c_str(), e.what());
      rows.push_back({{"variant", name}, {"check", "FAILED"}, {"error", e.what()}});
    }
  }
  return rows;
}

}  // namespace flashkv::cli
