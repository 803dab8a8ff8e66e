// The self-sizing workspace on the GPU: decode, paged and ragged prefill and the cascade in the
// buffers FlashInfer users pass (32 MB decode, 16 MB prefill and cascade in FlashInfer's tests)
// and in buffers with room for a few partial states, against the reference; the plan says how many
// splits it chose and whether the buffer limited them; a buffer below the plan arrays is refused,
// naming the least it needs. CUDA-graph replays in a small buffer: test_decode_graph_gpu.cpp
// (CapturedRunReplaysInASmallWorkspace) and python/tests/test_gpu_workspace.py.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/gpu_util.h"
#include "common/test_util.h"
#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/prefill.h"
#include "gpu/decode_case.h"
#include "gpu/prefill_case.h"

namespace flashkv::test {
namespace {

constexpr size_t kMB = size_t{1} << 20;

class WorkspaceFitGpu : public GpuTest {};

BatchDecodeConfig decode_cfg(const DecodeCase& c) {
  BatchDecodeConfig cfg;
  cfg.max_batch = static_cast<int>(c.kv_lens.size());
  cfg.num_qo_heads = c.num_qo_heads;
  cfg.head_dim = c.head_dim;
  return cfg;
}

// The issue's case: batch 17, 32 query heads, head_dim 256 (36312160 bytes asked, 32 MB refused).
TEST_F(WorkspaceFitGpu, DecodeIssueCaseRunsInFlashInferBuffers) {
  std::mt19937_64 rng(17);
  for (int hk : {32, 8}) {
    for (size_t bytes : {32 * kMB, 16 * kMB}) {
      DecodeCase c;
      for (int i = 0; i < 16; ++i) c.kv_lens.push_back(1 + static_cast<int64_t>(rng() % 3000));
      c.kv_lens.push_back(20000);
      c.num_qo_heads = 32;
      c.num_kv_heads = hk;
      c.head_dim = 256;
      c.workspace_bytes = bytes;
      SCOPED_TRACE(c.str() + ", " + std::to_string(bytes >> 20) + " MB");
      ASSERT_GT(BatchDecode::workspace_bytes(decode_cfg(c)), 32 * kMB);
      const DecodeOutcome o = run_decode_case(c);
      expect_decode_ok(c, o);
      EXPECT_GT(o.plan.num_split_tiles, 0);
      EXPECT_LE(o.plan.num_partial_states, o.plan.slot_capacity);
    }
  }
}

// A buffer with room for a handful of partial-state rows past the plan arrays: fewer, longer
// chunks (split_limited), the same answer; and at exactly the minimum, no split at all.
TEST_F(WorkspaceFitGpu, DecodeInBuffersTooSmallToSplitFreely) {
  struct Shape {
    int hq, hk, d, page;
    DType dt;
    KVLayout layout;
  };
  for (const Shape& sh : {Shape{32, 32, 64, 16, DType::f16, KVLayout::NHD},
                          Shape{32, 8, 128, 1, DType::bf16, KVLayout::HND},
                          Shape{32, 2, 128, 64, DType::f16, KVLayout::NHD},
                          Shape{16, 1, 128, 16, DType::bf16, KVLayout::NHD},
                          Shape{8, 1, 256, 16, DType::f16, KVLayout::HND}}) {
    for (int extra_rows : {0, 24}) {
      DecodeCase c;
      c.kv_lens = {12000, 1, 0, 700, 5000, 33};
      c.num_qo_heads = sh.hq;
      c.num_kv_heads = sh.hk;
      c.head_dim = sh.d;
      c.page_size = sh.page;
      c.dtype = sh.dt;
      c.layout = sh.layout;
      c.workspace_bytes =
          BatchDecode::min_workspace_bytes(decode_cfg(c)) + extra_rows * (sh.d + 1) * 4;
      SCOPED_TRACE(c.str() + ", room for " + std::to_string(extra_rows) + " rows");
      const DecodeOutcome o = run_decode_case(c);
      expect_decode_ok(c, o);
      EXPECT_TRUE(o.plan.split_limited);
      EXPECT_LE(o.plan.num_partial_states, o.plan.slot_capacity);
      if (extra_rows == 0) {
        EXPECT_EQ(o.plan.slot_capacity, 0);
        EXPECT_EQ(o.plan.num_split_tiles, 0);
      }
    }
  }
}

TEST_F(WorkspaceFitGpu, DecodeBelowThePlanArraysIsRefusedNamingTheMinimum) {
  BatchDecodeConfig cfg;
  cfg.max_batch = 64;
  const size_t least = BatchDecode::min_workspace_bytes(cfg);
  EXPECT_LT(least, BatchDecode::workspace_bytes(cfg));
  DeviceBuffer ws(least);
  const std::string msg = error_of([&] { BatchDecode dec(cfg, ws.data(), least - 16); });
  EXPECT_NE(msg.find("workspace: expected at least " + std::to_string(least)), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("min_workspace_bytes"), std::string::npos) << msg;
  BatchDecode ok(cfg, ws.data(), least);  // exactly the minimum is enough
}

// fixed_split_size cannot give way to a small buffer (batch invariance): plan() refuses, naming
// the bytes a workspace needs for it.
TEST_F(WorkspaceFitGpu, DecodeFixedSplitThatDoesNotFitNamesTheBytes) {
  BatchDecodeConfig cfg;
  cfg.max_batch = 4;
  cfg.num_qo_heads = 32;
  const size_t bytes = BatchDecode::min_workspace_bytes(cfg) + 64 * 1024;
  DeviceBuffer ws(bytes);
  BatchDecode dec(cfg, ws.data(), bytes);
  const std::vector<int32_t> indptr{0, 625, 1250}, last{16, 16};
  DecodePlanOptions o;
  o.fixed_split_size = 256;  // 10000 tokens: 40 chunks x 8 heads x 2 requests
  const std::string msg = error_of([&] {
    dec.plan({.kv_indptr = indptr.data(),
              .kv_last_page_len = last.data(),
              .batch_size = 2,
              .page_size = 16},
             {.num_qo_heads = 32,
              .num_kv_heads = 8,
              .head_dim = 128,
              .q_dtype = DType::f16,
              .kv_dtype = DType::f16,
              .o_dtype = DType::f16},
             o);
  });
  EXPECT_NE(msg.find("fixed_split_size = 256"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a workspace of"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_kv_tokens = 20000"), std::string::npos) << msg;
}

// The issue's prefill case: 12 query tokens (batch 1, 8 query heads, head_dim 128) asked for
// 34899136 bytes and 16 MB was refused; and longer prompts in 16 MB and at the minimum.
TEST_F(WorkspaceFitGpu, PrefillRunsInSixteenMegabytes) {
  struct Run {
    std::vector<int64_t> qo, kv;
    int hq, hk;
    bool causal;
  };
  for (const Run& r :
       {Run{{12}, {3000}, 8, 2, true}, Run{{12}, {12}, 8, 8, false},
        Run{{200, 7}, {20000, 9000}, 16, 4, true}, Run{{1, 64}, {60000, 64}, 16, 4, true}}) {
    PrefillCase c;
    c.qo_lens = r.qo;
    c.kv_lens = r.kv;
    c.num_qo_heads = r.hq;
    c.num_kv_heads = r.hk;
    c.opts.causal = r.causal;
    PrefillInputs in = make_prefill_inputs(c);  // the reference once, for every run below
    const BatchPrefillConfig cfg =
        prefill_config(c.batch(), std::max<int64_t>(1, c.nnz_qo()), c.num_qo_heads, c.head_dim);
    for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
      for (bool minimum : {false, true}) {
        in.c.workspace_bytes = minimum ? BatchPrefillPaged::min_workspace_bytes(cfg) : 16 * kMB;
        SCOPED_TRACE(c.str() + " " + prefill_kv_name(kv) + (minimum ? ", minimum" : ", 16 MB"));
        const PrefillOutcome o = run_prefill(in, kv, c.opts);
        expect_prefill_ok(in, o);
        EXPECT_LE(o.plan.num_partial_states, o.plan.slot_capacity);
        if (minimum) {
          EXPECT_EQ(o.plan.slot_capacity, 0);
          EXPECT_EQ(o.plan.num_split_tiles, 0);
        }
      }
    }
  }
}

TEST_F(WorkspaceFitGpu, PrefillBelowThePlanArraysIsRefusedNamingTheMinimum) {
  const BatchPrefillConfig cfg = prefill_config(4, 1024, 32, 128);
  const size_t least = BatchPrefillRagged::min_workspace_bytes(cfg);
  DeviceBuffer ws(least);
  const std::string msg = error_of([&] { BatchPrefillRagged p(cfg, ws.data(), least - 16); });
  EXPECT_NE(msg.find("expected at least " + std::to_string(least)), std::string::npos) << msg;
}

}  // namespace
}  // namespace flashkv::test
