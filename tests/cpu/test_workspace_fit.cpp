// The self-sizing workspace (the FlashInfer paper's: one caller's buffer, whatever its size, and
// the planner fits split-KV into it). The workspace layouts at FlashInfer's customary buffer sizes
// (32 MB for decode, 16 MB for prefill and cascade in its tests, 128 MB in engines) on an H200's
// 132 SMs, and the decode scheduler's fitting of its chunks to the slots there are. The GPU side
// (plans in such buffers against the reference, CUDA graphs included) is tests/gpu/
// test_workspace_fit_gpu.cpp and python/tests/test_gpu_workspace.py.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "decode_scheduler_test_util.h"
#include "ops/decode/decode_workspace.h"
#include "ops/prefill/prefill_workspace.h"
#include "scheduler/decode_scheduler.h"

namespace flashkv {
namespace {

constexpr int kH200Sms = 132;
constexpr size_t kMB = size_t{1} << 20;

BatchDecodeConfig decode_cfg(int max_batch, int num_qo_heads, int head_dim) {
  BatchDecodeConfig c;
  c.max_batch = max_batch;
  c.num_qo_heads = num_qo_heads;
  c.head_dim = head_dim;
  return c;
}

BatchPrefillConfig prefill_cfg(int max_batch, int64_t max_qo_tokens, int num_qo_heads,
                               int head_dim) {
  BatchPrefillConfig c;
  c.max_batch = max_batch;
  c.max_qo_tokens = max_qo_tokens;
  c.num_qo_heads = num_qo_heads;
  c.head_dim = head_dim;
  return c;
}

template <class Sizes>
void expect_fits(const Sizes& s, size_t bytes) {
  EXPECT_LE(s.total, bytes);
  EXPECT_LE(s.states.lse_offset + s.partial_rows * sizeof(float), s.states.o_offset);
  EXPECT_LE(s.states.o_offset, s.states.arrivals_offset);
  EXPECT_LE(s.min_total, s.total);
  EXPECT_LE(s.total, s.full_total);
}

// The issue's decode case: batch 17, 32 query heads, head_dim 256 needed 36312160 bytes and was
// refused in FlashInfer's 32 MB. Its plan arrays need far less; the rest holds partial states.
TEST(DecodeWorkspaceFit, FlashInferBuffersHoldTheIssueCase) {
  const BatchDecodeConfig cfg = decode_cfg(17, 32, 256);
  using W = ops::DecodeWorkspace;
  const W::Sizes full = W::layout_for(cfg, kH200Sms, SIZE_MAX);
  EXPECT_EQ(full.total, full.full_total);
  EXPECT_EQ(full.partial_rows, 2u * kH200Sms * W::kAutoCtasPerSm * 32);
  EXPECT_GT(full.total, 32 * kMB) << "the issue's case: more than FlashInfer's 32 MB";
  EXPECT_LT(full.min_total, 1 * kMB) << "the plan arrays of 17 requests are small";
  for (size_t bytes : {32 * kMB, 16 * kMB, 4 * kMB, full.min_total}) {
    SCOPED_TRACE(bytes);
    const W::Sizes s = W::layout_for(cfg, kH200Sms, bytes);
    expect_fits(s, bytes);
    EXPECT_LT(s.partial_rows, full.partial_rows);
    // The most rows that fit: one more would not (each costs (D + 1) floats, a work item and
    // some alignment).
    EXPECT_GT(s.total + (cfg.head_dim + 1) * sizeof(float) + 256, bytes);
    // The work items cover every slot the rows hold plus one per unsplit tile.
    EXPECT_EQ(s.max_work_items, 17 * 32 + static_cast<int>(s.partial_rows));
  }
  EXPECT_EQ(W::layout_for(cfg, kH200Sms, full.min_total).partial_rows, 0u);
}

TEST(DecodeWorkspaceFit, RowsGrowWithTheBufferUpToTheFullSize) {
  using W = ops::DecodeWorkspace;
  for (int hd : {64, 128, 256}) {
    for (int heads : {8, 32, 64}) {
      const BatchDecodeConfig cfg = decode_cfg(256, heads, hd);
      const W::Sizes full = W::layout_for(cfg, kH200Sms, SIZE_MAX);
      size_t last_rows = 0;
      for (size_t bytes = full.min_total; bytes < full.total;
           bytes += (full.total - full.min_total) / 7 + 1) {
        const W::Sizes s = W::layout_for(cfg, kH200Sms, bytes);
        expect_fits(s, bytes);
        EXPECT_GE(s.partial_rows, last_rows);
        last_rows = s.partial_rows;
      }
      // 128 MB (engines' usual buffer) never limits splitting for these configs.
      const W::Sizes big = W::layout_for(cfg, kH200Sms, 128 * kMB);
      EXPECT_EQ(big.partial_rows, full.partial_rows) << "head_dim " << hd << ", heads " << heads;
    }
  }
}

// The issue's prefill case: 12 query tokens (batch 1, 8 query heads, head_dim 128) needed
// 34899136 bytes (2 x 264 CTAs x 128 rows, the largest tile) and was refused in 16 MB. Its plan
// arrays are small, and its 16-row query tiles need an eighth of those rows.
TEST(PrefillWorkspaceFit, TwelveTokensFitSixteenMegabytes) {
  using W = ops::PrefillWorkspace;
  const BatchPrefillConfig cfg = prefill_cfg(1, 12, 8, 128);
  const W::Sizes full = W::layout_for(cfg, kH200Sms, SIZE_MAX);
  EXPECT_GT(full.full_total, 16 * kMB);
  const W::Sizes s = W::layout_for(cfg, kH200Sms, 16 * kMB);
  expect_fits(s, 16 * kMB);
  EXPECT_GT(s.total + (cfg.head_dim + 1) * sizeof(float) + 256, 16 * kMB);
  // 2 slots per CTA of 16-row tiles (what a 12-token plan takes at GQA groups up to 16): the
  // partial states never limit such a plan's splitting.
  const int ctas = kH200Sms * cfg.ctas_per_sm;
  EXPECT_GE(s.partial_rows / 16, static_cast<size_t>(scheduler::max_split_slots(ctas)));
  EXPECT_LT(W::layout_for(cfg, kH200Sms, SIZE_MAX).min_total, 1 * kMB);
  EXPECT_EQ(W::layout_for(cfg, kH200Sms, full.min_total).partial_rows, 0u);
}

TEST(PrefillWorkspaceFit, RowsGrowWithTheBufferUpToTheFullSize) {
  using W = ops::PrefillWorkspace;
  for (int64_t tokens : {16, 4096, 32768}) {
    const BatchPrefillConfig cfg = prefill_cfg(64, tokens, 32, 128);
    const W::Sizes full = W::layout_for(cfg, kH200Sms, SIZE_MAX);
    size_t last_rows = 0;
    for (size_t bytes = full.min_total; bytes < full.total;
         bytes += (full.total - full.min_total) / 5 + 1) {
      const W::Sizes s = W::layout_for(cfg, kH200Sms, bytes);
      expect_fits(s, bytes);
      EXPECT_GE(s.partial_rows, last_rows);
      last_rows = s.partial_rows;
      // Merge items: every split tile owns >= 2 slots of >= 16 rows.
      EXPECT_GE(static_cast<size_t>(s.max_merge_items), s.partial_rows / 32);
    }
  }
}

}  // namespace

namespace scheduler {
namespace {
using namespace sched_test;

// Dynamic splitting fits the slots it is given: never more, the unconstrained schedule wherever
// that fits, and the shortest chunk bound that fits where it does not.
TEST(DecodeSchedulerFit, DynamicSplittingFitsTheSlotsItIsGiven) {
  std::mt19937_64 rng(99);
  int limited = 0;
  for (int t = 0; t < 40; ++t) {
    std::vector<int64_t> lens;
    for (size_t i = 0, n = 1 + rng() % 40; i < n; ++i)
      lens.push_back(static_cast<int64_t>(rng() % 70000));
    const int heads = 1 + static_cast<int>(rng() % 8);
    DecodeScheduleOptions o = bounded_options(t % 2 == 0 ? 264 : 528, heads, lens.size());
    o.balance_tail = t % 3 == 0;
    const DecodeSchedule full = plan_decode(lens, o);
    for (int cap : {0, 1, heads, full.num_slots / 2, full.num_slots - 1, full.num_slots}) {
      if (cap < 0) continue;
      SCOPED_TRACE("case " + std::to_string(t) + ", max_slots " + std::to_string(cap) + " of " +
                   std::to_string(full.num_slots));
      DecodeScheduleOptions small = o;
      small.max_slots = cap;
      const DecodeSchedule s = plan_decode(lens, small);
      expect_valid(lens, small, s);
      EXPECT_LE(s.num_slots, cap);
      if (full.num_slots <= cap) {
        EXPECT_FALSE(s.slot_limited);
        expect_same(s, full);
        continue;
      }
      ++limited;
      EXPECT_TRUE(s.slot_limited);
      EXPECT_GT(s.chunk_bound, full.chunk_bound);
      // The shortest bound that fits: a token less needs more slots than there are.
      int64_t slots = 0;
      for (int64_t l : lens) slots += l > s.chunk_bound - 1 ? ceil_div(l, s.chunk_bound - 1) : 0;
      if (s.chunk_bound - 1 >= full.chunk_bound) EXPECT_GT(slots * heads, cap);
    }
  }
  EXPECT_GT(limited, 20) << "the cases must exercise the fitting";
}

// fixed_split_size cannot give way (its chunks are the batch-invariance contract): it throws,
// naming the slots it needs.
TEST(DecodeSchedulerFit, FixedSplitSizeStillThrowsWhenSlotsAreShort) {
  const std::vector<int64_t> lens(4, 10000);
  DecodeScheduleOptions o = bounded_options(264, 8, lens.size());
  o.fixed_split_size = 1000;
  o.max_slots = 100;  // needs 4 x 10 x 8 = 320
  const std::string msg = test::error_of([&] { plan_decode(lens, o); });
  EXPECT_NE(msg.find("320 partial-state slots"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_slots = 100"), std::string::npos) << msg;
}

}  // namespace
}  // namespace scheduler
}  // namespace flashkv
