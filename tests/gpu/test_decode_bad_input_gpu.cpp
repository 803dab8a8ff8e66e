// Batch decode's bad inputs beyond test_decode_graph_gpu.cpp's BadInputsRaiseNamedErrors: page
// tables plan() must refuse, and tensors run() must refuse because they do not match the plan
// (dtype, shape, page size, heads, device, batch, index count). Each refusal is a flashkv::Error
// naming the argument, and writes nothing: out and lse are poisoned (0xff bytes) and must keep
// every byte. After the refusals the object still works: a valid run matches the reference.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "flashkv/decode.h"
#include "flashkv/error.h"
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

class DecodeBadInputGpu : public GpuTest {
 protected:
  // Two requests: 40 tokens (3 pages) and 3 tokens (1 page), so kv_indptr[batch] = 4.
  PagedCacheHost cache = make_paged_cache({40, 3}, kPage, kHkv, kD, KVLayout::NHD, kDt, 1);
  HostTensor q{kDt, {2, kHqo, kD}}, out{kDt, {2, kHqo, kD}}, lse{DType::f32, {2, kHqo}};

  const int32_t* indptr() const { return cache.indptr.view().data_as<int32_t>(); }
  const int32_t* last() const { return cache.last_page_len.view().data_as<int32_t>(); }
  DecodeBatch batch() const {
    return {.kv_indptr = indptr(), .kv_last_page_len = last(), .batch_size = 2, .page_size = kPage};
  }

  // fn() throws flashkv::Error containing `needle`, and every poisoned tensor keeps its bytes.
  static void expect_refused(const std::function<void()>& fn, const std::string& needle,
                             const std::vector<const DeviceTensor*>& poisoned) {
    const std::string msg = error_of(fn);
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
    for (const DeviceTensor* t : poisoned) {
      EXPECT_TRUE(all_bytes_are(*t)) << "written by the call refused for '" << needle << "'";
    }
  }

  // A valid run after the refusals: the plan in force still runs, and matches the reference.
  void expect_valid_run_matches(BatchDecode& dec, const DeviceTensor& dq, const DeviceCache& dc) {
    HostTensor ref(DType::f32, out.shape()), ref_lowp(kDt, out.shape()), got(kDt, out.shape());
    reference::batch_decode(q.view(), cache.cache, ref.view(), TensorView());
    for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));
    DeviceTensor dout = poisoned_like(out);
    dec.run(dq.view, dc.cache, dout.view, TensorView());
    synchronize();
    to_host(dout, got);
    const auto got_d = got.to_doubles(), ref_d = ref.to_doubles(), lowp_d = ref_lowp.to_doubles();
    EXPECT_TRUE(matches_reference(got_d, ref_d, lowp_d, kDt));
    EXPECT_TRUE(every_request_passes(
        check_tolerance_per_request(got_d, ref_d, lowp_d, 2, tolerance_floor(kDt))));
  }
};

