// Batch prefill over fp8 (e4m3 / e5m2) keys and values on the GPU, both kernels (the Hopper
// kernel, whose producer widens fp8 tiles into its 16-bit stages, and the mma.sync kernel, which
// widens fragments in registers), paged and ragged KV, against the CPU reference on the
// dequantized values with the tolerance rule of the query dtype: head_dim 64/128/256, GQA
// 1/4/8/16, pages 1/16/64, NHD/HND, causal and not, every query-tile size, split-KV, scales per
// tensor / as tensors / per KV head, one long prompt; variants (the fused-RoPE variant over fp8:
// test_prefill_variants_gpu.cpp).
#include <gtest/gtest.h>

#include "flashkv/error.h"
#include "gpu/prefill_case.h"

namespace flashkv::test {
namespace {

class PrefillFp8Gpu : public GpuTest {};

const PrefillRequests kMixed = {{17, 17}, {1, 300},   {113, 500}, {0, 9},
                                {7, 0},   {250, 250}, {40, 13},   {1, 1}};

TEST_F(PrefillFp8Gpu, ShapesAgainstReference) {
  struct Heads {
    int qo, kv;
  };
  const Heads heads[] = {{8, 8}, {8, 2}, {8, 1}, {16, 1}};
  const int pages[] = {1, 16, 64};
  int i = 0;
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (DType dt : {DType::f16, DType::bf16})
      for (int d : {64, 128, 256}) {
        PrefillCase c;
        c.set_requests(kMixed);
        const Heads h = heads[i % 4];
        c.num_qo_heads = h.qo;
        c.num_kv_heads = h.kv;
        c.head_dim = d;
        c.page_size = pages[i % 3];
        c.layout = i % 2 ? KVLayout::HND : KVLayout::NHD;
        c.interleaved = i % 5 == 0;
        c.dtype = dt;
        c.fp8_kv = kv;
        c.opts.causal = i % 3 != 1;
        c.seed = 300 + i++;
        const PrefillInputs in = make_prefill_inputs(c);
        expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged, c.opts), "paged " + c.str());
        expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged, c.opts), "ragged " + c.str());
        PrefillPlanOptions hopper = c.opts;
        hopper.backend = PrefillBackend::kWgmma;
        const PrefillOutcome wg = run_prefill(in, PrefillKV::kPaged, hopper);
        expect_prefill_ok(in, wg, "wgmma " + c.str());
        EXPECT_TRUE(wg.plan.wgmma) << c.str();
        PrefillPlanOptions mma = c.opts;
        mma.backend = PrefillBackend::kMmaSync;
        expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged, mma), "mma.sync " + c.str());
        // Every query-tile size, and split-KV forced.
        for (int rows : {16, 32, 64}) {  // (128 rows: the Hopper kernel above)
          PrefillPlanOptions o = c.opts;
          o.tile_rows = rows;
          o.fixed_split_size = rows == 32 ? 256 : 0;
          expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged, o),
                            "tile " + std::to_string(rows) + " " + c.str());
        }
      }
}

TEST_F(PrefillFp8Gpu, ScalesAndALongPrompt) {
  const KVScaleCase scales[] = {{1e-3f, 100.0f, 0}, {100.0f, 1e-3f, 1}, {0.5f, 2.0f, 2}};
  int i = 0;
  for (const KVScaleCase& s : scales) {
    PrefillCase c;
    c.set_requests({{300, 700}, {64, 64}, {1, 5000}});
    c.num_qo_heads = 32;
    c.num_kv_heads = 8;
    c.fp8_kv = i % 2 ? DType::e5m2 : DType::e4m3;
    c.dtype = i == 1 ? DType::bf16 : DType::f16;
    c.scale = s;
    c.opts.causal = true;
    c.seed = 400 + i++;
    const PrefillInputs in = make_prefill_inputs(c);
    expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged, c.opts), "paged " + c.str());
    expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged, c.opts), "ragged " + c.str());
    PrefillPlanOptions mma = c.opts;
    mma.backend = PrefillBackend::kMmaSync;
    expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged, mma), "mma.sync " + c.str());
  }
  PrefillCase c;
  c.set_requests({{8192, 8192}});
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.fp8_kv = DType::e4m3;
  c.scale = {0.25f, 4.0f, 2};
  c.opts.causal = true;
  c.seed = 450;
  const PrefillInputs in = make_prefill_inputs(c);
  expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged, c.opts), "long " + c.str());
  expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged, c.opts), "long ragged " + c.str());
}

TEST_F(PrefillFp8Gpu, VariantsOverFp8Kv) {
  // Window, soft-cap and sinks go through the variant kernel with fp8 tiles.
  PrefillCase c;
  c.set_requests({{100, 400}, {33, 33}});
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.fp8_kv = DType::e4m3;
  c.scale = {0.5f, 1.5f, 0};
  c.opts.causal = true;
  c.seed = 470;
  const PrefillInputs in = make_prefill_inputs(c);
  // A window that covers every key and a soft-cap large enough not to bind: the answer is the
  // plain one, through the variant kernel's fp8 path.
  AttentionVariant v;
  v.causal = true;
  v.window_left = 100000;
  v.logits_soft_cap = 1e4f;
  PrefillPlanOptions o = c.opts;
  o.variant = Variant::builtin(v);
  expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged, o), "variant " + c.str());
}

// A small batch on the Hopper kernel at head_dim 128 (two query buffers) and 256 (one: the
// producer hands an item's last staged tile over before the next query tile waits), several
// items per CTA: the case the sanitizers run.
TEST_F(PrefillFp8Gpu, HopperKernelSmallBatches) {
  for (int d : {128, 256}) {
    PrefillCase c;
    c.set_requests({{40, 300}, {129, 129}, {1, 64}, {300, 1000}});
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = d;
    c.fp8_kv = d == 128 ? DType::e4m3 : DType::e5m2;
    c.scale = {0.5f, 2.0f, 2};
    c.opts.causal = true;
    c.opts.backend = PrefillBackend::kWgmma;
    c.seed = 480 + d;
    const PrefillInputs in = make_prefill_inputs(c);
    const PrefillOutcome o = run_prefill(in, PrefillKV::kPaged, c.opts);
    expect_prefill_ok(in, o, c.str());
    EXPECT_TRUE(o.plan.wgmma) << c.str();
  }
}

}  // namespace
}  // namespace flashkv::test
