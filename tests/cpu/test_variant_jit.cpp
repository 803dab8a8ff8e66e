// Variants through the JIT without a GPU: every built-in combination and a user variant compile
// into both decode kernels for sm_90a; a user's compile error comes back as flashkv::Error with
// NVRTC's log at the user's line; bad specs and arguments are named; cold/warm JIT times printed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/test_util.h"
#include "cpu/variant_jit_util.h"
#include "flashkv/error.h"
#include "flashkv/jit.h"
#include "flashkv/variant_spec.h"
#include "ops/jit/kernel_specs.h"
#include "ops/jit/variant_jit.h"
#include "runtime/nvrtc_compiler.h"
#include "variants/builtin.cuh"

namespace flashkv {
namespace {

// A T5-style relative position bias (a variant the library does not ship) with a scalar and a
// tensor parameter, plus an output transform.
VariantSpec t5_bias_spec() {
  VariantSpec s;
  s.name = "T5Bias";
  s.params = {{"num_buckets", VariantParam::Kind::kI32},
              {"bias", VariantParam::Kind::kTensor, DType::f32},
              {"out_scale", VariantParam::Kind::kF32}};
  s.source = R"(
struct T5Bias {
  using Args = Params;
  __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition& p, float s) {
    const int d = p.q_pos() - p.kv_idx;
    const int bucket = d < a.num_buckets ? (d < 0 ? 0 : d) : a.num_buckets - 1;
    return s + a.bias[bucket];
  }
  __device__ static float output_transform(const Args& a, const flashkv::VariantRow&, int, float o) {
    return o * a.out_scale;
  }
};
)";
  return s;
}

TEST(VariantJit, BuiltinsCompileIntoBothDecodeKernels) {
  const AttentionVariant all = test::all_softmax_builtins();
  AttentionVariant sigmoid;
  sigmoid.sigmoid = true;
  sigmoid.window_left = 64;
  for (const AttentionVariant& v : {all, sigmoid}) {
    const ops::VariantJit j = ops::variant_jit(Variant::builtin(v));
    ASSERT_FALSE(j.id.empty());
    for (bool tc : {false, true}) {
      const ops::KernelSpec spec = ops::kernel_spec(DecodeKernelKey{
          .head_dim = 128, .group = 4, .page_size = 16, .tensor_cores = tc, .variant = j.kernel()});
      const double ms = test::compile_for_hopper_ms(spec);
      std::printf("JIT cold compile %s: %.0f ms\n", spec.id.c_str(), ms);
    }
  }
  // head_dim 256 (CUDA-core kernel only) with RoPE and sinks.
  AttentionVariant rope;
  rope.rope.mode = RopeMode::llama;
  rope.sinks = all.sinks;
  const ops::VariantJit j = ops::variant_jit(Variant::builtin(rope));
  EXPECT_NO_THROW(
      test::compile_for_hopper_ms(ops::kernel_spec(DecodeKernelKey{.q = DType::bf16,
                                                                   .kv = DType::bf16,
                                                                   .head_dim = 256,
                                                                   .group = 8,
                                                                   .page_size = 1,
                                                                   .variant = j.kernel()})));
}

TEST(VariantJit, UserVariantCompilesAndItsIdHashesTheSource) {
  const VariantSpec s = t5_bias_spec();
  const ops::VariantJit j = ops::variant_jit(Variant::user(s, {}));
  EXPECT_EQ(j.type, "::T5Bias");
  EXPECT_EQ(j.id.rfind("uT5Bias.", 0), 0u) << j.id;
  VariantSpec changed = s;
  changed.source += "\n// edited\n";
  EXPECT_NE(ops::variant_jit(Variant::user(changed, {})).id, j.id);
  for (bool tc : {false, true}) {
    const ops::KernelSpec spec = ops::kernel_spec(DecodeKernelKey{
        .head_dim = 128, .group = 4, .page_size = 16, .tensor_cores = tc, .variant = j.kernel()});
    const double ms = test::compile_for_hopper_ms(spec);
    std::printf("JIT cold compile %s: %.0f ms\n", spec.id.c_str(), ms);
    // The goal (a cold compile within 5 s) is measured by `flashkv bench variants` on the GPU
    // machine (1.0-2.1 s there); here ctest compiles in parallel on a shared 2-core machine, where
    // 5 s failed once at 6 s: only a gross bound is asserted.
    EXPECT_LT(ms, 60000.0) << "a cold compile of one kernel took over a minute";
  }
}

