// Batch decode on the GPU vs the CPU reference across the shapes users have.
#include <gtest/gtest.h>

#include <random>

#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "gpu/decode_case.h"

namespace flashkv::test {
namespace {

class DecodeGpu : public GpuTest {};

// Lengths with the edge cases: empty, length 1, odd sizes, one longer than a chunk.
const std::vector<int64_t> kMixedLens = {0, 1, 17, 113, 577, 1023, 2051, 5};

TEST_F(DecodeGpu, HeadDimsGroupsPagesLayoutsDtypes) {
  struct Heads {
    int qo, kv;
  };
  // GQA ratios 1, 4, 8, 16 and MQA (32 query heads on one KV head).
  const Heads heads[] = {{8, 8}, {32, 8}, {32, 4}, {32, 2}, {32, 1}};
  uint64_t seed = 100;
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int d : {64, 128, 256}) {
      for (Heads h : heads) {
        for (int page : {1, 16, 64}) {
          DecodeCase c;
          c.kv_lens = kMixedLens;
          c.num_qo_heads = h.qo;
          c.num_kv_heads = h.kv;
          c.head_dim = d;
          c.page_size = page;
          c.dtype = dt;
          c.layout = (seed % 2) ? KVLayout::HND : KVLayout::NHD;
          c.interleaved = (seed % 3) == 0;
          c.seed = seed++;
          // Auto (tensor cores where supported; 2 CTAs of 4 warps per SM for this small batch),
          // the other shapes auto picks (4 CTAs of 2 warps, 1 of 8;
          // ops/decode/decode_shape_choice.cpp), then the CUDA-core kernel on the same case.
          const DecodeOutcome o = run_decode_case(c);
          expect_decode_ok(c, o);
          EXPECT_EQ(o.plan.ctas_per_sm, 2) << c.str();
          for (auto [ctas, warps] : {std::pair{4, 2}, {1, 8}}) {
            c.ctas_per_sm = ctas;
            const DecodeOutcome shaped = run_decode_case(c);
            expect_decode_ok(c, shaped);
            EXPECT_EQ(shaped.plan.ctas_per_sm, ctas) << c.str();
            if (shaped.plan.tensor_cores && d <= 128)
              EXPECT_EQ(shaped.plan.warps, warps) << c.str();
          }
          c.ctas_per_sm = 0;
          c.opts.backend = DecodeBackend::kCudaCores;
          expect_decode_ok(c, run_decode_case(c));
        }
      }
    }
  }
}

TEST_F(DecodeGpu, BothLayoutsAndInterleavingAgree) {
  for (KVLayout l : {KVLayout::NHD, KVLayout::HND}) {
    for (bool inter : {false, true}) {
      for (DecodeBackend b : {DecodeBackend::kTensorCores, DecodeBackend::kCudaCores}) {
        DecodeCase c;
        c.opts.backend = b;
        c.kv_lens = {300, 1, 4000};
        c.layout = l;
        c.interleaved = inter;
        c.seed = 7;
        expect_decode_ok(c, run_decode_case(c));
      }
    }
  }
}

TEST_F(DecodeGpu, OddPageSizesAndSmScale) {
  for (int page : {5, 7, 33}) {
    DecodeCase c;
    c.kv_lens = kMixedLens;
    c.page_size = page;
    c.opts.sm_scale = 0.3f;
    c.seed = 40 + page;
    expect_decode_ok(c, run_decode_case(c));
  }
}

TEST_F(DecodeGpu, AllEmptyAndSingleTokenBatches) {
  for (auto lens : {std::vector<int64_t>{0}, {0, 0, 0}, {1}, {1, 1, 1, 1}}) {
    DecodeCase c;
    c.kv_lens = lens;
    c.seed = 3;
    expect_decode_ok(c, run_decode_case(c));
  }
}

