// Page ids of a host page table, checked where it costs no GPU work (plan_checks.h): plan()
// refuses a negative id (or one >= num_pages when the caller gives the page count) and keeps the
// largest; run() compares that with the page count of the cache it is given and throws, naming
// the entry, before anything is launched. For BatchDecode (DecodePlanOptions::kv_indices_host),
// BatchPrefillPaged (PrefillPlanOptions::kv_indices_host) and MultiLevelCascade (whose plan()
// always has the host ids). Every refusal writes nothing: out and lse are poisoned (0xff bytes)
// and must keep every byte; afterwards a valid plan and run still match the CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/prefill.h"
#include "flashkv/reference.h"
#include "gpu/decode_case.h"

namespace flashkv::test {
namespace {

constexpr int kHqo = 32, kHkv = 8, kD = 128, kPage = 16;
constexpr DType kDt = DType::f16;
constexpr AttentionShape kShape{.num_qo_heads = kHqo,
                                .num_kv_heads = kHkv,
                                .head_dim = kD,
                                .q_dtype = kDt,
                                .kv_dtype = kDt,
                                .o_dtype = kDt};

class PageIdsGpu : public GpuTest {
 protected:
  // Two requests: 40 tokens (3 pages) and 3 tokens (1 page): kv_indptr[batch] = 4 page ids.
  PagedCacheHost cache = make_paged_cache({40, 3}, kPage, kHkv, kD, KVLayout::NHD, kDt, 7);

  const int32_t* indptr() const { return cache.indptr.view().data_as<int32_t>(); }
  const int32_t* last() const { return cache.last_page_len.view().data_as<int32_t>(); }
  // The table as plan()'s batch: decode, and prefill with query rows `qo_indptr`.
  DecodeBatch decode_batch() const {
    return {.kv_indptr = indptr(), .kv_last_page_len = last(), .batch_size = 2, .page_size = kPage};
  }
  PrefillBatch prefill_batch(const int32_t* qo_indptr) const {
    return {.qo_indptr = qo_indptr,
            .kv_indptr = indptr(),
            .kv_last_page_len = last(),
            .batch_size = 2,
            .page_size = kPage};
  }
  std::vector<int32_t> ids() const {
    const int32_t* p = cache.indices.view().data_as<int32_t>();
    return std::vector<int32_t>(p, p + indptr()[2]);
  }
  int64_t num_pages() const { return cache.cache.num_pages(); }

  // The same table with entry 2 one past the last page, on the host and on the device (a caller's
  // two copies of one table agree).
  std::vector<int32_t> bad_ids() const {
    std::vector<int32_t> b = ids();
    b[2] = static_cast<int32_t>(num_pages());
    return b;
  }
  static DeviceTensor device_ids(const std::vector<int32_t>& ids) {
    return to_device(make_i32(std::vector<int64_t>(ids.begin(), ids.end())));
  }
  std::string past_the_end() const {
    return "kv_indices[2] = " + std::to_string(num_pages()) + " is out of range [0, num_pages)";
  }