TEST(VariantJit, CompileErrorNamesTheUsersLine) {
  VariantSpec s;
  s.name = "Broken";
  s.source = "struct Broken {\n  using Args = Params;\n  this is not C++;\n};\n";
  const ops::VariantJit j = ops::variant_jit(Variant::user(s, {}));
  const ops::KernelSpec spec = ops::kernel_spec(DecodeKernelKey{
      .head_dim = 128, .group = 4, .page_size = 16, .tensor_cores = true, .variant = j.kernel()});
  try {
    test::compile_for_hopper_ms(spec);
    FAIL() << "expected a compile error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Broken.variant(3)"), std::string::npos) << msg;
  }
}

TEST(VariantJit, PrecompileTakesVariantsAndReportsTheirCompileErrors) {
  // Without a GPU: precompile() compiles a user variant into the decode (and prefill) kernels,
  // variants first, and a compile error carries NVRTC's log at the user's line.
  PrecompileOptions o;
  o.ops = {"decode", "prefill"};
  o.dtypes = {DType::f16};
  o.head_dims = {128};
  o.group_sizes = {4};
  o.page_sizes = {16};
  VariantSpec broken;
  broken.name = "Broken";
  broken.source = "struct Broken {\n  using Args = Params;\n  this is not C++;\n};\n";
  o.variants = {Variant::user(broken, {})};
  try {
    precompile(o);
    FAIL() << "expected a compile error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Broken.variant(3)"), std::string::npos) << msg;
  }
  // A good variant: its kernels (CUDA-core and tensor-core decode; 4 tile sizes x 3 KV sources of
  // prefill) are listed first, with the variant's id in theirs.
  o.ops = {"decode"};
  const ops::VariantJit j = ops::variant_jit(Variant::user(t5_bias_spec(), {}));
  o.variants = {Variant::user(t5_bias_spec(), {})};
  const auto kernels = precompile(o);
  ASSERT_EQ(kernels.size(), 2u + 4u);  // the variant's 2, then plain attention's 4
  EXPECT_NE(kernels[0].id.find(j.id), std::string::npos) << kernels[0].id;
  EXPECT_NE(kernels[1].id.find(j.id), std::string::npos) << kernels[1].id;
  EXPECT_EQ(kernels[2].id.find(j.id), std::string::npos) << kernels[2].id;
}

TEST(VariantJit, UseSoftmaxMismatchIsACompileError) {
  VariantSpec s = t5_bias_spec();
  s.use_softmax = false;  // the struct keeps the default (softmax)
  const ops::VariantJit j = ops::variant_jit(Variant::user(s, {}));
  const ops::KernelSpec spec = ops::kernel_spec(DecodeKernelKey{
      .head_dim = 128, .group = 4, .page_size = 16, .tensor_cores = true, .variant = j.kernel()});
  try {
    test::compile_for_hopper_ms(spec);
    FAIL() << "expected a compile error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_softmax"), std::string::npos) << e.what();
  }
}