TEST_F(DecodeGpu, VeryLongRequestSplitsAcrossTheGpu) {
  for (DecodeBackend b : {DecodeBackend::kTensorCores, DecodeBackend::kCudaCores}) {
    DecodeCase c;
    c.kv_lens = {131072};
    c.opts.backend = b;
    c.seed = 11;
    const DecodeOutcome o = run_decode_case(c);
    expect_decode_ok(c, o);
    EXPECT_EQ(o.plan.tensor_cores, b == DecodeBackend::kTensorCores);
    EXPECT_GT(o.plan.num_split_tiles, 0) << "one long request must be split (split-KV)";
    EXPECT_GE(o.plan.num_work_items, o.plan.num_ctas / 2);
  }
}

// Auto's kernel shape (ops/decode/decode_shape_choice.cpp): 4 CTAs of 2 warps per SM where every
// CTA has work enough (>= 896 KV tokens each), 1 of 8 warps for few equal pairs, else 2 of 4;
// always the default under CUDA graphs or fixed_split_size.
TEST_F(DecodeGpu, AutoShapeFollowsTheWork) {
  struct Expect {
    std::vector<int64_t> lens;
    bool graph;
    int fixed_split;
    int ctas_per_sm, warps;
  };
  const std::vector<int64_t> large(48, 2048);  // 786K token-heads: 1490 per small CTA
  const std::vector<int64_t> equal(4, 3000), unequal{3000, 1000, 2000, 17};  // 32 pairs
  for (const Expect& e : {Expect{large, false, 0, 4, 2}, Expect{equal, false, 0, 1, 8},
                          Expect{unequal, false, 0, 2, 4}, Expect{large, true, 0, 2, 4},
                          Expect{equal, true, 0, 2, 4}, Expect{large, false, 512, 2, 4}}) {
    DecodeCase c;
    c.kv_lens = e.lens;
    c.opts.enable_cuda_graph = e.graph;
    c.opts.fixed_split_size = e.fixed_split;
    c.seed = 60 + e.lens.size() + e.fixed_split + e.graph;
    const DecodeOutcome o = run_decode_case(c);
    expect_decode_ok(c, o);
    EXPECT_TRUE(o.plan.tensor_cores);
    EXPECT_EQ(o.plan.ctas_per_sm, e.ctas_per_sm) << c.str();
    EXPECT_EQ(o.plan.warps, e.warps) << c.str();
  }
}

TEST_F(DecodeGpu, Batch1024) {
  DecodeCase c;
  std::mt19937 rng(5);
  for (int i = 0; i < 1024; ++i) c.kv_lens.push_back(rng() % 600);
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.seed = 12;
  expect_decode_ok(c, run_decode_case(c));
}

TEST_F(DecodeGpu, MixedBatchWithEverything) {
  DecodeCase c;
  c.kv_lens = {0, 1, 65536, 5, 1000, 0, 17, 20000, 1};
  c.page_size = 5;
  c.layout = KVLayout::HND;
  c.dtype = DType::bf16;
  c.seed = 13;
  expect_decode_ok(c, run_decode_case(c));
}

TEST_F(DecodeGpu, SplitOptions) {
  for (int fixed : {0, 64, 1000}) {
    for (bool nosplit : {false, true}) {
      DecodeCase c;
      c.kv_lens = {4096, 3, 1500, 0, 777};
      c.opts.fixed_split_size = nosplit ? 0 : fixed;
      c.opts.disable_split_kv = nosplit;
      c.seed = 50 + fixed;
      const DecodeOutcome o = run_decode_case(c);
      expect_decode_ok(c, o);
      if (nosplit) {
        EXPECT_EQ(o.plan.num_split_tiles, 0);
      }
    }
  }
}

