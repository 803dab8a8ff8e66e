// The JIT runtime without a GPU: NVRTC compiles every kernel family for sm_90a, the disk cache
// is hit on the second request, and a corrupt entry is detected and recompiled.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/jit.h"
#include "ops/jit/kernel_specs.h"
#include "ops/jit/variant_jit.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc_compiler.h"

namespace flashkv {
namespace {

TEST(Jit, MergeAndDecodeCompileForHopperWithoutAGpu) {
  PrecompileOptions o;
  o.arch = "sm_90a";
  o.ops = {"merge", "decode"};
  o.dtypes = {DType::f16, DType::bf16};
  o.head_dims = {128};
  o.group_sizes = {4};
  o.page_sizes = {16};
  const auto first = precompile(o);
  // merge x 2 dtypes, decode (CUDA cores, tensor cores in 3 shapes) x 2 dtypes.
  ASSERT_EQ(first.size(), 10u);
  // Second time: every entry is found (memory or disk), nothing recompiles.
  for (const auto& k : precompile(o)) EXPECT_FALSE(k.compiled) << k.id;
  // Warm lookup (memory hit) cost: the goal is <= 10 us (measured 0.06-0.1 us). The best of 5
  // batches, so a preempted batch on a loaded CI machine does not decide it.
  const ops::KernelSpec spec = ops::kernel_spec(
      DecodeKernelKey{.head_dim = 128, .group = 4, .page_size = 16, .tensor_cores = true});
  constexpr int kReps = 2000;
  double best_us = 1e30;
  for (int batch = 0; batch < 5; ++batch) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i)
      EXPECT_FALSE(runtime::KernelCache::instance().precompile(spec.id, "sm_90a", spec.make));
    best_us = std::min(
        best_us,
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
            kReps);
  }
  std::printf("JIT warm lookup (memory hit): %.2f us\n", best_us);
  EXPECT_LT(best_us, 10.0);
}

TEST(Jit, NvrtcOptionsFromTheEnvironmentJoinTheCacheKey) {
  const std::vector<std::string> plain = runtime::base_nvrtc_options("sm_90a");
  ASSERT_EQ(setenv("FLASHKV_NVRTC_OPTIONS", " -DFLASHKV_A=1  --ptxas-options=-v ", 1), 0);
  const std::vector<std::string> more = runtime::base_nvrtc_options("sm_90a");
  unsetenv("FLASHKV_NVRTC_OPTIONS");
  ASSERT_EQ(more.size(), plain.size() + 2);
  EXPECT_EQ(more[more.size() - 2], "-DFLASHKV_A=1");
  EXPECT_EQ(more.back(), "--ptxas-options=-v");
  EXPECT_EQ(runtime::base_nvrtc_options("sm_90a"), plain);
}

TEST(Jit, ParallelPrecompileKeepsTheOrderAndReportsEachKernel) {
  PrecompileOptions o;
  o.ops = {"merge", "kv"};
  o.dtypes = {DType::f16};
  std::vector<std::string> serial;
  for (const auto& k : precompile(o)) serial.push_back(k.id);
  ASSERT_EQ(serial.size(), 4u);                 // merge, RoPE, append, batch indices
  EXPECT_EQ(precompile_kernel_ids(o), serial);  // `flashkv precompile --list`: the same, in order
  o.jobs = 2;
  std::vector<size_t> done_counts;
  std::vector<std::string> reported;
  const auto parallel = precompile(o, [&](const PrecompiledKernel& k, size_t done, size_t total) {
    EXPECT_EQ(total, serial.size());
    done_counts.push_back(done);
    reported.push_back(k.id);
  });
  ASSERT_EQ(parallel.size(), serial.size());
  for (size_t i = 0; i < serial.size(); ++i) EXPECT_EQ(parallel[i].id, serial[i]) << i;
  EXPECT_EQ(done_counts, (std::vector<size_t>{1, 2, 3, 4}));
  std::sort(reported.begin(), reported.end());
  std::sort(serial.begin(), serial.end());
  EXPECT_EQ(reported, serial);
  o.jobs = -1;
  EXPECT_THROW(precompile(o), Error);
}

TEST(Jit, PrecompileDefaultsToEveryKernelFamily) {
  EXPECT_EQ(PrecompileOptions{}.ops, precompile_ops());
  PrecompileOptions o;
  o.ops = {"merge", "no_such_op"};
  EXPECT_THROW(precompile_kernel_ids(o), Error);
}