TEST(VariantJit, BadSpecsAndArgumentsAreNamed) {
  VariantSpec bad = t5_bias_spec();
  bad.name = "not an identifier";
  EXPECT_THROW(ops::variant_jit(Variant::user(bad, {})), Error);
  bad = t5_bias_spec();
  bad.params.push_back({"bias", VariantParam::Kind::kF32});
  try {
    ops::variant_jit(Variant::user(bad, {}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bias' is declared twice"), std::string::npos);
  }

  const ops::VariantCallShape call{"test", Device::cuda(0), 2, 2, 32, 128};
  float host[8];
  const TensorView host_bias(host, DType::f32, {8});
  // Missing argument, wrong kind, unknown name, tensor on the wrong device.
  const auto expect_error = [&](const VariantArgs& a, const std::string& needle) {
    try {
      ops::pack_variant_args(Variant::user(t5_bias_spec(), a), call);
      FAIL() << "expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(VariantArgs().set("num_buckets", 8).set("out_scale", 1.f),
               "'bias' is declared but not given");
  expect_error(VariantArgs().set("num_buckets", 8.f).set("out_scale", 1.f).set("bias", host_bias),
               "expected an int32");
  expect_error(
      VariantArgs().set("num_buckets", 8).set("out_scale", 1.f).set("bias", host_bias).set("x", 1),
      "'x' is not one of the declared");
  expect_error(VariantArgs().set("num_buckets", 8).set("out_scale", 1.f).set("bias", host_bias),
               "expected device cuda:0");
  // Built-ins: wrong slope count, sigmoid with sinks.
  AttentionVariant v;
  v.alibi_slopes = TensorView(host, DType::f32, {8});
  EXPECT_THROW(ops::pack_variant_args(Variant::builtin(v), call), Error);
  AttentionVariant s;
  s.sigmoid = true;
  s.sinks = TensorView(host, DType::f32, {32});
  EXPECT_THROW(ops::pack_variant_args(Variant::builtin(s), call), Error);
}

TEST(VariantJit, BuiltinArgumentsAreCheckedAgainstTheCall) {
  static uint8_t bits[16];
  // One request: a mask without mask_indptr must hold qo_len x kv_len bits (here 1 x 200).
  ops::VariantCallShape call{"test", Device::cpu(), 1, 1, 32, 128, 200};
  AttentionVariant m;
  m.custom_mask.bits = bits;
  m.custom_mask.num_bytes = 16;  // 128 bits < 200
  const std::string msg =
      test::error_of([&] { ops::pack_variant_args(Variant::builtin(m), call); });
  EXPECT_NE(msg.find("needs 25 bytes, got 16"), std::string::npos) << msg;
  m.custom_mask.num_bytes = 25;
  EXPECT_NO_THROW(ops::pack_variant_args(Variant::builtin(m), call));
  // A built-in's own sm_scale must be finite and >= 0.
  AttentionVariant bad_scale;
  bad_scale.sm_scale = -1.f;
  EXPECT_THROW(ops::variant_jit(Variant::builtin(bad_scale)), Error);
  // Windows beyond any sequence clamp (the kernels add them to int positions).
  AttentionVariant far;
  far.window_left = 2147483647;
  far.window_right = 2147483647;
  const VariantArgsBlock b = ops::pack_variant_args(Variant::builtin(far), call);
  BuiltinVariantArgs a;
  std::memcpy(&a, b.bytes, sizeof(a));
  EXPECT_EQ(a.window_left, 1 << 30);
  EXPECT_EQ(a.window_right, 1 << 30);
  // Same arguments, same block (what a captured graph is compared with); others differ.
  AttentionVariant c30, c50;
  c30.logits_soft_cap = 30.f;
  c50.logits_soft_cap = 50.f;
  EXPECT_TRUE(ops::same_variant_args(ops::pack_variant_args(Variant::builtin(c30), call),
                                     ops::pack_variant_args(Variant::builtin(c30), call)));
  EXPECT_FALSE(ops::same_variant_args(ops::pack_variant_args(Variant::builtin(c30), call),
                                      ops::pack_variant_args(Variant::builtin(c50), call)));
}

}  // namespace
}  // namespace flashkv