// GQA ratio 2 and groups that are not powers of two (3: 24/8, 6: 12/2). Auto takes the
// tensor-core kernel at head_dim 64 and 128 (groups up to 16 fit its registers: decode.h) and CUDA
// cores at 256; where both can run, the CUDA-core kernel runs the case too.
TEST_F(DecodeGpu, GqaRatioTwoAndNonPowerOfTwoGroups) {
  struct Shape {
    int qo, kv, head_dim;
    DType dtype;
  };
  const Shape shapes[] = {{16, 8, 128, DType::f16},  {24, 8, 64, DType::bf16},
                          {24, 8, 128, DType::f16},  {24, 8, 256, DType::f16},
                          {12, 2, 128, DType::bf16}, {12, 2, 256, DType::bf16}};
  uint64_t seed = 300;
  for (const Shape& sh : shapes) {
    DecodeCase c;
    c.kv_lens = kMixedLens;
    c.num_qo_heads = sh.qo;
    c.num_kv_heads = sh.kv;
    c.head_dim = sh.head_dim;
    c.dtype = sh.dtype;
    c.layout = (seed % 2) ? KVLayout::HND : KVLayout::NHD;
    c.seed = seed++;
    const DecodeOutcome o = run_decode_case(c);
    expect_decode_ok(c, o);
    EXPECT_EQ(o.plan.tensor_cores, sh.head_dim <= 128) << c.str();
    if (sh.head_dim <= 128) {
      c.opts.backend = DecodeBackend::kCudaCores;
      const DecodeOutcome cuda_cores = run_decode_case(c);
      expect_decode_ok(c, cuda_cores);
      EXPECT_FALSE(cuda_cores.plan.tensor_cores) << c.str();
    }
  }
}

// A 131072-token request among small and empty ones (f16, page 16): the long one is split across
// the GPU while the others run whole, and each request is checked on its own (run_decode_case),
// so a wrong short request is not hidden by the long one. 8/2 heads keep the host cache ~140 MB.
TEST_F(DecodeGpu, MixedBatchWithA131072TokenRequest) {
  for (DecodeBackend b : {DecodeBackend::kTensorCores, DecodeBackend::kCudaCores}) {
    DecodeCase c;
    c.kv_lens = {1, 131072, 0, 17, 300, 5, 1000};
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    c.opts.backend = b;
    c.seed = 14;
    const DecodeOutcome o = run_decode_case(c);
    expect_decode_ok(c, o);
    EXPECT_EQ(o.plan.tensor_cores, b == DecodeBackend::kTensorCores) << c.str();
    EXPECT_GT(o.plan.num_split_tiles, 0) << c.str() << ": the long request must be split";
  }
}

// BatchDecodeConfig.num_sms_to_use = 16 leaves the other SMs to overlapped work: the plan's grid
// is 16 SMs' worth of CTAs (PlanInfo.num_ctas = 16 x PlanInfo.ctas_per_sm), and the output, long
// request split over that smaller grid included, is still right.
TEST_F(DecodeGpu, NumSmsToUseLimitsTheGrid) {
  const int kSms = 16;
  ASSERT_GE(device_info(0).sm_count, kSms);
  std::vector<int64_t> lens = kMixedLens;
  lens.push_back(20000);
  for (DecodeBackend b : {DecodeBackend::kAuto, DecodeBackend::kCudaCores}) {
    for (int ctas_per_sm : {0, 4}) {
      DecodeCase c;
      c.kv_lens = lens;
      c.num_sms_to_use = kSms;
      c.ctas_per_sm = ctas_per_sm;
      c.opts.backend = b;
      c.seed = 70 + ctas_per_sm;
      const DecodeOutcome o = run_decode_case(c);
      expect_decode_ok(c, o);
      if (ctas_per_sm > 0) EXPECT_EQ(o.plan.ctas_per_sm, ctas_per_sm) << c.str();
      EXPECT_EQ(o.plan.num_ctas, kSms * o.plan.ctas_per_sm) << c.str();
      EXPECT_GT(o.plan.num_split_tiles, 0)
          << c.str() << ": 20000 tokens over " << o.plan.num_ctas << " CTAs must be split";
    }
  }
}

