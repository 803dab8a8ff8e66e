// The sm_90 tuning policy (kernels/tuning/sm90.cuh) as pure functions: its rules give the shapes
// the kernels were measured with, and every place that states a default (shape functions, the
// auto decode shape, the kernel specs, the schedulers, the workspaces, the public configs) states
// the policy's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/decode/decode_shape.cuh"
#include "attention/prefill/prefill_shape.cuh"
#include "flashkv/decode.h"
#include "flashkv/prefill.h"
#include "ops/decode/decode_shape_choice.h"
#include "ops/decode/decode_workspace.h"
#include "ops/jit/kernel_specs.h"
#include "runtime/nvrtc_compiler.h"
#include "scheduler/cascade_cost.h"
#include "scheduler/decode_scheduler.h"
#include "scheduler/prefill_scheduler.h"
#include "tuning/policy.cuh"
#include "tuning/sm90.cuh"

namespace flashkv {
namespace {

using policy = tuning::Sm90;
// The shapes and defaults below are read through the hub: they are sm_90's where it picks sm_90.
static_assert(std::is_same_v<tuning::Policy, tuning::Sm90>);

// Everything is usable in constant expressions (the kernels read it at compile time).
static_assert(decode_tc_shape(128, 4).stages == 2 && prefill_hopper_shape(128).stages == 3);
static_assert(policy::decode_auto_ctas_per_sm(0, 1, true, 132) == policy::kDecodeOneCtaPerSm);

struct TCShape {
  int warps, threads, tile, stages, row_tiles, smem_bytes, min_ctas;
};

void expect_tc(const DecodeTCShape& s, const TCShape& e, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(s.warps, e.warps);
  EXPECT_EQ(s.threads, e.threads);
  EXPECT_EQ(s.tile, e.tile);
  EXPECT_EQ(s.stages, e.stages);
  EXPECT_EQ(s.row_tiles, e.row_tiles);
  EXPECT_EQ(s.smem_bytes, e.smem_bytes);
  EXPECT_EQ(s.min_ctas, e.min_ctas);
}

TEST(TuningPolicy, DecodeTensorCoreDefaultShapes) {
  // 2 CTAs of 4 warps per SM; one 32 KB K+V tile ahead at head_dim 128 (2 stages), two 16 KB
  // tiles at 64 (3 stages): 64 KB in flight per SM either way.
  expect_tc(decode_tc_shape(64, 4), {4, 128, 64, 3, 1, 51200, 2}, "d64 g4");
  expect_tc(decode_tc_shape(64, 32), {4, 128, 64, 3, 2, 53248, 2}, "d64 g32");
  expect_tc(decode_tc_shape(128, 4), {4, 128, 64, 2, 1, 69632, 2}, "d128 g4");
  expect_tc(decode_tc_shape(128, 16), {4, 128, 64, 2, 1, 69632, 2}, "d128 g16");
  // head_dim 256: 2 warps (the tensor-core kernel does not take it by default).
  expect_tc(decode_tc_shape(256, 1), {2, 64, 32, 2, 1, 73728, 2}, "d256 g1");
}

TEST(TuningPolicy, DecodeTensorCoreFp8Shapes) {
  // fp8 KV: half the bytes per stage, so the default depth keeps the f16 kernel's bytes in flight
  // (64 KB per SM at head_dim 128: 2 tiles of 16 KB ahead per CTA); the shared memory is Q plus the
  // larger of the pipeline and the cross-warp merge's staging.
  for (int d : {64, 128}) {
    SCOPED_TRACE(d);
    const DecodeTCShape f16 = decode_tc_shape(d, 4), f8 = decode_tc_shape(d, 4, 0, 0, 0, 1);
    EXPECT_EQ(f8.warps, f16.warps);
    EXPECT_EQ((f8.stages - 1) * 2 * f8.tile * d, (f16.stages - 1) * 2 * f16.tile * d * 2);
    const int pipeline = f8.stages * 2 * f8.tile * d;
    const int merge = f8.warps * 16 * f8.row_tiles * (d + 6) * 4;
    EXPECT_EQ(f8.smem_bytes, f8.row_tiles * 16 * d * 2 + std::max(pipeline, merge));
  }
  expect_tc(decode_tc_shape(128, 4, 0, 0, 0, 1), {4, 128, 64, 3, 1, 53248, 2}, "d128 g4 fp8");
  // Two forced stages of fp8 at head_dim 64: the merge staging (17.5 KB) outgrows the pipeline.
  expect_tc(decode_tc_shape(64, 4, 2, 0, 0, 1), {4, 128, 64, 2, 1, 2048 + 17920, 2},
            "d64 2 stages");
}

TEST(TuningPolicy, DecodeTensorCoreAutoShapes) {
  const DecodeTCTuning one = ops::kDecodeTCOneCta, small = ops::kDecodeTCSmallCtas;
  // One CTA of 8 warps: 132 KB at head_dim 128 (NOTES: more than sm_86/sm_89 allow per block).
  expect_tc(decode_tc_shape(128, 4, one.stages, one.warps, one.ctas),
            {8, 256, 128, 2, 1, 135168, 1}, "d128 one CTA");
  expect_tc(decode_tc_shape(64, 4, one.stages, one.warps, one.ctas), {8, 256, 128, 3, 1, 100352, 1},
            "d64 one CTA");
  // Four CTAs of 2 warps.
  expect_tc(decode_tc_shape(128, 4, small.stages, small.warps, small.ctas),
            {2, 64, 32, 2, 1, 36864, 4}, "d128 small CTAs");
  expect_tc(decode_tc_shape(64, 4, small.stages, small.warps, small.ctas),
            {2, 64, 32, 3, 1, 26624, 4}, "d64 small CTAs");
  // __launch_bounds__'s minimum CTAs: capped by shared memory (3 x 68 KB fit 227 KB) and at 1.
  EXPECT_EQ(decode_tc_shape(128, 4, 0, 4, 4).min_ctas, 3);
  EXPECT_EQ(decode_tc_shape(128, 1, 5, 8, 0).min_ctas, 1);
}

TEST(TuningPolicy, DecodeStagesKeepTheBytesInFlight) {
  EXPECT_EQ(policy::kDecodeBytesInFlightPerSm, 64 * 1024);
  // For every default or auto shape: (stages - 1) tiles ahead per CTA over the grid's CTAs reach
  // the bytes in flight, one stage fewer would not (or it is the minimum of 2 stages).
  for (int d : {64, 128}) {
    for (const auto& [warps, ctas] : {std::pair{0, 0}, {8, 1}, {2, 4}}) {
      const DecodeTCShape s = decode_tc_shape(d, 4, 0, warps, ctas);
      const int per_sm = ctas > 0 ? ctas : policy::kDecodeDefaultCtasPerSm;
      const int stage_kv_bytes = 2 * s.tile * d * 2;
      EXPECT_GE((s.stages - 1) * per_sm * stage_kv_bytes, policy::kDecodeBytesInFlightPerSm);
      EXPECT_TRUE(s.stages == 2 ||
                  (s.stages - 2) * per_sm * stage_kv_bytes < policy::kDecodeBytesInFlightPerSm);
    }
  }
  // The rule's clamp: 2 to 8 stages, the depths the kernel is built for.
  EXPECT_EQ(policy::decode_tc_default_stages(1 << 20, 4), 2);
  EXPECT_EQ(policy::decode_tc_default_stages(1024, 1), 8);
  EXPECT_EQ(policy::decode_tc_default_stages(16 * 1024, 1), 5);
  EXPECT_TRUE(decode_tc_shape_valid(policy::decode_tc_default_stages(1024, 1), 0));
  EXPECT_EQ(policy::decode_tc_default_warps(64), 4);
  EXPECT_EQ(policy::decode_tc_default_warps(128), 4);
  EXPECT_EQ(policy::decode_tc_default_warps(256), 2);
}

TEST(TuningPolicy, DecodeTensorCoreKernelTakesTheShapesItsAccumulatorsFit) {
  EXPECT_EQ(policy::kDecodeTCMaxAccumulatorRegs, 64);
  EXPECT_TRUE(decode_tc_supported(64, 32));
  EXPECT_FALSE(decode_tc_supported(64, 33));
  EXPECT_TRUE(decode_tc_supported(128, 16));
  EXPECT_FALSE(decode_tc_supported(128, 17));
  EXPECT_FALSE(decode_tc_supported(256, 1));
}

TEST(TuningPolicy, DecodeCudaCoreShape) {
  // 128 threads, 4 stages of 8 KB of K (and of V): 64 KB of shared memory at every head_dim.
  for (int d : {64, 128, 256}) {
    for (int kv_bytes : {1, 2}) {
      const DecodeCudaCoreShape s = decode_cuda_core_shape(d, kv_bytes);
      EXPECT_EQ(s.threads, 128);
      EXPECT_EQ(s.stages, 4);
      EXPECT_EQ(s.tile, 4096 / d * (2 / kv_bytes));
      EXPECT_EQ(s.tile * d * kv_bytes, 8192);
      EXPECT_EQ(s.smem_bytes, 65536);
    }
  }
  EXPECT_EQ(decode_cuda_core_shape(128, 2).tile, 32);
  EXPECT_EQ(decode_cuda_core_shape(256, 2).tile, 16);
  EXPECT_EQ(policy::kDecodeCudaCoreCtasPerSm, 2);
}

TEST(TuningPolicy, DecodeAutoCtasPerSmThresholds) {
  constexpr int sms = 132;
  const long long small_from = 896LL * sms * 4;  // tokens at which 4 small CTAs per SM win
  EXPECT_EQ(policy::kDecodeSmallCtaMinTokens, 896);
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(small_from, 1000, false, sms), 4);
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(small_from - 1, 1000, false, sms), 2);
  // Plenty of tokens wins over equal lengths in fewer pairs than 7/8 of the SMs (MHA D4: 32)...
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(small_from, 32, true, sms), 4);
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(small_from, 115, true, sms), 4);
  // ... but equal pairs filling the SMs stream whole, one per CTA (16 x 4096 GQA: 128 pairs).
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(small_from, 116, true, sms), 1);
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(small_from, 128, true, sms), 1);
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(small_from, 128, false, sms), 4);
  // Equal lengths in at most one pair per SM: one CTA.
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(16 * 1024 * 8, 128, true, sms), 1);
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(16 * 1024 * 8, sms, true, sms), 1);
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(16 * 1024 * 8, sms + 1, true, sms), 2);
  EXPECT_EQ(policy::decode_auto_ctas_per_sm(16 * 1024 * 8, 128, false, sms), 2);
  // Warps keep ~8 per SM; 0 is decode_shape.cuh's default.
  EXPECT_EQ(policy::decode_auto_warps(128, 1), 8);
  EXPECT_EQ(policy::decode_auto_warps(128, 2), 0);
  EXPECT_EQ(policy::decode_auto_warps(128, 3), 2);
  EXPECT_EQ(policy::decode_auto_warps(64, 4), 2);
  EXPECT_EQ(policy::decode_auto_warps(256, 1), 0);
  EXPECT_EQ(policy::decode_auto_warps(256, 4), 0);
  EXPECT_EQ(policy::kDecodeAutoMaxCtasPerSm, 4);
}