TEST(Jit, PrecompileTakesFp8CacheDtypes) {
  // kv_dtypes: fp8 caches under each q dtype; a 16-bit one only where it is the q dtype.
  PrecompileOptions o;
  o.ops = {"kv", "decode"};
  o.dtypes = {DType::f16};
  o.kv_dtypes = {DType::e4m3, DType::bf16};
  o.head_dims = {128};
  o.group_sizes = {4};
  o.page_sizes = {16};
  o.jobs = 2;
  std::vector<std::string> ids;
  for (const auto& k : precompile(o)) ids.push_back(k.id);
  EXPECT_NE(std::find(ids.begin(), ids.end(), "kv_append<e4m3,f16>"), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), "decode_tc<f16,e4m3,d128,g4,p16>"), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), "decode<f16,e4m3,d128,g4,p16>"), ids.end());
  for (const auto& id : ids) EXPECT_EQ(id.find("bf16"), std::string::npos) << id;
}

// A trivial kernel whose source no other test (or earlier run) has: always a cold compile.
runtime::CompileRequest unique_request(const std::string& tag, bool broken = false) {
  static const auto nonce = std::chrono::steady_clock::now().time_since_epoch().count();
  runtime::CompileRequest req;
  req.source = "#include \"primitives/types.cuh\"\n// " + tag + " " + std::to_string(nonce) +
               "\n__global__ void k() { " + (broken ? "not_declared();" : "") + " }\n";
  return req;
}

TEST(Jit, DistinctKernelsCompileConcurrently) {
  // Each factory waits (up to 20 s) until the other one has started: with NVRTC (and the factory)
  // run under the cache's lock, the second never starts while the first waits.
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  bool saw_other[2] = {false, false};
  auto factory = [&](int which) {
    return [&, which] {
      std::unique_lock<std::mutex> lock(mu);
      ++entered;
      cv.notify_all();
      saw_other[which] = cv.wait_for(lock, std::chrono::seconds(20), [&] { return entered == 2; });
      return unique_request("concurrent" + std::to_string(which));
    };
  };
  auto& cache = runtime::KernelCache::instance();
  std::thread t0([&] { cache.precompile("concurrent_a", "sm_90a", factory(0)); });
  std::thread t1([&] { cache.precompile("concurrent_b", "sm_90a", factory(1)); });
  t0.join();
  t1.join();
  EXPECT_TRUE(saw_other[0] && saw_other[1]) << "the two compiles ran one after the other";
}

TEST(Jit, OneIdRequestedFromManyThreadsCompilesOnce) {
  std::atomic<int> made{0}, cold{0};
  auto make = [&] {
    ++made;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the others arrive meanwhile
    return unique_request("once");
  };
  auto& cache = runtime::KernelCache::instance();
  const auto before = cache.stats();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] { cold += cache.precompile("compiled_once", "sm_90a", make); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(made.load(), 1);
  EXPECT_EQ(cold.load(), 1);
  EXPECT_EQ(cache.stats().compiles, before.compiles + 1);
}

TEST(Jit, ACompileErrorReachesEveryWaiterAndIsNotCached) {
  auto make = [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return unique_request("broken", true);
  };
  auto& cache = runtime::KernelCache::instance();
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&] {
      try {
        cache.precompile("broken_once", "sm_90a", make);
      } catch (const Error& e) {
        errors += std::string(e.what()).find("not_declared") != std::string::npos;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 3);
  // Not remembered as compiled: asking again compiles (and fails) again.
  const auto before = cache.stats();
  EXPECT_THROW(cache.precompile("broken_once", "sm_90a", make), Error);
  EXPECT_EQ(cache.stats().compiles, before.compiles);  // NVRTC failed: no compile counted
}

TEST(Jit, EveryDecodeShapeCompiles) {
  // The head dims x group sizes users have, including MQA (group 32) and odd groups and pages.
  for (int d : {64, 128, 256}) {
    for (int g : {1, 3, 16, 32}) {
      for (bool tc : {false, true}) {
        if (tc && !decode_tc_supported(d, g)) continue;
        const ops::KernelSpec spec = ops::kernel_spec(DecodeKernelKey{.q = DType::bf16,
                                                                      .kv = DType::bf16,
                                                                      .head_dim = d,
                                                                      .group = g,
                                                                      .page_size = g == 3 ? 5 : 1,
                                                                      .tensor_cores = tc});
        runtime::CompileRequest req = spec.make();
        req.arch = "sm_90a";
        EXPECT_NO_THROW(runtime::nvrtc_compile(req)) << spec.id;
      }
    }
  }
}

