// The Hopper wgmma prefill kernel (attention/prefill/prefill_hopper_ws.cuh: KV by TMA where the
// storage allows, else by the producer's cp.async) vs the CPU reference, forced with
// PrefillPlanOptions.backend = kWgmma on 128-row query tiles: head_dim 64/128/256, GQA groups
// 1/4/8/16 and MQA, page sizes 1/5/16/64, NHD/HND/interleaved, f16/bf16, causal and not, paged
// and ragged KV, split-KV with its merge, empty and length-1 requests and long KV. Also which
// kernel kAuto picks, and the errors of kWgmma where the kernel cannot run. Skipped (with the
// reason) on GPUs other than sm_90a. Tolerance: tests/common/test_util.h, as for every prefill
// test.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/variant_spec.h"
#include "gpu/prefill_case.h"
#include "runtime/kernel_cache.h"  // device_arch

namespace flashkv::test {
namespace {

class PrefillWgmmaGpu : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    const std::string arch = runtime::device_arch(0);
    if (arch != "sm_90a") GTEST_SKIP() << "the wgmma kernel needs an sm_90a GPU; this is " << arch;
  }
};

using Requests = PrefillRequests;

PrefillPlanOptions wgmma_opts(const PrefillCase& c) {
  PrefillPlanOptions o = c.opts;
  o.tile_rows = 128;
  o.backend = PrefillBackend::kWgmma;
  return o;
}

// Prompts, appends, a decode row, empty requests both ways, qo > kv (causal: rows see nothing),
// lengths off every tile and page boundary, and one request whose KV spans many 128-token tiles.
const Requests kMixed = {{17, 17},   {1, 300}, {113, 500}, {0, 9},     {7, 0},
                         {250, 250}, {40, 13}, {1, 1},     {300, 1400}};

TEST_F(PrefillWgmmaGpu, HeadDimsGroupsPagesLayoutsDtypes) {
  // 16 query heads over 16, 4, 2, 1 KV heads: groups 1, 4, 8 and 16 (MQA).
  const int kv_heads[] = {16, 4, 2, 1};
  for_each_matrix_case(kMixed, 16, kv_heads, 9100, [&](const PrefillCase& c) {
    const PrefillInputs in = make_prefill_inputs(c);
    for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
      const PrefillOutcome o = run_prefill(in, kv, wgmma_opts(c));
      expect_prefill_ok(in, o, prefill_kv_name(kv));
      EXPECT_TRUE(o.plan.wgmma) << c.str();
      // TMA loads (the warp-specialized kernel) for ragged KV and pages of >= 16 tokens.
      EXPECT_EQ(o.plan.kv_tma, kv == PrefillKV::kRagged || c.page_size >= 16) << c.str();
    }
  });
}

// A cache from torch.empty: the page slots past each request's KV hold NaN. The TMA loads bring
// 16-token boxes; a request's last tokens come one by one, so nothing past kv_end is read (P is 0
// there, but 0 x NaN is NaN). Pages of 5 tokens take the producer's cp.async gather.
TEST_F(PrefillWgmmaGpu, NanInPagePaddingStaysOut) {
  uint64_t seed = 9600;
  for (int d : {64, 128, 256}) {
    for (int page : {5, 16, 64}) {
      for (bool causal : {false, true}) {
        PrefillCase c;
        c.set_requests({{17, 17}, {1, 300}, {113, 500}, {40, 13}, {250, 250}, {3, 1400}, {1, 1}});
        c.head_dim = d;
        c.page_size = page;
        c.layout = page == 16 ? KVLayout::HND : KVLayout::NHD;
        c.nan_padding = true;
        c.opts.causal = causal;
        c.seed = seed++;
        const PrefillInputs in = make_prefill_inputs(c);
        const PrefillOutcome o = run_prefill(in, PrefillKV::kPaged, wgmma_opts(c));
        expect_prefill_ok(in, o, "NaN page padding");
        EXPECT_EQ(o.plan.kv_tma, page >= 16) << c.str();
      }
    }
  }
}