// Each bad plan() follows a good one: the refusal leaves the object unplanned (batch_decode.cpp:
// "never half-planned"), so run() is refused too instead of running the earlier plan.
TEST_F(DecodeBadInputGpu, PlanRefusesBadPageTablesAndSizes) {
  BatchDecodeConfig cfg{4, kHqo, kD};
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  q.fill_random(2);
  const DeviceCache dc = to_device(cache);
  const DeviceTensor dq = to_device(q), dout = poisoned_like(out), dlse = poisoned_like(lse);
  const std::vector<const DeviceTensor*> poisoned = {&dout, &dlse};

  const std::vector<int32_t> indptr_not_from_zero = {1, 4, 5};
  const std::vector<int32_t> last_past_page = {8, kPage + 1};  // request 1: 17 tokens on 1 page
  struct BadPlan {
    std::string needle;
    std::function<void()> plan;
  };
  const DecodeBatch good = batch();
  const std::vector<BadPlan> cases = {
      {"kv_indptr[0]",
       [&] { dec.plan(with(good, &DecodeBatch::kv_indptr, indptr_not_from_zero.data()), kShape); }},
      {"kv_indptr",  // null
       [&] { dec.plan(with(good, &DecodeBatch::kv_indptr, nullptr), kShape); }},
      {"kv_last_page_len[1]",
       [&] {
         dec.plan(with(good, &DecodeBatch::kv_last_page_len, last_past_page.data()), kShape);
       }},
      {"page_size", [&] { dec.plan(with(good, &DecodeBatch::page_size, 0), kShape); }},
      {"page_size", [&] { dec.plan(with(good, &DecodeBatch::page_size, -16), kShape); }},
      {"batch_size", [&] { dec.plan(with(good, &DecodeBatch::batch_size, -1), kShape); }},
      {"num_qo_heads",  // more than BatchDecodeConfig.num_qo_heads
       [&] { dec.plan(good, with(kShape, &AttentionShape::num_qo_heads, 2 * kHqo)); }},
      {"o_dtype", [&] { dec.plan(good, with(kShape, &AttentionShape::o_dtype, DType::bf16)); }},
      {"q_dtype", [&] { dec.plan(good, with(kShape, &AttentionShape::q_dtype, DType::f32)); }},
  };
  for (const BadPlan& c : cases) {
    SCOPED_TRACE(c.needle);
    dec.plan(good, kShape);
    expect_refused(c.plan, c.needle, poisoned);
    expect_refused([&] { dec.run(dq.view, dc.cache, dout.view, dlse.view); },
                   "before a successful plan", poisoned);
  }
  dec.plan(good, kShape);
  expect_valid_run_matches(dec, dq, dc);
}