TEST(Jit, Fp8KvKernelsCompile) {
  // fp8 caches: both decode kernels, the mma.sync prefill kernel (small and large tiles, paged and
  // ragged) and the Hopper prefill kernel (its producer widens fp8 tiles), e4m3 under f16 and bf16
  // queries at each head_dim, e5m2 at head_dim 128 (the same code with the other cvt).
  std::vector<ops::KernelSpec> specs;
  const auto add = [&](DType q, DType kv, int d) {
    for (bool tc : {false, true}) {
      if (tc && !decode_tc_supported(d, 4)) continue;
      specs.push_back(ops::kernel_spec(DecodeKernelKey{
          .q = q, .kv = kv, .head_dim = d, .group = 4, .page_size = 16, .tensor_cores = tc}));
    }
    for (int rows : {16, 128}) {
      PrefillKernelKey key;
      key.dtype = q;
      key.fp8_kv = kv;
      key.head_dim = d;
      key.rows = rows;
      key.kv = rows == 16 ? PrefillKV::kRagged : PrefillKV::kPagedPow2;
      specs.push_back(ops::kernel_spec(key));
      if (rows == 128) {
        key.wgmma = true;
        specs.push_back(ops::kernel_spec(key));
      }
    }
  };
  for (int d : {64, 128, 256}) add(DType::f16, DType::e4m3, d);
  add(DType::bf16, DType::e4m3, 128);
  add(DType::f16, DType::e5m2, 128);
  // The fused-RoPE variant stages fp8 tiles widened (kv/kv_chunk_copy.cuh): both decode kernels
  // and the mma.sync prefill kernel.
  AttentionVariant rope;
  rope.rope.mode = RopeMode::llama;
  const ops::VariantJit vj = ops::variant_jit(Variant::builtin(rope));
  ASSERT_TRUE(ops::fp8_kv_widened(DType::e4m3, vj));
  EXPECT_FALSE(ops::fp8_kv_widened(DType::f16, vj));
  for (bool tc : {false, true}) {
    DecodeKernelKey key{.kv = DType::e4m3, .group = 4, .tensor_cores = tc};
    key.variant = vj.kernel();
    key.widen_kv = true;
    EXPECT_NE(ops::kernel_spec(key).id.find("widened"), std::string::npos);
    specs.push_back(ops::kernel_spec(key));
  }
  for (const auto& [q, kv, d, rows] : {std::tuple{DType::f16, DType::e4m3, 128, 64},
                                       std::tuple{DType::bf16, DType::e5m2, 256, 16}}) {
    PrefillKernelKey key;
    key.dtype = q;
    key.fp8_kv = kv;
    key.head_dim = d;
    key.rows = rows;
    key.variant = vj.kernel();
    key.widen_kv = true;
    EXPECT_EQ(key.geometry().smem, [&] {  // the 16-bit kernel's stages
      PrefillKernelKey k16 = key;
      k16.fp8_kv = DType::f32;
      return k16.geometry().smem;
    }());
    specs.push_back(ops::kernel_spec(key));
  }
  for (const auto& spec : specs) {
    runtime::CompileRequest req = spec.make();
    req.arch = "sm_90a";
    EXPECT_NO_THROW(runtime::nvrtc_compile(req)) << spec.id;
  }
}

TEST(Jit, DecodeKernelShapesCompile) {
  // The tensor-core kernel's stages / warps / CTAs-per-SM shapes (DecodePlanOptions.tc_stages,
  // tc_warps; BatchDecodeConfig.ctas_per_sm), at the head dims and groups they change most.
  const ops::DecodeTCTuning tunings[] = {
      ops::kDecodeTCSmallCtas, ops::kDecodeTCOneCta, {3, 4, 3}, {8, 2, 0}};
  for (int d : {64, 128}) {
    for (int g : {1, 16}) {
      for (const auto& t : tunings) {
        const ops::KernelSpec spec = ops::kernel_spec(DecodeKernelKey{
            .head_dim = d, .group = g, .page_size = 16, .tensor_cores = true, .tuning = t});
        runtime::CompileRequest req = spec.make();
        req.arch = "sm_90a";
        EXPECT_NO_THROW(runtime::nvrtc_compile(req)) << spec.id;
      }
    }
  }
}

