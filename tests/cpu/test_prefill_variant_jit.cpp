// The prefill kernel with attention variants through the JIT, without a GPU: every built-in at
// once (per-logit hooks, Q/K transforms, sinks) and sigmoid attention (no softmax) compile for
// sm_90a into the 16-row tile (warps split KV tiles, merged through shared memory) and the 64-row
// tile, paged and ragged; plain attention keeps its kernel id.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "flashkv/variant_spec.h"
#include "ops/kernel_specs.h"
#include "ops/prefill_kernel.h"
#include "ops/variant_jit.h"
#include "runtime/nvrtc_compiler.h"

namespace flashkv {
namespace {

double compile_ms(const ops::KernelSpec& spec) {
  runtime::CompileRequest req = spec.make();
  req.arch = "sm_90a";
  const auto t0 = std::chrono::steady_clock::now();
  runtime::nvrtc_compile(req);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Every built-in flag on (sigmoid excluded: it has no softmax for the sinks to join). Pointers
// are never read: the kernel is only compiled.
AttentionVariant all_builtins() {
  static float dummy[64];
  static uint8_t bits[4];
  AttentionVariant v;
  v.window_left = 128;
  v.window_right = 16;
  v.logits_soft_cap = 30.f;
  v.alibi_slopes = TensorView(dummy, DType::f32, {32});
  v.sinks = TensorView(dummy, DType::f32, {32});
  v.custom_mask.bits = bits;
  v.custom_mask.num_bytes = 4;
  v.rope.mode = RopeMode::llama31;
  return v;
}

TEST(PrefillVariantJit, BuiltinsCompileIntoThePrefillKernel) {
  AttentionVariant sigmoid;
  sigmoid.sigmoid = true;
  sigmoid.window_left = 64;
  for (const AttentionVariant& v : {all_builtins(), sigmoid}) {
    const ops::VariantJit j = ops::variant_jit(Variant::builtin(v));
    ASSERT_FALSE(j.id.empty());
    for (int rows : {16, 64}) {
      for (int kv : {0, 1}) {  // ragged, paged (power-of-two pages)
        const ops::KernelSpec spec = ops::prefill_kernel_spec(DType::f16, 128, rows, kv, j);
        EXPECT_NE(spec.id.find(j.id), std::string::npos) << spec.id;
        const double ms = compile_ms(spec);
        std::printf("JIT cold compile %s: %.0f ms\n", spec.id.c_str(), ms);
      }
    }
  }
}

TEST(PrefillVariantJit, PlainAttentionKeepsItsKernelId) {
  // Cascade and precompile name kernels without a variant: the ids (the disk cache's keys) stay.
  EXPECT_EQ(ops::prefill_kernel_spec(DType::bf16, 128, 64, 1).id, "prefill<bf16,d128,r64,paged>");
  EXPECT_EQ(ops::prefill_kernel_name(DType::f16, 64, 16, ops::PrefillKV::kRagged),
            "flashkv::batch_prefill_kernel<flashkv::PrefillConfig<flashkv::half_t, 64, 16, 0>, "
            "flashkv::DefaultVariant>");
}

}  // namespace
}  // namespace flashkv