TEST(TuningPolicy, DecodeAutoShapeAndItsConsumersUseThePolicy) {
  EXPECT_EQ(ops::kDecodeSmallCtaMinTokens, policy::kDecodeSmallCtaMinTokens);
  EXPECT_EQ(ops::kDecodeTCSmallCtas, (DecodeTCTuning{0, 2, 4}));
  EXPECT_EQ(ops::kDecodeTCOneCta, (DecodeTCTuning{0, 8, 1}));
  EXPECT_EQ(ops::DecodeWorkspace::kAutoCtasPerSm, policy::kDecodeAutoMaxCtasPerSm);
  EXPECT_EQ(ops::DecodeShapeChoice{}.ctas_per_sm, policy::kDecodeDefaultCtasPerSm);
  EXPECT_EQ(ops::DecodeShapeInputs{}.max_smem_bytes, policy::kSmemPerBlockBytes);
  // choose_decode_shape applies the pure rules: the benchmark's D1 (GQA) gets one CTA, D6 four.
  const std::vector<int64_t> d1(16, 1024), d6(256, 2048);
  ops::DecodeShapeInputs in;
  in.sms = 132;
  in.num_kv_heads = 8;
  in.group = 4;
  in.kv_lens = d1;
  EXPECT_EQ(ops::choose_decode_shape(in).ctas_per_sm,
            policy::decode_auto_ctas_per_sm(16 * 1024 * 8, 16 * 8, true, 132));
  in.kv_lens = d6;
  EXPECT_EQ(ops::choose_decode_shape(in).ctas_per_sm,
            policy::decode_auto_ctas_per_sm(256LL * 2048 * 8, 256 * 8, true, 132));
}

