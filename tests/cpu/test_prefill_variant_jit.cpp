// The prefill kernel with attention variants through the JIT, without a GPU: every built-in at
// once (per-logit hooks, Q/K transforms, sinks) and sigmoid attention (no softmax) compile for
// sm_90a into the 16-row tile (warps split KV tiles, merged through shared memory) and the 64-row
// tile, paged and ragged, and into the Hopper wgmma kernel; plain attention keeps its kernel id.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "cpu/variant_jit_util.h"
#include "flashkv/variant_spec.h"
#include "ops/jit/kernel_specs.h"
#include "ops/jit/variant_jit.h"
#include "ops/prefill/prefill_kernel.h"
#include "runtime/nvrtc_compiler.h"

namespace flashkv {
namespace {

TEST(PrefillVariantJit, BuiltinsCompileIntoThePrefillKernel) {
  AttentionVariant sigmoid;
  sigmoid.sigmoid = true;
  sigmoid.window_left = 64;
  for (const AttentionVariant& v : {test::all_softmax_builtins(), sigmoid}) {
    const ops::VariantJit j = ops::variant_jit(Variant::builtin(v));
    ASSERT_FALSE(j.id.empty());
    for (int rows : {16, 64}) {
      for (PrefillKV kv : {PrefillKV::kRagged, PrefillKV::kPagedPow2}) {
        const ops::KernelSpec spec = ops::kernel_spec(
            PrefillKernelKey{.head_dim = 128, .rows = rows, .kv = kv, .variant = j.kernel()});
        EXPECT_NE(spec.id.find(j.id), std::string::npos) << spec.id;
        const double ms = test::compile_for_hopper_ms(spec);
        std::printf("JIT cold compile %s: %.0f ms\n", spec.id.c_str(), ms);
      }
    }
  }
}

// The Hopper wgmma kernel runs every softmax variant but those that rewrite staged keys or values:
// the built-ins without RoPE compile into it (both KV paths), and a window alone (its key-range
// form).
TEST(PrefillVariantJit, VariantsCompileIntoTheWgmmaKernel) {
  AttentionVariant softmax = test::all_softmax_builtins();
  softmax.rope.mode = RopeMode::none;
  AttentionVariant window;
  window.window_left = 64;
  window.window_right = 8;
  for (const AttentionVariant& v : {softmax, window}) {
    const ops::VariantJit j = ops::variant_jit(Variant::builtin(v));
    ASSERT_FALSE(j.transforms_kv);
    const ops::KernelSpec spec = ops::kernel_spec(PrefillKernelKey{.head_dim = 128,
                                                                   .rows = 128,
                                                                   .kv = PrefillKV::kPagedPow2,
                                                                   .wgmma = true,
                                                                   .variant = j.kernel()});
    const double ms = test::compile_for_hopper_ms(spec);
    std::printf("JIT cold compile %s: %.0f ms\n", spec.id.c_str(), ms);
  }
}

TEST(PrefillVariantJit, PlainAttentionKeepsItsKernelId) {
  // Cascade and precompile name kernels without a variant: the ids (the disk cache's keys) stay.
  EXPECT_EQ(ops::kernel_spec(PrefillKernelKey{.dtype = DType::bf16, .rows = 64}).id,
            "prefill<bf16,d128,r64,paged>");
  EXPECT_EQ((PrefillKernelKey{.head_dim = 64, .rows = 16, .kv = PrefillKV::kRagged}.kernel_name()),
            "flashkv::batch_prefill_kernel<flashkv::PrefillConfig<flashkv::half_t, 64, 16, 0>, "
            "flashkv::DefaultVariant>");
}

}  // namespace
}  // namespace flashkv
