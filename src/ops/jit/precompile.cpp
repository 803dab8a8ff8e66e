#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "flashkv/error.h"
#include "flashkv/jit.h"
#include "ops/jit/precompile_family.h"

namespace flashkv {

namespace {

// The family of op name `op` (PrecompileOptions::ops).
const ops::PrecompileFamily& precompile_family(const std::string& op) {
  for (const ops::PrecompileFamily& f : ops::precompile_families())
    if (f.op == op) return f;
  std::string known;
  for (const ops::PrecompileFamily& f : ops::precompile_families())
    known += (known.empty() ? "" : ", ") + std::string(f.op);
  fail("precompile: unknown op '", op, "' (expected one of ", known, ")");
}

// Every kernel `opts` names, in precompile()'s order: the variants' kernels of every op first,
// then plain attention's, each in the order of opts.ops.
std::vector<ops::KernelSpec> precompile_specs(const PrecompileOptions& opts) {
  const ops::PrecompileScope scope(opts);
  ops::PrecompileList list;
  for (const std::string& op : opts.ops) precompile_family(op).enumerate(scope, list);
  std::vector<ops::KernelSpec> specs = std::move(list.variant_kernels);
  specs.insert(specs.end(), list.kernels.begin(), list.kernels.end());
  return specs;
}

}  // namespace

std::vector<std::string> precompile_ops() {
  std::vector<std::string> ops;
  for (const ops::PrecompileFamily& f : ops::precompile_families()) ops.emplace_back(f.op);
  return ops;
}

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