struct PfShape {
  int row_tiles, warps_q, warps_kv, threads, tile, stages, smem_bytes;
};

void expect_pf(const PrefillShape& s, const PfShape& e, int d, int rows) {
  SCOPED_TRACE(testing::Message() << "head_dim " << d << ", rows " << rows);
  EXPECT_EQ(s.row_tiles, e.row_tiles);
  EXPECT_EQ(s.warp_rows, 16 * e.row_tiles);
  EXPECT_EQ(s.warps_q, e.warps_q);
  EXPECT_EQ(s.warps_kv, e.warps_kv);
  EXPECT_EQ(s.warps, e.warps_q * e.warps_kv);
  EXPECT_EQ(s.threads, e.threads);
  EXPECT_EQ(s.tile, e.tile);
  EXPECT_EQ(s.stages, e.stages);
  EXPECT_EQ(s.q_bytes, rows * d * 2);
  EXPECT_EQ(s.stage_bytes, e.tile * d * 2);
  EXPECT_EQ(s.smem_bytes, e.smem_bytes);
  EXPECT_EQ(s.q_buffers, 1);
}

TEST(TuningPolicy, PrefillMmaSyncShapes) {
  const struct {
    int d, rows;
    PfShape e;
  } cases[] = {
      {64, 16, {1, 1, 4, 128, 64, 4, 67584}},   {64, 32, {1, 2, 2, 128, 64, 4, 69632}},
      {64, 64, {1, 4, 1, 128, 64, 4, 73728}},   {64, 128, {2, 4, 1, 128, 64, 4, 81920}},
      {128, 16, {1, 1, 4, 128, 64, 3, 102400}}, {128, 32, {1, 2, 2, 128, 64, 3, 106496}},
      {128, 64, {1, 4, 1, 128, 64, 3, 114688}}, {128, 128, {2, 4, 1, 128, 64, 2, 98304}},
      {256, 16, {1, 1, 4, 128, 64, 2, 139264}}, {256, 32, {1, 2, 2, 128, 32, 3, 114688}},
      {256, 64, {1, 4, 1, 128, 32, 2, 98304}},  {256, 128, {1, 8, 1, 256, 32, 4, 196608}},
  };
  for (const auto& c : cases) expect_pf(prefill_shape(c.d, c.rows), c.e, c.d, c.rows);
  // The pipeline's budget: two CTAs per SM, so a 4-warp CTA deeper than 2 stages keeps its query
  // tile and KV stages within 112 KB (2 is the floor; the 8-warp CTA runs alone and takes 4).
  EXPECT_LE(int{policy::kPrefillCtasPerSm} * policy::kPrefillSmemBudgetPerCta,
            policy::kSmemPerSmBytes);
  for (int d : {64, 128, 256})
    for (int rows : {16, 32, 64, 128}) {
      const PrefillShape s = prefill_shape(d, rows);
      if (s.threads < 256 && s.stages > 2) {
        EXPECT_LE(s.q_bytes + 2 * s.stages * s.stage_bytes, policy::kPrefillSmemBudgetPerCta)
            << d << " " << rows;
      }
    }
  EXPECT_EQ(policy::prefill_stages(0, 8192, 128), 4);
  EXPECT_EQ(policy::prefill_stages(32768, 16384, 128), 2);
  EXPECT_EQ(policy::prefill_stages(65536, 16384, 256), 4);
}