// fixed_split_size cuts requests by their lengths, not the grid: 8 requests of 8000 tokens in
// chunks of 16 are 4000 partial states per KV head, beyond the dynamic-splitting workspace (2 per
// CTA). Without sizing, plan() refuses and names the config fields that size for it; with
// BatchDecodeConfig.max_kv_tokens / min_fixed_split_size it runs, checked against the reference.
TEST_F(DecodeGpu, FixedSplitSizeBeyondDynamicCapacityNeedsTheConfigSizing) {
  DecodeCase c;
  c.kv_lens = std::vector<int64_t>(8, 8000);
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.opts.fixed_split_size = 16;
  c.seed = 81;
  try {
    run_decode_case(c);
    ADD_FAILURE() << "plan() accepted 4000 chunks per KV head in a workspace sized for "
                     "dynamic splitting";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_kv_tokens"), std::string::npos) << e.what();
  }
  c.max_kv_tokens = 8 * 8000;
  c.min_fixed_split_size = 16;
  const DecodeOutcome o = run_decode_case(c);
  expect_decode_ok(c, o);
  EXPECT_EQ(o.plan.num_split_tiles, 8 * 2) << c.str();
}

}  // namespace
}  // namespace flashkv::test

namespace flashkv::test {
namespace {

// single_decode over contiguous KV (NHD and HND) and batch_decode with host page tables, on the
// library's cached per-device decoder, vs the reference.
TEST_F(DecodeGpu, ConvenienceFunctions) {
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    for (int64_t len : {0, 1, 777, 40000}) {
      const int Hq = 32, Hkv = 8, D = 128;
      HostTensor q(DType::f16, {Hq, D});
      q.fill_random(len + 1);
      std::vector<int64_t> kshape = layout == KVLayout::NHD ? std::vector<int64_t>{len, Hkv, D}
                                                            : std::vector<int64_t>{Hkv, len, D};
      HostTensor k(DType::f16, kshape), v(DType::f16, kshape);
      if (len > 0) {
        k.fill_random(len + 2);
        v.fill_random(len + 3);
      }
      HostTensor ref(DType::f32, {Hq, D}), ref_lowp(DType::f16, {Hq, D}), ref_lse(DType::f32, {Hq});
      reference::single_decode(q.view(), k.view(), v.view(), ref.view(), ref_lse.view(), layout);
      for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));
      auto dq = to_device(q), dk = to_device(k), dv = to_device(v);
      HostTensor out(DType::f16, {Hq, D}), lse(DType::f32, {Hq});
      auto dout = poisoned_like(out), dlse = poisoned_like(lse);
      single_decode(dq.view, dk.view, dv.view, dout.view, dlse.view, layout);
      synchronize();
      to_host(dout, out);
      to_host(dlse, lse);
      EXPECT_TRUE(
          matches_reference(out.to_doubles(), ref.to_doubles(), ref_lowp.to_doubles(), DType::f16))
          << "single_decode len " << len << " " << kv_layout_name(layout);
      EXPECT_LE(rel_err(lse.to_doubles(), ref_lse.to_doubles()), 1e-4);
    }
  }
  // batch_decode: host indptr / last_page_len, device k, v, indices.
  PagedCacheHost cache =
      make_paged_cache({5, 0, 3000, 64}, 16, 8, 128, KVLayout::NHD, DType::bf16, 9);
  DeviceCache dc = to_device(cache);
  PagedKVCache mixed = dc.cache;
  mixed.indptr = cache.indptr.view();
  mixed.last_page_len = cache.last_page_len.view();
  HostTensor q(DType::bf16, {4, 32, 128});
  q.fill_random(10);
  HostTensor ref(DType::f32, {4, 32, 128}), ref_lowp(DType::bf16, {4, 32, 128});
  reference::batch_decode(q.view(), cache.cache, ref.view(), TensorView());
  for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));
  auto dq = to_device(q);
  HostTensor out(DType::bf16, {4, 32, 128});
  auto dout = poisoned_like(out);
  batch_decode(dq.view, mixed, dout.view, TensorView());
  synchronize();
  to_host(dout, out);
  EXPECT_TRUE(
      matches_reference(out.to_doubles(), ref.to_doubles(), ref_lowp.to_doubles(), DType::bf16));
  // Device indptr is refused with a message saying why.
  EXPECT_THROW(batch_decode(dq.view, dc.cache, dout.view, TensorView()), Error);
}

}  // namespace
}  // namespace flashkv::test