// Dynamic split-KV, fixed_split_size and no split: the partial states of 128-row tiles and their
// merge, on one batch, at every head_dim. Small fixed chunks give each CTA many work items, so the
// loads run ahead across items (through both query buffers at head_dim <= 128, the single one at
// 256); (50, 20) has causal rows before the first key.
TEST_F(PrefillWgmmaGpu, SplitOptionsAndLongKv) {
  uint64_t seed = 9200;
  for (int d : {64, 128, 256}) {
    PrefillCase c;
    c.set_requests({{1, 1},
                    {17, 17},
                    {113, 600},
                    {5, 0},
                    {64, 10},
                    {150, 1500},
                    {1, 3000},
                    {40, 9000},
                    {50, 20}});
    c.head_dim = d;
    c.opts.causal = true;
    c.seed = seed++;
    const PrefillInputs in = make_prefill_inputs(c);
    for (int split : {0, 1, 2, 3}) {
      PrefillPlanOptions opts = wgmma_opts(c);
      opts.fixed_split_size = split == 1 ? 1000 : split == 3 ? 256 : 0;
      opts.disable_split_kv = split == 2;
      const std::string what = "head_dim " + std::to_string(d) +
                               (split == 1   ? " fixed_split 1000"
                                : split == 2 ? " nosplit"
                                : split == 3 ? " fixed_split 256"
                                             : " dynamic");
      const PrefillOutcome o = run_prefill(in, PrefillKV::kPaged, opts);
      expect_prefill_ok(in, o, what);
      EXPECT_TRUE(o.plan.wgmma) << what;
      if (split == 1 || split == 3) EXPECT_GT(o.plan.num_split_tiles, 0) << what;
      if (split == 2) EXPECT_EQ(o.plan.num_split_tiles, 0) << what;
      // Dynamic chunks are cut on KV tiles (TMA loads); a fixed 1000 is not a multiple of one.
      EXPECT_EQ(o.plan.kv_tma, split != 1) << what;
    }
  }
}

// Batches with no query token (nothing to launch: run() needs no tensor map and must not fail),
// and tiny ones, on the wgmma kernel; kMmaSync beside it as the control.
TEST_F(PrefillWgmmaGpu, EmptyAndTinyBatches) {
  const Requests batches[] = {
      {{0, 5}, {0, 0}}, {{1, 0}}, {{1, 1}, {1, 1}}, {{0, 5}, {1, 1}, {0, 0}}};
  uint64_t seed = 9700;
  for (const Requests& reqs : batches) {
    PrefillCase c;
    c.set_requests(reqs);
    c.opts.causal = true;
    c.seed = seed++;
    const PrefillInputs in = make_prefill_inputs(c);
    for (PrefillBackend b : {PrefillBackend::kWgmma, PrefillBackend::kMmaSync}) {
      for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
        PrefillPlanOptions opts = c.opts;
        opts.backend = b;
        const std::string what = std::string(prefill_kv_name(kv)) +
                                 (b == PrefillBackend::kWgmma ? " wgmma" : " mma.sync");
        expect_prefill_ok(in, run_prefill(in, kv, opts), what);
      }
    }
  }
}

// kWgmma with tile_rows 0 takes the kernel's 128-row tiles even where the heuristic would pick
// smaller ones (short queries: the heuristic's tile here is 16 rows).
TEST_F(PrefillWgmmaGpu, ForcedWgmmaTakesFullTiles) {
  PrefillCase c;
  c.set_requests({{3, 500}, {1, 40}, {4, 4}, {2, 0}});
  c.opts.causal = true;
  c.seed = 9350;
  const PrefillInputs in = make_prefill_inputs(c);
  PrefillPlanOptions opts = c.opts;
  opts.backend = PrefillBackend::kWgmma;
  const PrefillOutcome o = run_prefill(in, PrefillKV::kPaged, opts);
  expect_prefill_ok(in, o, "forced wgmma, tile_rows 0");
  EXPECT_EQ(o.plan.tile_rows, 128);
  EXPECT_TRUE(o.plan.wgmma);
}

// kAuto: 128-row tiles of plain attention take the wgmma kernel, smaller tiles and kMmaSync the
// mma.sync kernel; both answer the same batch within the tolerance.
TEST_F(PrefillWgmmaGpu, AutoPicksWgmmaForFullTiles) {
  PrefillCase c;
  c.set_requests({{200, 200}, {33, 700}, {1, 50}});
  c.opts.causal = true;
  c.seed = 9300;
  const PrefillInputs in = make_prefill_inputs(c);
  for (int tile : {0, 64, 128}) {
    for (PrefillBackend b : {PrefillBackend::kAuto, PrefillBackend::kMmaSync}) {
      PrefillPlanOptions opts = c.opts;
      opts.tile_rows = tile;
      opts.backend = b;
      const std::string what = "tile_rows " + std::to_string(tile) +
                               (b == PrefillBackend::kAuto ? " auto" : " mma.sync");
      const PrefillOutcome o = run_prefill(in, PrefillKV::kPaged, opts);
      expect_prefill_ok(in, o, what);
      EXPECT_EQ(o.plan.wgmma, b == PrefillBackend::kAuto && o.plan.tile_rows == 128) << what;
    }
  }
}