TEST(TuningPolicy, PrefillHopperFp8Shapes) {
  // fp8 KV: 16-bit stages plus staging slots of fp8 K + V (4, 3 at head_dim 256); at head_dim
  // 128 and 256 the tile is shorter than the f16 kernel's so that they fit (64 and 32 tokens;
  // at 256 with 4 stages, the f16 kernel's 3 being of 64 tokens).
  const struct {
    int d, tile, stages, slots, smem;
  } cases[] = {{64, 128, 4, 4, 214016}, {128, 64, 3, 4, 214016}, {256, 32, 4, 3, 230400}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.d);
    const PrefillShape s = prefill_hopper_shape(c.d, 1), f16 = prefill_hopper_shape(c.d);
    EXPECT_EQ(s.tile, c.tile);
    EXPECT_EQ(s.stages, c.stages);
    EXPECT_EQ(s.stage_bytes, c.tile * c.d * 2);
    EXPECT_EQ(s.staging_slots, c.slots);
    EXPECT_EQ(s.staging_bytes, c.slots * 2 * c.tile * c.d);
    EXPECT_EQ(s.smem_bytes, c.smem);
    EXPECT_LE(s.smem_bytes + 1024, policy::kSmemPerBlockBytes);
    EXPECT_EQ(f16.staging_bytes, 0);
  }
  // The mma.sync kernel: fp8 stages are half the bytes, so more of them fit.
  EXPECT_GT(prefill_shape(128, 128, 1).stages, prefill_shape(128, 128).stages);
}