  static void expect_refused(const std::function<void()>& fn, const std::string& needle,
                             const std::vector<const DeviceTensor*>& poisoned) {
    const std::string msg = error_of(fn);
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
    for (const DeviceTensor* t : poisoned) {
      EXPECT_TRUE(all_bytes_are(*t)) << "written by the call refused for '" << needle << "'";
    }
  }
};

TEST_F(PageIdsGpu, DecodeChecksHostIdsAtPlanAndRun) {
  BatchDecodeConfig cfg{4, kHqo, kD};
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  HostTensor q(kDt, {2, kHqo, kD}), out(kDt, {2, kHqo, kD}), lse(DType::f32, {2, kHqo});
  q.fill_random(11);
  const DeviceCache dc = to_device(cache);
  const DeviceTensor dq = to_device(q), dout = poisoned_like(out), dlse = poisoned_like(lse);
  const std::vector<const DeviceTensor*> poisoned = {&dout, &dlse};

  // An id past the cache: plan() (page count unknown) accepts it, run() refuses before launching.
  const std::vector<int32_t> bad = bad_ids();
  const DeviceTensor bad_d = device_ids(bad);
  PagedKVCache kv_bad = dc.cache;
  kv_bad.indices = bad_d.view;
  DecodePlanOptions o;
  o.kv_indices_host = bad.data();
  dec.plan(decode_batch(), kShape, o);
  expect_refused([&] { dec.run(dq.view, kv_bad, dout.view, dlse.view); }, past_the_end(), poisoned);
  // The fused step checks too (its new keys would be appended into the page of entry 2).
  {
    HostTensor nk(kDt, {2, kHkv, kD});
    const DeviceTensor dnk = to_device(nk), dnv = to_device(nk);
    expect_refused(
        [&] { dec.run_step(dq.view, dnk.view, dnv.view, kv_bad, dout.view, dlse.view, {}); },
        past_the_end(), poisoned);
  }
  // A cache view with fewer pages than the good table's largest id: refused the same way.
  {
    const std::vector<int32_t> good = ids();
    o.kv_indices_host = good.data();
    dec.plan(decode_batch(), kShape, o);
    const int32_t top = *std::max_element(good.begin(), good.end());
    PagedKVCache small = dc.cache;
    small.k = dc.cache.k.slice0(0, top);
    small.v = dc.cache.v.slice0(0, top);
    expect_refused([&] { dec.run(dq.view, small, dout.view, dlse.view); },
                   "the paged KV cache given to run() has " + std::to_string(top) + " pages",
                   poisoned);
  }
  // A negative id: refused at plan(), which leaves the object unplanned.
  {
    std::vector<int32_t> neg = ids();
    neg[1] = -1;
    o.kv_indices_host = neg.data();
    expect_refused([&] { dec.plan(decode_batch(), kShape, o); },
                   "kv_indices[1] = -1 is out of range", poisoned);
    expect_refused([&] { dec.run(dq.view, dc.cache, dout.view, dlse.view); },
                   "before a successful plan", poisoned);
  }
  // The page count given to plan(): the id past it is refused there.
  o.kv_indices_host = bad.data();
  o.num_pages = num_pages();
  expect_refused([&] { dec.plan(decode_batch(), kShape, o); }, past_the_end(), poisoned);

  // Valid: the good table with its host copy runs and matches the reference.
  const std::vector<int32_t> good = ids();
  o.kv_indices_host = good.data();
  dec.plan(decode_batch(), kShape, o);
  dec.run(dq.view, dc.cache, dout.view, TensorView());
  synchronize();
  HostTensor ref(DType::f32, out.shape()), lowp(kDt, out.shape()), got(kDt, out.shape());
  reference::batch_decode(q.view(), cache.cache, ref.view(), TensorView());
  for (int64_t i = 0; i < ref.numel(); ++i) lowp.set(i, ref.get(i));
  to_host(dout, got);
  EXPECT_TRUE(matches_reference(got.to_doubles(), ref.to_doubles(), lowp.to_doubles(), kDt));
}

TEST_F(PageIdsGpu, PrefillPagedChecksHostIdsAtPlanAndRun) {
  BatchPrefillConfig cfg;
  cfg.max_batch = 4;
  cfg.max_qo_tokens = 16;
  cfg.num_qo_heads = kHqo;
  cfg.head_dim = kD;
  DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
  BatchPrefillPaged pf(cfg, ws.data(), ws.size());
  const std::vector<int32_t> qo = {0, 5, 6};  // 5 query rows, then 1
  HostTensor q(kDt, {6, kHqo, kD}), out(kDt, {6, kHqo, kD}), lse(DType::f32, {6, kHqo});
  q.fill_random(12);
  const DeviceCache dc = to_device(cache);
  const DeviceTensor dq = to_device(q), dout = poisoned_like(out), dlse = poisoned_like(lse);
  const std::vector<const DeviceTensor*> poisoned = {&dout, &dlse};
  PrefillPlanOptions o;
  o.causal = true;

  const std::vector<int32_t> bad = bad_ids();
  const DeviceTensor bad_d = device_ids(bad);
  PagedKVCache kv_bad = dc.cache;
  kv_bad.indices = bad_d.view;
  o.kv_indices_host = bad.data();
  pf.plan(prefill_batch(qo.data()), kShape, o);
  expect_refused([&] { pf.run(dq.view, kv_bad, dout.view, dlse.view); }, past_the_end(), poisoned);
  {
    std::vector<int32_t> neg = ids();
    neg[3] = -7;
    o.kv_indices_host = neg.data();
    expect_refused([&] { pf.plan(prefill_batch(qo.data()), kShape, o); },
                   "kv_indices[3] = -7 is out of range", poisoned);
    expect_refused([&] { pf.run(dq.view, dc.cache, dout.view, dlse.view); },
                   "before a successful plan", poisoned);
  }
  o.kv_indices_host = bad.data();
  o.num_pages = num_pages();
  expect_refused([&] { pf.plan(prefill_batch(qo.data()), kShape, o); }, past_the_end(), poisoned);

  const std::vector<int32_t> good = ids();
  o.kv_indices_host = good.data();
  pf.plan(prefill_batch(qo.data()), kShape, o);
  pf.run(dq.view, dc.cache, dout.view, TensorView());
  synchronize();
  HostTensor ref(DType::f32, out.shape()), lowp(kDt, out.shape()), got(kDt, out.shape());
  AttentionOptions ao;
  ao.causal = true;
  reference::batch_prefill_paged(q.view(),
                                 TensorView(const_cast<int32_t*>(qo.data()), DType::i32, {3}),
                                 cache.cache, ref.view(), TensorView(), ao);
  for (int64_t i = 0; i < ref.numel(); ++i) lowp.set(i, ref.get(i));
  to_host(dout, got);
  EXPECT_TRUE(matches_reference(got.to_doubles(), ref.to_doubles(), lowp.to_doubles(), kDt));
}

TEST_F(PageIdsGpu, CascadeChecksIdsAgainstTheCacheAtRun) {
  MultiLevelCascadeConfig cfg;
  cfg.max_batch = 4;
  cfg.max_pages = 16;
  cfg.num_qo_heads = kHqo;
  cfg.head_dim = kD;
  DeviceBuffer ws(MultiLevelCascade::workspace_bytes(cfg));
  MultiLevelCascade casc(cfg, ws.data(), ws.size());
  HostTensor q(kDt, {2, kHqo, kD}), out(kDt, {2, kHqo, kD}), lse(DType::f32, {2, kHqo});
  q.fill_random(13);
  const DeviceCache dc = to_device(cache);
  const DeviceTensor dq = to_device(q), dout = poisoned_like(out), dlse = poisoned_like(lse);
  const std::vector<const DeviceTensor*> poisoned = {&dout, &dlse};
  const PagedKVCache kv{dc.cache.k, dc.cache.v, KVLayout::NHD, {}, {}, {}};
  const CascadeShape shape{kHqo, kHkv, kD, kDt};

  const auto batch = [&](const std::vector<int32_t>& table) {
    return CascadeBatch{nullptr, indptr(), table.data(), last(), 2, kPage};
  };
  const std::vector<int32_t> bad = bad_ids();
  casc.plan(batch(bad), shape);
  expect_refused([&] { casc.run(dq.view, kv, dout.view, dlse.view); }, past_the_end(), poisoned);
  std::vector<int32_t> neg = ids();
  neg[0] = -2;
  expect_refused([&] { casc.plan(batch(neg), shape); }, "kv_indices[0] = -2 is out of range",
                 poisoned);
  expect_refused([&] { casc.run(dq.view, kv, dout.view, dlse.view); }, "before a successful plan",
                 poisoned);

  const std::vector<int32_t> good = ids();
  casc.plan(batch(good), shape);
  casc.run(dq.view, kv, dout.view, TensorView());
  synchronize();
  HostTensor ref(DType::f32, out.shape()), lowp(kDt, out.shape()), got(kDt, out.shape());
  reference::batch_decode(q.view(), cache.cache, ref.view(), TensorView());
  for (int64_t i = 0; i < ref.numel(); ++i) lowp.set(i, ref.get(i));
  to_host(dout, got);
  EXPECT_TRUE(matches_reference(got.to_doubles(), ref.to_doubles(), lowp.to_doubles(), kDt));
}

}  // namespace
}  // namespace flashkv::test
