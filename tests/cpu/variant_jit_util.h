// What the variant JIT tests share: an NVRTC compile for Hopper (no GPU needed) and a built-in
// description with every softmax built-in on (pointers never read: kernels are only compiled).
#pragma once

#include <chrono>
#include <cstdint>

#include "flashkv/variants.h"
#include "ops/jit/kernel_specs.h"
#include "runtime/nvrtc_compiler.h"

namespace flashkv::test {

// Compiles `spec` for sm_90a; returns the milliseconds NVRTC took (throws flashkv::Error).
inline double compile_for_hopper_ms(const ops::KernelSpec& spec) {
  runtime::CompileRequest req = spec.make();
  req.arch = "sm_90a";
  const auto t0 = std::chrono::steady_clock::now();
  runtime::nvrtc_compile(req);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Window (left and right), soft-cap, ALiBi, sinks, a custom mask and Llama-3.1 RoPE (sigmoid
// excluded: it has no softmax for the sinks to join).
inline AttentionVariant all_softmax_builtins() {
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

}  // namespace flashkv::test
