// Tests of the decode scheduler's tail balancing (DecodeScheduleOptions::balance_tail,
// src/scheduler/decode_tail_balance.cpp): the last round cut over the least-loaded units.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/test_util.h"
#include "decode_scheduler_test_util.h"
#include "flashkv/error.h"
#include "scheduler/decode_scheduler.h"

namespace flashkv::scheduler {
namespace {

using namespace sched_test;

double makespan(const DecodeSchedule& s) {
  return *std::max_element(s.cta_cost.begin(), s.cta_cost.end());
}
double mean_load(const DecodeSchedule& s) {
  double t = 0;
  for (double c : s.cta_cost) t += c;
  return t / static_cast<double>(s.cta_cost.size());
}
// Tail balancing's makespan bound where its room for cuts does not run out (decode_scheduler.cpp,
// "Tail balancing"): A + 2 alpha + beta (2 min_chunk + 1), A the plain schedule's mean load.
double tail_bound(const DecodeScheduleOptions& o, const DecodeSchedule& plain) {
  return mean_load(plain) + 2 * o.cost.alpha + o.cost.beta * (2.0 * o.min_chunk_tokens + 1);
}

// Benchmark D6 (256 x 2048, 8 KV heads, 264 CTAs = 33 blocks): the plain greedy gives 25 blocks
// 8 tiles and 8 blocks 7 (makespan 8 tiles, mean 7.76); D5 (64 x 4096): 31 blocks 2 tiles, 2
// blocks 1. Tail balancing keeps 7 (D6) / 1 (D5) whole tiles per block and cuts the rest to
// fill every block to about the mean.
TEST(DecodeSchedulerTail, BalancesTheLastRoundOfEqualTiles) {
  struct Case {
    const char* name;
    int64_t len;
    size_t batch;
    int heads;
  };
  for (const Case& c :
       {Case{"D6", 2048, 256, 8}, Case{"D5", 4096, 64, 8},
        Case{"2048 x 2048, 1 head", 2048, 2048, 1}, Case{"128 x 4096, 4 heads", 4096, 128, 4}}) {
    SCOPED_TRACE(c.name);
    const std::vector<int64_t> lens(c.batch, c.len);
    DecodeScheduleOptions o = bounded_options(264, c.heads, lens.size());
    const DecodeSchedule s = plan_decode(lens, o);
    expect_valid(lens, o, s);
    o.balance_tail = false;
    const DecodeSchedule plain = plan_decode(lens, o);
    expect_valid(lens, o, plain);
    EXPECT_LT(makespan(s), makespan(plain));
    EXPECT_LE(makespan(s), tail_bound(o, plain));
    // Whole tiles in the full rounds: every unit runs floor(mean / tile) uncut tiles.
    const double tile = o.cost.cost(1, c.len);
    const int full_rounds = static_cast<int>(mean_load(plain) / tile);
    for (int u = 0; u < s.num_units; ++u) {
      int whole = 0;
      for (int i = s.unit_work_indptr[u]; i < s.unit_work_indptr[u + 1]; ++i) {
        whole += s.work[i].kv_end - s.work[i].kv_start == c.len;
      }
      EXPECT_GE(whole, full_rounds) << "unit " << u;
    }
  }
  // D6 exactly: 33 blocks, the mean 16384, the plain makespan 8 x 2112 = 16896.
  const std::vector<int64_t> d6(256, 2048);
  const DecodeScheduleOptions o = bounded_options(264, 8, d6.size());
  const DecodeSchedule s = plan_decode(d6, o);
  EXPECT_EQ(s.ctas_per_unit, 8);
  EXPECT_LE(makespan(s), 16384 + 2 * 64 + 257);
}

// Random batches: never worse than the plain greedy (expect_valid), within the stated bound of
// the mean where the tail applies and had room, and within the workspace bounds (the capacities
// are the bounds: a schedule breaking them throws).
TEST(DecodeSchedulerTail, RandomBatchesStayValidAndNearTheMean) {
  std::mt19937_64 rng(123);
  int applied = 0;
  for (int t = 0; t < 200; ++t) {
    const int heads = t % 4 == 0 ? 1 : 2 << (rng() % 4);
    const int ctas = heads * (4 + static_cast<int>(rng() % (528 / heads - 3)));
    std::vector<int64_t> lens(1 + rng() % 600);
    const int64_t base = 64 + static_cast<int64_t>(rng() % 8192);
    const int64_t spread = 1 + static_cast<int64_t>(rng() % (t % 3 == 0 ? 4096 : 64));
    for (int64_t& l : lens) l = base + static_cast<int64_t>(rng() % spread);
    if (t % 5 == 4) lens = random_lens(rng, lens.size(), 131072);
    DecodeScheduleOptions o = bounded_options(ctas, heads, lens.size());
    if (t % 7 == 3) o.min_chunk_tokens = 16 + static_cast<int>(rng() % 512);
    if (t % 11 == 5) o.cost = {2.5, 0.75};
    if (t % 13 == 6) o.balance_chunk_bound = false;
    SCOPED_TRACE("t " + std::to_string(t));
    DecodeSchedule s;
    ASSERT_NO_THROW(s = plan_decode(lens, o));
    expect_valid(lens, o, s);
    o.balance_tail = false;
    const DecodeSchedule plain = plan_decode(lens, o);
    if (makespan(s) < makespan(plain)) {
      ++applied;
      // (The room for cuts can run out, e.g. where the plain schedule already splits many
      // tiles: the result is then only no worse. Here it had room: fewer than max slots used.)
      if (s.num_slots + 2 * heads <= max_split_slots(ctas) &&
          s.num_cta_work_items() + heads <= o.max_work_items) {
        EXPECT_LE(makespan(s), tail_bound(o, plain) * (1 + 1e-12));
      }
    }
  }
  EXPECT_GT(applied, 40);
}

// Adversarial batches for the workspace bounds with tail balancing (capacities = the bounds).
TEST(DecodeSchedulerTail, WorkspaceBoundsHoldForAdversarialBatches) {
  std::vector<std::vector<int64_t>> batches;
  for (int ctas : {132, 264, 528}) {
    std::vector<int64_t> lens(ctas - 1 + 300, 0);  // splits into 2 C - 2 slots already
    std::fill(lens.begin(), lens.begin() + ctas - 1, 10000);
    batches.push_back(lens);
  }
  batches.push_back(std::vector<int64_t>(1024, 131072));
  batches.push_back(std::vector<int64_t>(133, 1000));
  batches.push_back(std::vector<int64_t>(1000, 257));  // just above 2 min_chunk
  batches.push_back(std::vector<int64_t>(37, 300000));
  std::vector<int64_t> mixed(1024, 1);
  mixed[0] = INT32_MAX;
  batches.push_back(mixed);
  for (size_t b = 0; b < batches.size(); ++b) {
    for (int heads : {1, 2, 8, 32}) {
      for (int ctas : {132, 264, 528}) {
        const int c = ctas - ctas % heads;  // block mode
        SCOPED_TRACE("batch " + std::to_string(b) + ", heads " + std::to_string(heads) + ", ctas " +
                     std::to_string(c));
        const DecodeScheduleOptions o = bounded_options(c, heads, batches[b].size());
        DecodeSchedule s;
        ASSERT_NO_THROW(s = plan_decode(batches[b], o));
        expect_valid(batches[b], o, s);
        EXPECT_LE(s.num_slots, max_split_slots(c));
        EXPECT_LE(s.num_cta_work_items(),
                  int64_t{max_decode_work_items(static_cast<int>(batches[b].size()), heads, c)});
      }
    }
  }
}

TEST(DecodeSchedulerTail, IsDeterministicAndOffIsThePlainSchedule) {
  std::mt19937_64 rng(77);
  for (int t = 0; t < 20; ++t) {
    std::vector<int64_t> lens(1 + rng() % 400);
    for (int64_t& l : lens) l = 1024 + static_cast<int64_t>(rng() % 2048);
    DecodeScheduleOptions o = bounded_options(264, t % 2 ? 8 : 1, lens.size());
    const DecodeSchedule a = plan_decode(lens, o);
    DecodeSchedule b;
    plan_decode(lens, o, &b);
    expect_same(a, b);
    expect_same(a, plan_decode(lens, o));
    // balance_tail = false: exactly the plain greedy (the reference priority-queue greedy).
    o.balance_tail = false;
    const DecodeSchedule plain = plan_decode(lens, o);
    expect_valid(lens, o, plain);
    expect_matches_reference_greedy(o, plain);
  }
}

// What the benchmark's decode workloads get (printed), GQA 32/8 and MHA 32/32 on 264 CTAs, and
// plan time with the tail on and off.
TEST(DecodeSchedulerTail, PrintsTheBenchmarkSchedules) {
  double zs = 0;
  for (int j = 1; j <= 16; ++j) zs += std::pow(j, -1.1);
  std::vector<int64_t> zipf;
  for (int i = 1; i <= 16; ++i)
    zipf.push_back(std::max<int64_t>(16, std::llround(16 * 1024 * std::pow(i, -1.1) / zs)));
  const std::vector<std::pair<const char*, std::vector<int64_t>>> work = {
      {"D1", std::vector<int64_t>(16, 1024)},
      {"D2", {596, 1001, 689, 512, 892, 896, 749, 579, 903, 922, 612, 556, 633, 728, 896, 613}},
      {"D3", zipf},
      {"D4", {32768}},
      {"D5", std::vector<int64_t>(64, 4096)},
      {"D6", std::vector<int64_t>(256, 2048)}};
  for (int heads : {8, 32}) {
    for (const auto& [name, lens] : work) {
      DecodeScheduleOptions o = bounded_options(264, heads, lens.size());
      const DecodeSchedule s = plan_decode(lens, o);
      expect_valid(lens, o, s);
      o.balance_tail = false;
      const DecodeSchedule p = plan_decode(lens, o);
      const auto describe = [&](const DecodeSchedule& x) {
        const DecodeSchedule e = expand_to_ctas(x);
        int lo = INT_MAX, hi = 0;
        for (int c = 0; c < x.num_ctas; ++c) {
          lo = std::min(lo, cta_work_count(x, c));
          hi = std::max(hi, cta_work_count(x, c));
        }
        char buf[200];
        std::snprintf(buf, sizeof(buf),
                      "items/CTA %d-%d, %lld CTA items, %zu split tiles, %d slots, makespan %.0f "
                      "(%.3f x mean %.0f)",
                      lo, hi, static_cast<long long>(x.num_cta_work_items()), x.merge.size(),
                      x.num_slots, makespan(x), makespan(x) / mean_load(x), mean_load(x));
        return std::string(buf);
      };
      std::printf("%s %s: tail   %s\n", name, heads == 8 ? "GQA 32/8 " : "MHA 32/32",
                  describe(s).c_str());
      std::printf("%s %s: plain  %s\n", name, heads == 8 ? "GQA 32/8 " : "MHA 32/32",
                  describe(p).c_str());
    }
  }
  // Plan time, tail on and off, interleaved (batch 1 / 64 / 256 / 1024, 1024 + rng() % 2048).
  std::mt19937_64 rng(1);
  for (size_t batch : {1, 64, 256, 1024}) {
    std::vector<int64_t> lens(batch);
    for (int64_t& l : lens) l = 1024 + static_cast<int64_t>(rng() % 2048);
    DecodeScheduleOptions on = bounded_options(264, 8, batch), off = on;
    off.balance_tail = false;
    DecodeSchedule kept;
    std::vector<double> t_on, t_off;
    for (int r = 0; r < 201; ++r) {
      for (int which = 0; which < 2; ++which) {
        const auto t0 = std::chrono::steady_clock::now();
        plan_decode(lens, which ? off : on, &kept);
        const auto t1 = std::chrono::steady_clock::now();
        (which ? t_off : t_on)
            .push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
    std::nth_element(t_on.begin(), t_on.begin() + 100, t_on.end());
    std::nth_element(t_off.begin(), t_off.begin() + 100, t_off.end());
    std::printf("plan_decode batch %4zu: tail on %6.2f us, off %6.2f us (median of 201)\n", batch,
                t_on[100], t_off[100]);
  }
}

}  // namespace
}  // namespace flashkv::scheduler