TEST(TuningPolicy, PrefillHopperShapes) {
  // {tile, stages, q_buffers, smem}: 128-token KV tiles at head_dim <= 128, 64 at 256; K one
  // stage fewer than V; two query buffers where they fit.
  const struct {
    int d, tile, stages, q_buffers, smem;
  } cases[] = {{64, 128, 4, 2, 148480}, {128, 128, 3, 2, 230400}, {256, 64, 3, 1, 230400}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.d);
    const PrefillShape s = prefill_hopper_shape(c.d);
    EXPECT_EQ(s.threads, 256);
    EXPECT_EQ(s.tile, c.tile);
    EXPECT_EQ(s.stages, c.stages);
    EXPECT_EQ(s.q_buffers, c.q_buffers);
    EXPECT_EQ(s.smem_bytes, c.smem);
    EXPECT_EQ(s.smem_bytes,
              1024 + c.q_buffers * 128 * c.d * 2 + (2 * c.stages - 1) * c.tile * c.d * 2);
    EXPECT_LE(s.smem_bytes + 1024, policy::kSmemPerBlockBytes);  // + the static split-merge flag
  }
}

TEST(TuningPolicy, SchedulerDefaultsAreThePolicys) {
  const scheduler::CostModel decode_cost;
  EXPECT_EQ(decode_cost.alpha, 64.0);
  EXPECT_EQ(decode_cost.alpha, double{policy::kDecodeWorkItemCostTokens});
  EXPECT_EQ(decode_cost.beta, double{policy::kDecodeTokenCost});
  const scheduler::DecodeScheduleOptions decode;
  EXPECT_EQ(decode.min_chunk_tokens, 128);
  EXPECT_EQ(decode.min_chunk_tokens, policy::kDecodeMinChunkTokens);
  EXPECT_EQ(decode.balance_chunk_bound, bool{policy::kDecodeBalanceChunkBound});
  EXPECT_EQ(decode.cost.alpha, double{policy::kDecodeWorkItemCostTokens});
  // The scheduler struct balances the tail by default (its tests and direct callers); BatchDecode
  // states the policy's choice, off (open question 5 in the policy).
  EXPECT_TRUE(decode.balance_tail);

  const scheduler::PrefillCostModel prefill_cost;
  EXPECT_EQ(prefill_cost.alpha, double{policy::kPrefillRowCost});
  EXPECT_EQ(prefill_cost.beta, double{policy::kPrefillTokenCost});
  const scheduler::PrefillScheduleOptions prefill;
  EXPECT_EQ(prefill.min_chunk_tokens, policy::kPrefillMinChunkTokens);
  EXPECT_EQ(prefill.cost.alpha, double{policy::kPrefillRowCost});

  // The cascade model's mirrors of the grids.
  const scheduler::CascadeCostModel cascade;
  EXPECT_EQ(cascade.num_sms, 132);
  EXPECT_EQ(cascade.decode_ctas, 264);
  EXPECT_EQ(cascade.prefix_ctas_per_sm, policy::kPrefillCtasPerSm);
}

TEST(TuningPolicy, PublicDefaultsAreThePolicys) {
  // include/flashkv may not include kernels/: the literals there must equal the policy.
  EXPECT_EQ(BatchPrefillConfig{}.ctas_per_sm, policy::kPrefillCtasPerSm);
  const DecodePlanOptions o;
  EXPECT_EQ(o.balance_chunk_bound, bool{policy::kDecodeBalanceChunkBound});
  EXPECT_EQ(o.balance_tail, bool{policy::kDecodeBalanceTail});
  EXPECT_EQ(BatchDecodeConfig{}.ctas_per_sm, 0);  // auto: the rules above
}

TEST(TuningPolicy, NvrtcEmitsNothingForThePolicy) {
  // The kernels include the policy; its knobs are enumerators and constexpr functions because a
  // constexpr variable would be a __device__ global in every module (a symbol, moving the
  // kernels' symbol indices and constant-bank offsets). A probe kernel that reads knobs and rules
  // must have no symbol of namespace flashkv::tuning ("6tuning" in the mangled names).
  runtime::CompileRequest req;
  req.key_name = "policy_probe";
  req.source =
      "#include \"tuning/policy.cuh\"\n"
      "using p = flashkv::tuning::Policy;\n"
      "__global__ void policy_probe(int* o) {\n"
      "  constexpr int w = p::decode_auto_warps(128, p::kDecodeOneCtaPerSm);\n"
      "  constexpr int s = p::prefill_stages(0, 8192, 128) + p::prefill_hopper_kv_tile(128);\n"
      "  o[threadIdx.x] = w + s + p::kDecodeBytesInFlightPerSm + int{p::kDecodeBalanceTail};\n"
      "}\n";
  req.name_expressions = {"policy_probe"};
  req.arch = "sm_90a";
  const runtime::CompiledKernels k = runtime::nvrtc_compile(req);
  const std::string cubin(k.cubin.begin(), k.cubin.end());
  EXPECT_FALSE(cubin.empty());
  EXPECT_EQ(cubin.find("6tuning"), std::string::npos);
}

}  // namespace
}  // namespace flashkv
