// The JIT runtime without a GPU: NVRTC compiles every kernel family for sm_90a, the disk cache
// is hit on the second request, and a corrupt entry is detected and recompiled.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/jit.h"
#include "ops/kernel_specs.h"
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
  // Warm lookup (memory hit) cost, printed for the record; the goal is <= 10 us.
  const ops::KernelSpec spec = ops::decode_kernel_spec(DType::f16, DType::f16, 128, 4, 16, true);
  constexpr int kReps = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) runtime::KernelCache::instance().precompile(spec.id, "sm_90a", spec.make);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kReps;
  std::printf("JIT warm lookup (memory hit): %.2f us\n", us);
  EXPECT_LT(us, 1000.0);
}

TEST(Jit, EveryDecodeShapeCompiles) {
  // The head dims x group sizes users have, including MQA (group 32) and odd groups and pages.
  for (int d : {64, 128, 256}) {
    for (int g : {1, 3, 16, 32}) {
      for (bool tc : {false, true}) {
        if (tc && !ops::decode_tc_supported(d, g)) continue;
        const ops::KernelSpec spec =
            ops::decode_kernel_spec(DType::bf16, DType::bf16, d, g, g == 3 ? 5 : 1, tc);
        runtime::CompileRequest req = spec.make();
        req.arch = "sm_90a";
        EXPECT_NO_THROW(runtime::nvrtc_compile(req)) << spec.id;
      }
    }
  }
}

TEST(Jit, DecodeKernelShapesCompile) {
  // The tensor-core kernel's stages / warps / CTAs-per-SM shapes (DecodePlanOptions.tc_stages,
  // tc_warps; BatchDecodeConfig.ctas_per_sm), at the head dims and groups they change most.
  const ops::DecodeTCTuning tunings[] = {ops::kDecodeTCSmallCtas, ops::kDecodeTCOneCta, {3, 4, 3}, {8, 2, 0}};
  for (int d : {64, 128}) {
    for (int g : {1, 16}) {
      for (const auto& t : tunings) {
        const ops::KernelSpec spec = ops::decode_kernel_spec(
            DType::f16, DType::f16, d, g, 16, true, {"", "flashkv::DefaultVariant"}, t);
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
    specs.push_back(ops::kv_append_kernel_spec(t));
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
  const std::string decode = "#include \"attention/decode.cuh\"\n";
  const std::string merge = "#include  \"attention/merge.cuh\"\n";
  EXPECT_EQ(runtime::included_sources_hash(decode), runtime::included_sources_hash(decode));
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
