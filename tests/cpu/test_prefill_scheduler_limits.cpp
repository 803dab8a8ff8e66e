// Tests of the prefill scheduler (src/scheduler/prefill_scheduler.h), its edges: capacity and
// option errors, the serialized byte image, and plan time.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "flashkv/error.h"
#include "prefill_scheduler_test_util.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler {
namespace {

using namespace prefill_test;

TEST(PrefillScheduler, CapacityErrorsSayWhatIsMissing) {
  const std::vector<int64_t> qo{1024}, kv{100000};
  PrefillScheduleOptions o;
  o.num_ctas = 132;
  o.num_kv_heads = 8;
  o.max_slots = 1;
  o.max_work_items = 1 << 20;
  o.fixed_split_size = 4096;  // dynamic splitting would fit the slot (PrefillWorkspaceFit)
  try {
    plan_prefill(qo, kv, o);
    FAIL() << "expected a slot capacity error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_slots = 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("partial-state slots"), std::string::npos) << e.what();
  }
  o.fixed_split_size = 0;
  o.max_slots = 1 << 20;
  o.max_work_items = 10;
  try {
    plan_prefill(qo, kv, o);
    FAIL() << "expected a work-item capacity error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("64 work items"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_work_items = 10"), std::string::npos) << e.what();
  }
  // An out-of-capacity plan leaves a reused schedule as it was.
  o.max_work_items = 1 << 20;
  PrefillSchedule s = plan_prefill(qo, kv, o);
  const PrefillSchedule before = s;
  o.max_work_items = 10;
  EXPECT_THROW(plan_prefill(qo, kv, o, &s), Error);
  expect_same(s, before);
}

TEST(PrefillScheduler, RejectsInvalidOptions) {
  const std::vector<int64_t> qo{4}, kv{8};
  auto valid = [] {
    PrefillScheduleOptions o;
    o.num_ctas = 4;
    o.max_slots = 8;
    o.max_work_items = 64;
    return o;
  };
  EXPECT_NO_THROW(plan_prefill(qo, kv, valid()));
  auto rejects = [&](auto&& tweak, std::span<const int64_t> q, std::span<const int64_t> k) {
    PrefillScheduleOptions o = valid();
    tweak(o);
    EXPECT_THROW(plan_prefill(q, k, o), Error);
  };
  rejects([](auto& o) { o.num_ctas = 0; }, qo, kv);
  rejects([](auto& o) { o.num_kv_heads = 0; }, qo, kv);
  rejects([](auto& o) { o.group = 0; }, qo, kv);
  rejects([](auto& o) { o.group = 129; }, qo, kv);
  rejects([](auto& o) { o.tile_rows = 48; }, qo, kv);
  rejects([](auto& o) { o.split_align = 0; }, qo, kv);
  rejects([](auto& o) { o.split_align = 256; }, qo, kv);  // > min_chunk_tokens (128)
  rejects([](auto& o) { o.group = 32, o.tile_rows = 16; }, qo, kv);
  rejects([](auto& o) { o.fixed_split_size = -1; }, qo, kv);
  rejects([](auto& o) { o.fixed_split_size = 16, o.disable_split_kv = true; }, qo, kv);
  rejects([](auto& o) { o.min_chunk_tokens = 0; }, qo, kv);
  rejects([](auto& o) { o.max_slots = -1; }, qo, kv);
  rejects([](auto& o) { o.max_work_items = 0; }, qo, kv);
  rejects([](auto& o) { o.cost.alpha = -1; }, qo, kv);
  rejects([](auto& o) { o.cost.beta = 0; }, qo, kv);
  rejects([](auto&) {}, std::vector<int64_t>{4, 4}, kv);  // sizes differ
  rejects([](auto&) {}, std::vector<int64_t>{-1}, kv);
  rejects([](auto&) {}, qo, std::vector<int64_t>{-1});
  rejects([](auto&) {}, qo, std::vector<int64_t>{int64_t{INT32_MAX} + 1});
  EXPECT_THROW(plan_prefill(qo, kv, valid(), nullptr), Error);
}