TEST(Jit, KvKernelsCompileForHopperWithoutAGpu) {
  // RoPE (both vector widths and pairings), append and get_batch_indices_positions, every dtype.
  std::vector<ops::KernelSpec> specs = {ops::batch_indices_positions_kernel_spec()};
  for (DType t : {DType::f16, DType::bf16, DType::f32}) {
    specs.push_back(ops::rope_kernel_spec(t));
    specs.push_back(ops::kv_append_kernel_spec(t, t));
  }
  // fp8 caches: the bit copy and the quantizing append from each wider dtype.
  for (DType cache : {DType::e4m3, DType::e5m2}) {
    specs.push_back(ops::kv_append_kernel_spec(cache, cache));
    for (DType src : {DType::f16, DType::bf16, DType::f32})
      specs.push_back(ops::kv_append_kernel_spec(cache, src));
  }
  for (const auto& spec : specs) {
    runtime::CompileRequest req = spec.make();
    req.arch = "sm_90a";
    EXPECT_NO_THROW(runtime::nvrtc_compile(req)) << spec.id;
  }
}

TEST(Jit, CompileErrorCarriesKeyAndLog) {
  runtime::CompileRequest req;
  req.key_name = "broken_kernel";
  req.source =
      "#include \"primitives/types.cuh\"\n__global__ void k() { this_is_not_defined(); }\n";
  req.arch = "sm_90a";
  try {
    runtime::nvrtc_compile(req);
    FAIL() << "expected a compile error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("broken_kernel"), std::string::npos) << msg;
    EXPECT_NE(msg.find("this_is_not_defined"), std::string::npos) << msg;
  }
}

TEST(Jit, CorruptDiskEntryIsRecompiled) {
  namespace fs = std::filesystem;
  const std::string dir = runtime::KernelCache::instance().directory();
  if (dir.empty()) GTEST_SKIP() << "disk cache disabled";
  const ops::KernelSpec spec = ops::merge_kernel_spec(DType::f32);
  const std::string arch = "sm_80";  // a key no other test uses
  runtime::KernelCache::instance().precompile(spec.id, arch, spec.make);
  const std::string path = runtime::KernelCache::instance().entry_path(spec.id, arch, spec.make);
  ASSERT_TRUE(fs::exists(path)) << path;
  fs::resize_file(path, fs::file_size(path) / 2);
  // A fresh process would read the truncated file; emulate by asking for the key under a new id
  // (the memory cache is keyed by id, the disk cache by content hash).
  const auto before = runtime::KernelCache::instance().stats();
  EXPECT_TRUE(runtime::KernelCache::instance().precompile(spec.id + "#again", arch, spec.make));
  const auto after = runtime::KernelCache::instance().stats();
  EXPECT_EQ(after.corrupt_entries, before.corrupt_entries + 1);
  EXPECT_EQ(after.compiles, before.compiles + 1);
}

TEST(Jit, CacheKeyCoversExactlyTheIncludedHeaders) {
  // decode.cuh reaches types.cuh through several paths; merge.cuh does not reach decode_common.
  const std::string decode = "#include \"attention/decode/decode.cuh\"\n";
  const std::string merge = "#include  \"attention/merge/merge.cuh\"\n";
  // Only the closure counts: not the source text, not the order, not a header named twice or
  // named directly when it is also reached through another (decode_common.cuh via decode.cuh).
  const std::string decode_common = "#include \"attention/decode/decode_common.cuh\"\n";
  EXPECT_EQ(runtime::included_sources_hash(decode),
            runtime::included_sources_hash("// another kernel\n" + decode +
                                           "__global__ void other() {}\n"));
  EXPECT_EQ(runtime::included_sources_hash(decode),
            runtime::included_sources_hash(decode_common + decode + decode_common));
  // ... but a closure that lacks some of decode.cuh's headers differs.
  EXPECT_NE(runtime::included_sources_hash(decode), runtime::included_sources_hash(decode_common));
  EXPECT_NE(runtime::included_sources_hash(decode), runtime::included_sources_hash(merge));
  // merge.cuh's closure is merge.cuh + types.cuh: naming types.cuh as well changes nothing.
  EXPECT_EQ(runtime::included_sources_hash(merge),
            runtime::included_sources_hash(merge + "#include \"primitives/types.cuh\"\n"));
  // A header outside the closure does change it.
  EXPECT_NE(runtime::included_sources_hash(merge),
            runtime::included_sources_hash(merge + "#include \"primitives/mma.cuh\"\n"));
}

}  // namespace
}  // namespace flashkv