// run() checks every tensor against the plan in force (f16, 2 requests, 32/8 heads, D 128, page
// 16, 4 page ids) before anything is launched.
TEST_F(DecodeBadInputGpu, RunRefusesTensorsThatDoNotMatchThePlan) {
  BatchDecodeConfig cfg{4, kHqo, kD};
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  q.fill_random(3);
  const DeviceCache dc = to_device(cache);
  const DeviceTensor dq = to_device(q), dout = poisoned_like(out), dlse = poisoned_like(lse);
  dec.plan(batch(), kShape);

  // Runs with one argument replaced; out and lse are the poisoned ones unless replaced.
  const auto run = [&](const TensorView& q_view, const PagedKVCache& kv, const TensorView& o,
                       const TensorView& l) {
    return [&dec, q_view, kv, o, l] { dec.run(q_view, kv, o, l); };
  };
  const std::vector<const DeviceTensor*> poisoned = {&dout, &dlse};
  const Device gpu = Device::cuda(0);
  const int64_t pages = dc.cache.num_pages();
  void* k = dc.cache.k.data();
  void* v = dc.cache.v.data();

  // out: another dtype than the plan's o_dtype, other heads, other head_dim, more rows, 2-d.
  {
    const DeviceTensor out_bf16 = poisoned_like(HostTensor(DType::bf16, {2, kHqo, kD}));
    const DeviceTensor out_heads = poisoned_like(HostTensor(kDt, {2, kHqo / 2, kD}));
    const DeviceTensor out_dim = poisoned_like(HostTensor(kDt, {2, kHqo, kD / 2}));
    const DeviceTensor out_rows = poisoned_like(HostTensor(kDt, {3, kHqo, kD}));
    const DeviceTensor out_flat = poisoned_like(HostTensor(kDt, {2, kHqo * kD}));
    for (const DeviceTensor* bad : {&out_bf16, &out_heads, &out_dim, &out_rows, &out_flat}) {
      SCOPED_TRACE(bad->view.str());
      expect_refused(run(dq.view, dc.cache, bad->view, dlse.view), "out:", {&dout, &dlse, bad});
    }
  }
  // q: another dtype than the plan's.
  {
    const DeviceTensor q_bf16 = to_device(HostTensor(DType::bf16, {2, kHqo, kD}));
    expect_refused(run(q_bf16.view, dc.cache, dout.view, dlse.view), "q:", poisoned);
  }
  // lse: other heads; on the host.
  {
    const DeviceTensor lse_heads = poisoned_like(HostTensor(DType::f32, {2, kHqo / 2}));
    expect_refused(run(dq.view, dc.cache, dout.view, lse_heads.view),
                   "lse:", {&dout, &dlse, &lse_heads});
    HostTensor lse_host(DType::f32, {2, kHqo});
    expect_refused(run(dq.view, dc.cache, dout.view, lse_host.view()), "lse:", poisoned);
  }
  // paged_kv.k / v: another dtype than the plan's kv_dtype (both, or k alone).
  {
    PagedKVCache bf16 = dc.cache;
    bf16.k = TensorView(k, DType::bf16, {pages, kPage, kHkv, kD}, gpu);
    bf16.v = TensorView(v, DType::bf16, {pages, kPage, kHkv, kD}, gpu);
    expect_refused(run(dq.view, bf16, dout.view, dlse.view), "paged_kv.k", poisoned);
    PagedKVCache k_only = dc.cache;
    k_only.k = bf16.k;
    expect_refused(run(dq.view, k_only, dout.view, dlse.view), "paged_kv.v", poisoned);
  }
  // The same cache bytes seen with another page size, KV head count or head_dim than the plan's
  // (every page id stays in range of the reinterpreted cache).
  {
    PagedKVCache other = dc.cache;
    other.k = TensorView(k, kDt, {2 * pages, kPage / 2, kHkv, kD}, gpu);
    other.v = TensorView(v, kDt, {2 * pages, kPage / 2, kHkv, kD}, gpu);
    expect_refused(run(dq.view, other, dout.view, dlse.view), "paged_kv.page_size", poisoned);
    other.k = TensorView(k, kDt, {pages, kPage, kHkv / 2, 2 * kD}, gpu);
    other.v = TensorView(v, kDt, {pages, kPage, kHkv / 2, 2 * kD}, gpu);
    expect_refused(run(dq.view, other, dout.view, dlse.view), "paged_kv.num_kv_heads", poisoned);
    other.k = TensorView(k, kDt, {2 * pages, kPage, kHkv, kD / 2}, gpu);
    other.v = TensorView(v, kDt, {2 * pages, kPage, kHkv, kD / 2}, gpu);
    expect_refused(run(dq.view, other, dout.view, dlse.view), "paged_kv.head_dim", poisoned);
  }
  // Devices: v on the host (k on the GPU), both on the host, indices on the host.
  {
    PagedKVCache host_v = dc.cache;
    host_v.v = cache.v.view();
    expect_refused(run(dq.view, host_v, dout.view, dlse.view), "paged_kv.v", poisoned);
    PagedKVCache host_kv = host_v;
    host_kv.k = cache.k.view();
    expect_refused(run(dq.view, host_kv, dout.view, dlse.view), "paged_kv.k", poisoned);
    PagedKVCache host_indices = dc.cache;
    host_indices.indices = cache.indices.view();
    expect_refused(run(dq.view, host_indices, dout.view, dlse.view), "paged_kv.indices", poisoned);
  }
  // paged_kv.indices shorter than the plan's kv_indptr[batch] = 4 (the kernel would read past it).
  {
    PagedKVCache short_indices = dc.cache;
    short_indices.indices = dc.cache.indices.slice0(0, 3);
    expect_refused(run(dq.view, short_indices, dout.view, dlse.view), "paged_kv.indices", poisoned);
  }
  // paged_kv's batch (indptr has batch + 1 entries) differs from the plan's 2 requests.
  {
    const DeviceTensor indptr3 = to_device(make_i32({0, 3, 4, 4}));
    const DeviceTensor last3 = to_device(make_i32({8, 3, 0}));
    PagedKVCache three = dc.cache;
    three.indptr = indptr3.view;
    three.last_page_len = last3.view;
    expect_refused(run(dq.view, three, dout.view, dlse.view), "paged_kv batch", poisoned);
    const DeviceTensor indptr1 = to_device(make_i32({0, 3}));
    const DeviceTensor last1 = to_device(make_i32({8}));
    PagedKVCache one = dc.cache;
    one.indptr = indptr1.view;
    one.last_page_len = last1.view;
    expect_refused(run(dq.view, one, dout.view, dlse.view), "paged_kv batch", poisoned);
  }
  expect_valid_run_matches(dec, dq, dc);
}

}  // namespace
}  // namespace flashkv::test