TEST(PrefillScheduler, SerializationRoundTrips) {
  std::mt19937_64 rng(5);
  for (int t = 0; t < 4; ++t) {
    const Batch b = random_batch(rng);
    const PrefillScheduleOptions o = bounded_options(132, 4, 8, b.qo, t % 2 == 0);
    const PrefillSchedule s = plan_prefill(b.qo, b.kv, o);
    const PrefillPlanLayout layout =
        prefill_plan_layout(o.num_ctas, o.max_work_items, max_split_merge_items(o.max_slots));
    std::vector<std::byte> image(layout.bytes, std::byte{0xAB});
    const size_t used = serialize_prefill_schedule(s, layout, image.data());
    ASSERT_LE(used, layout.bytes);
    EXPECT_EQ(layout.cta_work_indptr % 16, 0u);
    EXPECT_EQ(layout.work % 16, 0u);

    PrefillPlanHeader h;
    std::memcpy(&h, image.data() + layout.header, sizeof(h));
    EXPECT_EQ(h.num_work_items, static_cast<int>(s.work.size()));
    EXPECT_EQ(h.num_merge_items, static_cast<int>(s.merge.size()));
    EXPECT_EQ(h.tile_rows, s.tile_rows);
    EXPECT_EQ(h.merge_offset % 16, 0);
    EXPECT_EQ(used, h.merge_offset + s.merge.size() * sizeof(PrefillMergeItem));
    std::vector<int> indptr(s.cta_work_indptr.size());
    std::memcpy(indptr.data(), image.data() + layout.cta_work_indptr, indptr.size() * sizeof(int));
    EXPECT_EQ(indptr, s.cta_work_indptr);
    std::vector<PrefillWorkItem> work(static_cast<size_t>(h.num_work_items));
    std::memcpy(work.data(), image.data() + layout.work, work.size() * sizeof(PrefillWorkItem));
    EXPECT_EQ(0, std::memcmp(work.data(), s.work.data(), work.size() * sizeof(PrefillWorkItem)));
    std::vector<PrefillMergeItem> merge(static_cast<size_t>(h.num_merge_items));
    std::memcpy(merge.data(), image.data() + h.merge_offset,
                merge.size() * sizeof(PrefillMergeItem));
    EXPECT_EQ(0,
              std::memcmp(merge.data(), s.merge.data(), merge.size() * sizeof(PrefillMergeItem)));
  }
  // A schedule larger than the layout is refused.
  const std::vector<int64_t> qo{100}, kv{100};
  PrefillScheduleOptions o;
  o.num_ctas = 2;
  o.tile_rows = 16;
  o.max_slots = 8;
  o.max_work_items = 64;
  const PrefillSchedule s = plan_prefill(qo, kv, o);
  const PrefillPlanLayout small = prefill_plan_layout(2, 1, 0);
  std::vector<std::byte> image(small.bytes);
  EXPECT_THROW(serialize_prefill_schedule(s, small, image.data()), Error);
  const PrefillPlanLayout other = prefill_plan_layout(3, 64, 4);
  std::vector<std::byte> image2(other.bytes);
  EXPECT_THROW(serialize_prefill_schedule(s, other, image2.data()), Error);
}

// Plan time: printed (machine-dependent), asserted only to stay far below a second.
TEST(PrefillScheduler, PlanTimeMicroBenchmark) {
  struct Case {
    const char* name;
    Batch b;
    bool causal;
    int heads = 8, group = 4, ctas = 264, tile_rows = 0;
    bool head_major = false;
  };
  const std::vector<Case> cases = {
      {"batch 16 x 1024 causal",
       {std::vector<int64_t>(16, 1024), std::vector<int64_t>(16, 1024)},
       true},
      {"batch 64 x qo 4 kv 4096",
       {std::vector<int64_t>(64, 4), std::vector<int64_t>(64, 4096)},
       false},
      // P5 MHA as the wgmma kernel's plan sees it: 8192 chunks, request- and head-major.
      {"1 x 32k causal MHA request-major", {{32768}, {32768}}, true, 32, 1, 132, 128, false},
      {"1 x 32k causal MHA head-major", {{32768}, {32768}}, true, 32, 1, 132, 128, true},
  };
  for (const Case& c : cases) {
    PrefillScheduleOptions o = bounded_options(c.ctas, c.heads, c.group, c.b.qo, c.causal);
    o.tile_rows = c.tile_rows;
    o.head_major = c.head_major;
    PrefillSchedule s;
    double best_us = 1e300;
    for (int rep = 0; rep < 20; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      plan_prefill(c.b.qo, c.b.kv, o, &s);
      const auto t1 = std::chrono::steady_clock::now();
      best_us = std::min(best_us, std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    expect_valid(c.b.qo, c.b.kv, o, s);
    std::printf(
        "[ PrefillScheduler ] %s, %d KV heads, group %d, %d CTAs: tile %d rows, %zu work items, "
        "%zu "
        "merges; plan %.1f us (best of 20)\n",
        c.name, c.heads, c.group, c.ctas, s.tile_rows, s.work.size(), s.merge.size(), best_us);
    EXPECT_LT(best_us, 1e6);
  }
}

}  // namespace
}  // namespace flashkv::scheduler