// A user variant on the wgmma kernel with a query transform (q * 2) and a logits transform that
// halves the logit and adds a bias of 0 (the same logits, exactly: doubling is exact in 16 bits),
// a mask that keeps every key and an identity output transform: the plain reference. Across
// head_dims, GQA and MHA, causal and not, paged (TMA and gather) and ragged; the automatic backend
// picks wgmma for it.
TEST_F(PrefillWgmmaGpu, UserVariantWithQueryTransformAndLogitsHooks) {
  VariantSpec spec;
  spec.name = "QueryTwice";
  spec.params = {{"qs", VariantParam::Kind::kF32},
                 {"ls", VariantParam::Kind::kF32},
                 {"os", VariantParam::Kind::kF32},
                 {"bias", VariantParam::Kind::kTensor, DType::f32}};
  spec.source = R"(
struct QueryTwice {
  using Args = Params;
  __device__ static void query_transform(const Args& a, const flashkv::VariantRow&, int, float& x1,
                                         float& x2) {
    x1 *= a.qs; x2 *= a.qs;
  }
  __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition& p,
                                           float s) {
    return s * a.ls + a.bias[p.qo_head];
  }
  __device__ static bool logits_mask(const Args&, const flashkv::VariantPosition& p) {
    return p.kv_idx >= 0;
  }
  __device__ static float output_transform(const Args& a, const flashkv::VariantRow&, int,
                                           float o) {
    return o * a.os;
  }
};
)";
  uint64_t seed = 9700;
  for (int d : {64, 128, 256}) {
    for (int kv_heads : {8, 2}) {
      PrefillCase c;
      c.set_requests({{17, 17}, {1, 300}, {113, 500}, {40, 13}, {250, 250}, {300, 1400}});
      c.head_dim = d;
      c.num_kv_heads = kv_heads;
      c.page_size = d == 128 ? 1 : 16;
      c.opts.causal = kv_heads == 2;
      c.opts.sm_scale = 0.1f;
      c.seed = seed++;
      const PrefillInputs in = make_prefill_inputs(c);
      HostTensor bias =
          make_tensor(DType::f32, {c.num_qo_heads}, std::vector<double>(c.num_qo_heads, 0.0));
      DeviceTensor d_bias = to_device(bias);
      PrefillPlanOptions opts = c.opts;  // kAuto: the wgmma kernel where the batch suits it
      opts.tile_rows = 128;
      opts.variant = Variant::user(
          spec,
          VariantArgs().set("qs", 2.f).set("ls", 0.5f).set("os", 1.f).set("bias", d_bias.view));
      for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
        const PrefillOutcome o = run_prefill(in, kv, opts);
        expect_prefill_ok(in, o, std::string("QueryTwice ") + prefill_kv_name(kv));
        EXPECT_TRUE(o.plan.wgmma) << c.str();
      }
    }
  }
}

// kWgmma where the kernel cannot run: a smaller query tile, a variant that rewrites keys (fused
// RoPE), or one without softmax. plan() names why.
TEST_F(PrefillWgmmaGpu, ForcedWgmmaRefusesWhatItCannotRun) {
  PrefillCase c;
  c.set_requests({{20, 40}});
  c.seed = 9400;
  const PrefillInputs in = make_prefill_inputs(c);
  PrefillPlanOptions opts = wgmma_opts(c);
  opts.tile_rows = 64;
  try {
    run_prefill(in, PrefillKV::kPaged, opts);
    ADD_FAILURE() << "tile_rows 64 with backend kWgmma: expected flashkv::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PrefillPlanOptions.backend"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("128-row"), std::string::npos) << e.what();
  }
  opts = wgmma_opts(c);
  AttentionVariant rope;
  rope.rope.mode = RopeMode::llama;
  opts.variant = Variant::builtin(rope);
  try {
    run_prefill(in, PrefillKV::kPaged, opts);
    ADD_FAILURE() << "a key-rotating variant with backend kWgmma: expected flashkv::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rewrites keys"), std::string::npos) << e.what();
  }
  AttentionVariant sigmoid;
  sigmoid.sigmoid = true;
  opts.variant = Variant::builtin(sigmoid);
  try {
    run_prefill(in, PrefillKV::kPaged, opts);
    ADD_FAILURE() << "sigmoid attention with backend kWgmma: expected flashkv::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no softmax"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashkv::test
