// ALiBi and RoPE at the tokens' own positions for the block-sparse ops
// (ops/block_sparse/sparse_positions_variant.h), without a GPU: the block-sparse reference with
// them equals the variant reference where gathered and true positions coincide (full density,
// keys in order), and differs where they do not; the generated variant compiles into the
// mma.sync prefill kernel for sm_90a with every combination of its parts, over f16 and fp8 KV.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "cpu/variant_jit_util.h"
#include "flashkv/block_sparse.h"
#include "flashkv/reference_block_sparse.h"
#include "flashkv/reference_variants.h"
#include "ops/block_sparse/sparse_positions_variant.h"
#include "ops/jit/kernel_specs.h"
#include "ops/jit/variant_jit.h"

namespace flashkv::test {
namespace {

TEST(SparsePositions, FullDensityEqualsTheVariantReference) {
  const int R = 8, hq = 4, hkv = 2, d = 64;
  const int64_t MB = 4, NB = 5, M = R * MB, N = R * NB;  // M != N: the causal shift shows
  std::vector<int32_t> indptr = {0}, indices;
  for (int64_t i = 0; i < MB; ++i) {
    for (int32_t j = 0; j < NB; ++j) indices.push_back(j);
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  const BlockSparseLayout l{indptr.data(), indices.data(), M, N, R, R};
  HostTensor q(DType::f16, {M, hq, d}), k(DType::f16, {N, hkv, d}), v(DType::f16, {N, hkv, d});
  q.fill_random(1);
  k.fill_random(2);
  v.fill_random(3);
  const HostTensor slopes = make_tensor(DType::f32, {hq}, {0.5, 0.25, 0.125, 0.0625});
  for (const bool alibi : {false, true})
    for (const bool rope : {false, true}) {
      if (!alibi && !rope) continue;
      SCOPED_TRACE(std::string(alibi ? "alibi " : "") + (rope ? "rope" : ""));
      BlockSparseOptions o;
      o.causal = true;
      AttentionVariant av;
      av.causal = true;
      if (alibi) o.alibi_slopes = av.alibi_slopes = slopes.view();
      if (rope) {
        o.rope.mode = av.rope.mode = RopeMode::llama;
        o.rope.rope_theta = av.rope.rope_theta = 500.f;
      }
      HostTensor got(DType::f32, {M, hq, d}), got_lse(DType::f32, {M, hq}),
          want(DType::f32, {M, hq, d}), want_lse(DType::f32, {M, hq});
      reference::block_sparse_attention(q.view(), k.view(), v.view(), l, got.view(), got_lse.view(),
                                        o);
      reference::single_prefill_variant(q.view(), k.view(), v.view(), want.view(), want_lse.view(),
                                        KVLayout::NHD, av);
      const auto a = got.to_doubles(), b = want.to_doubles();
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
      EXPECT_LT(worst, 1e-6);
    }
}

TEST(SparsePositions, GeneratedVariantCompilesIntoThePrefillKernel) {
  const Device dev = Device::cuda(0);
  int32_t dummy[4] = {0, 0, 0, 0};
  float fdummy[128] = {};
  ops::SparsePositionsInputs in;
  in.ids = TensorView(dummy, DType::i32, {1}, dev);
  in.kv_ptr = TensorView(dummy, DType::i32, {2}, dev);
  in.q_start = TensorView(dummy, DType::i32, {2}, dev);
  in.head_dim = 128;
  in.freq_hi_lo = TensorView(fdummy, DType::f32, {128}, dev);
  const TensorView slopes(fdummy, DType::f32, {8}, dev);
  struct Parts {
    bool alibi, rope, cap, mask, sinks;
  };
  for (const Parts p :
       {Parts{true, true, true, true, true}, Parts{true, false, false, false, false},
        Parts{false, true, false, true, false}}) {
    ops::SparsePositionsInputs c = in;
    if (p.alibi) c.alibi_slopes = slopes;
    if (p.rope) c.rope.mode = RopeMode::llama;
    if (p.cap) c.logits_soft_cap = 30.f;
    if (p.mask)
      c.custom_mask = {reinterpret_cast<const uint8_t*>(dummy), 4,
                       TensorView(dummy, DType::i32, {2}, dev)};
    if (p.sinks) c.sinks = slopes;
    if (p.rope) {  // RoPE offsets have no meaning at token positions: refused by name
      ops::SparsePositionsInputs bad = c;
      bad.rope.k_rope_offset = TensorView(dummy, DType::i32, {2}, dev);
      EXPECT_NE(error_of([&] { ops::sparse_positions_variant(bad); }).find("k_rope_offset"),
                std::string::npos);
    }
    const Variant var = ops::sparse_positions_variant(c);
    EXPECT_EQ(var.spec().source.find("key_transform") != std::string::npos, p.rope);
    const ops::VariantJit j = ops::variant_jit(var);
    for (const DType kv : {DType::f32, DType::e4m3}) {
      PrefillKernelKey key;
      key.kv = PrefillKV::kPagedPow2;
      key.variant = j.kernel();
      key.fp8_kv = kv;
      key.widen_kv = ops::fp8_kv_widened(kv, j);
      EXPECT_EQ(key.widen_kv, is_fp8_dtype(kv) && p.rope);
      const double ms = test::compile_for_hopper_ms(ops::kernel_spec(key));
      EXPECT_LT(ms, 60000.0);
    }
  }
}

}  // namespace
}  // namespace flashkv::test
