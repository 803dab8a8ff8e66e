#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <exception>
#include <mutex>
#include <thread>

#include "flashkv/error.h"
#include "flashkv/jit.h"
#include "ops/jit/kernel_specs.h"

namespace flashkv {

namespace {

// Every kernel `opts` names, in precompile()'s order.
std::vector<ops::KernelSpec> precompile_specs(const PrecompileOptions& opts) {
  const ops::VariantJit plain = ops::plain_variant_jit();
  // The kernel side of opts.variants as the ops' plan() derives it.
  std::vector<ops::VariantJit> decode_variants, prefill_variants;
  for (const Variant& v : opts.variants) {
    prefill_variants.push_back(ops::variant_jit(v));
    decode_variants.push_back(ops::variant_jit(ops::decode_kernel_variant(v)));
  }
  std::vector<ops::KernelSpec> specs;
  std::vector<ops::KernelSpec> variant_specs;  // compiled first: a user's compile error shows soon
  // The cache dtypes under q dtype t (PrecompileOptions::kv_dtypes).
  const auto kv_types = [&](DType t) {
    std::vector<DType> kvs;
    for (DType kv : opts.kv_dtypes)
      if (is_fp8_dtype(kv) || kv == t) kvs.push_back(kv);
    if (opts.kv_dtypes.empty()) kvs.push_back(t);
    return kvs;
  };
  for (const std::string& op : opts.ops) {
    if (op == "merge") {
      for (DType t : opts.dtypes) specs.push_back(ops::merge_kernel_spec(t));
    } else if (op == "decode") {
      for (DType t : opts.dtypes)
        for (DType kv : kv_types(t))
          for (int d : opts.head_dims)
            for (int g : opts.group_sizes)
              for (int p : opts.page_sizes) {
                DecodeKernelKey key;
                key.q = t;
                key.kv = kv;
                key.head_dim = d;
                key.group = g;
                key.page_size = p;
                const bool tc_ok = decode_tc_supported(d, g);
                for (const bool tc : {false, true}) {
                  if (tc && !tc_ok) continue;
                  key.tensor_cores = tc;
                  key.tuning = {};
                  key.variant = plain.kernel();
                  specs.push_back(ops::kernel_spec(key));
                  // The other shapes BatchDecode's auto mode picks.
                  if (tc && d <= 128)
                    for (const auto& shape : {ops::kDecodeTCSmallCtas, ops::kDecodeTCOneCta}) {
                      key.tuning = shape;
                      specs.push_back(ops::kernel_spec(key));
                    }
                  key.tuning = {};
                  for (const ops::VariantJit& vj : decode_variants) {
                    key.variant = vj.kernel();
                    key.widen_kv = ops::fp8_kv_widened(kv, vj);
                    variant_specs.push_back(ops::kernel_spec(key));
                  }
                  key.widen_kv = false;
                }
              }
    } else if (op == "prefill") {
      // The Hopper kernel too, where the target has it (no GPU here: its shared-memory limit is
      // checked at plan()).
      const bool hopper =
          ops::prefill_wgmma_unsupported(opts.arch, 128, false, 128, INT_MAX).empty();
      for (DType t : opts.dtypes)
        for (DType kvt : kv_types(t))
          for (int d : opts.head_dims)
            for (const PrefillKV kv :
                 {PrefillKV::kRagged, PrefillKV::kPagedPow2, PrefillKV::kPaged}) {
              PrefillKernelKey key;
              key.dtype = t;
              key.fp8_kv = is_fp8_dtype(kvt) ? kvt : DType::f32;
              key.head_dim = d;
              key.kv = kv;
              for (int rows : {16, 32, 64, 128}) {
                key.rows = rows;
                specs.push_back(ops::kernel_spec(key));
                for (const ops::VariantJit& vj : prefill_variants) {
                  PrefillKernelKey vkey = key;
                  vkey.variant = vj.kernel();
                  vkey.widen_kv = ops::fp8_kv_widened(kvt, vj);
                  variant_specs.push_back(ops::kernel_spec(vkey));
                }
              }
              if (hopper) {
                key.rows = 128;
                key.wgmma = true;
                specs.push_back(ops::kernel_spec(key));
                for (const ops::VariantJit& vj : prefill_variants) {
                  if (vj.transforms_kv || !vj.use_softmax) continue;  // the mma.sync kernel's
                  PrefillKernelKey vkey = key;
                  vkey.variant = vj.kernel();
                  variant_specs.push_back(ops::kernel_spec(vkey));
                }
              }
            }
    } else if (op == "cascade") {  // the gather / merge kernels around the levels' passes
      for (DType t : opts.dtypes) specs.push_back(ops::cascade_kernel_spec(t));
    } else if (op == "kv") {  // RoPE, KV append, get_batch_indices_positions
      for (DType t : opts.dtypes) {
        specs.push_back(ops::rope_kernel_spec(t));
        for (DType kv : kv_types(t)) specs.push_back(ops::kv_append_kernel_spec(kv, t));
      }
      specs.push_back(ops::batch_indices_positions_kernel_spec());
    } else {
      fail("precompile: unknown op '", op, "' (expected merge, decode, prefill, kv or cascade)");
    }
  }
  specs.insert(specs.begin(), variant_specs.begin(), variant_specs.end());
  return specs;
}

}  // namespace

std::vector<std::string> precompile_kernel_ids(const PrecompileOptions& opts) {
  std::vector<std::string> ids;
  for (const ops::KernelSpec& spec : precompile_specs(opts)) ids.push_back(spec.id);
  return ids;
}

std::vector<PrecompiledKernel> precompile(const PrecompileOptions& opts,
                                          const PrecompileProgress& progress) {
  check(opts.jobs >= 0, "PrecompileOptions.jobs: expected >= 0 (0: one per hardware thread), got ",
        opts.jobs);
  const std::vector<ops::KernelSpec> specs = precompile_specs(opts);
  // Workers take the next spec in order; the kernel cache compiles distinct ids concurrently
  // (runtime/kernel_cache.h) and each NVRTC program lives in one thread.
  std::vector<PrecompiledKernel> out(specs.size());
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t jobs = std::min(opts.jobs > 0 ? static_cast<size_t>(opts.jobs) : hw,
                               std::max<size_t>(specs.size(), 1));
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;  // guards done, first_error and the progress calls
  size_t done = 0;
  std::exception_ptr first_error;
  auto work = [&] {
    while (!stop) {
      const size_t i = next.fetch_add(1);
      if (i >= specs.size()) break;
      const ops::KernelSpec& spec = specs[i];
      try {
        const auto t0 = std::chrono::steady_clock::now();
        const bool cold =
            runtime::KernelCache::instance().precompile(spec.id, opts.arch, spec.make);
        out[i] = {spec.id, cold,
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                      .count()};
        std::lock_guard<std::mutex> lock(mu);
        ++done;
        if (progress) progress(out[i], done, specs.size());
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error) first_error = std::current_exception();
        stop = true;
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < jobs; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
  return out;
}

}  // namespace flashkv
