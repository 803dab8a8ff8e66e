// Batch prefill's bad inputs, paged and ragged KV: the constructor, plan(), run() and capturing
// run() of a plan made without enable_cuda_graph refuse them with errors that name the argument,
// and leave the output untouched. They came from test_prefill_graph_gpu.cpp and keep their names
// in the PrefillGraphGpu suite, whose fixture the two files share (prefill_graph_util.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "flashkv/reference.h"
#include "gpu/prefill_case.h"
#include "gpu/prefill_graph_util.h"

namespace flashkv::test {
namespace {

constexpr int kHqo = 8, kHkv = 2, kD = 128, kPage = 16;

bool all_nan(const HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isnan(t.get(i))) return false;
  }
  return true;
}

// The constructor refuses a workspace one byte short of min_workspace_bytes(cfg) (the plan arrays;
// any buffer from there up works: WorkspaceFitGpu), naming it.
template <class Wrapper>
void expect_short_workspace_refused(const BatchPrefillConfig& cfg, const DeviceBuffer& ws) {
  const size_t need = Wrapper::min_workspace_bytes(cfg);
  expect_error([&] { Wrapper small(cfg, ws.data(), need - 1); },
               {"workspace: expected at least", std::to_string(need).c_str()});
}

// Capturing run(stream) of a plan made without enable_cuda_graph is refused, naming the option.
template <class Run>
void expect_capture_refused(Run&& run) {
  ScopedStream s;
  Graph g;
  expect_error([&] { capture(g, s, [&] { run(s); }); }, {"enable_cuda_graph"});
}

// After the refused calls: the device out and lse (shaped like `out` and `lse`) are still all NaN.
void expect_untouched(const DeviceTensor& dout, const HostTensor& out, const DeviceTensor& dlse,
                      const HostTensor& lse) {
  HostTensor got(out.dtype(), out.shape()), got_lse(lse.dtype(), lse.shape());
  to_host(dout, got);
  to_host(dlse, got_lse);
  EXPECT_TRUE(all_nan(got)) << "a refused call wrote out";
  EXPECT_TRUE(all_nan(got_lse)) << "a refused call wrote lse";
}

// Every refused call throws flashkv::Error naming the argument, before anything is written: out
// and lse are poisoned first and must still be all NaN at the end. The object stays usable.
TEST_F(PrefillGraphGpu, PagedBadInputsRaiseNamedErrorsAndLeaveOutputUntouched) {
  const DType dt = DType::f16;
  const BatchPrefillConfig cfg = prefill_config(4, 64, kHqo, kD);
  DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
  expect_short_workspace_refused<BatchPrefillPaged>(cfg, ws);
  BatchPrefillPaged pf(cfg, ws.data(), ws.size());

  const PagedCacheHost cache = make_paged_cache({40, 3}, kPage, kHkv, kD, KVLayout::NHD, dt, 1);
  const DeviceCache dc = to_device(cache);
  const HostTensor qo = indptr_of({20, 3});  // 23 query rows; KV: 3 + 1 pages
  HostTensor q(dt, {23, kHqo, kD}), out(dt, {23, kHqo, kD}), lse(DType::f32, {23, kHqo});
  q.fill_random(1);
  const DeviceTensor dq = to_device(q), dout = poisoned_like(out), dlse = poisoned_like(lse);
  const int32_t* qp = qo.view().data_as<int32_t>();
  const int32_t* ip = cache.indptr.view().data_as<int32_t>();
  const int32_t* lp = cache.last_page_len.view().data_as<int32_t>();
  // The valid batch: 2 requests, 23 query rows.
  const PrefillBatch good{.qo_indptr = qp,
                          .kv_indptr = ip,
                          .kv_last_page_len = lp,
                          .batch_size = 2,
                          .page_size = kPage};
  const AttentionShape shape{.num_qo_heads = kHqo,
                             .num_kv_heads = kHkv,
                             .head_dim = kD,
                             .q_dtype = dt,
                             .kv_dtype = dt,
                             .o_dtype = dt};
  PrefillPlanOptions causal;
  causal.causal = true;
  // plan() of the valid batch with options `o`.
  const auto plan_with = [&](const PrefillPlanOptions& o) { pf.plan(good, shape, o); };

  expect_error([&] { pf.run(dq.view, dc.cache, dout.view, dlse.view); }, {"plan"});

  // plan(): sizes beyond the configuration.
  {
    const PagedCacheHost five =
        make_paged_cache({1, 1, 1, 1, 1}, kPage, kHkv, kD, KVLayout::NHD, dt, 2);
    const HostTensor qo5 = indptr_of({1, 1, 1, 1, 1});
    expect_error(
        [&] {
          pf.plan({.qo_indptr = qo5.view().data_as<int32_t>(),
                   .kv_indptr = five.indptr.view().data_as<int32_t>(),
                   .kv_last_page_len = five.last_page_len.view().data_as<int32_t>(),
                   .batch_size = 5,
                   .page_size = kPage},
                  shape, causal);
        },
        {"batch_size"});
  }
  {
    const HostTensor qo65 = indptr_of({60, 5});  // 65 > max_qo_tokens = 64
    expect_error(
        [&] {
          pf.plan(with(good, &PrefillBatch::qo_indptr, qo65.view().data_as<int32_t>()), shape,
                  causal);
        },
        {"max_qo_tokens", "nnz_qo", "qo_indptr"});
  }
  expect_error([&] { pf.plan(good, with(shape, &AttentionShape::num_qo_heads, 16), causal); },
               {"num_qo_heads"});
  expect_error([&] { pf.plan(good, with(shape, &AttentionShape::head_dim, 96), causal); },
               {"head_dim"});
  expect_error([&] { pf.plan(good, with(shape, &AttentionShape::head_dim, 256), causal); },
               {"head_dim"});  // supported, but more than the configuration's 128
  expect_error([&] { pf.plan(good, with(shape, &AttentionShape::num_kv_heads, 3), causal); },
               {"num_kv_heads"});
  expect_error([&] { pf.plan(good, with(shape, &AttentionShape::kv_dtype, DType::bf16), causal); },
               {"kv_dtype"});
  // plan(): index arrays, each error naming the entry.
  const std::vector<int32_t> qo_not_monotone = {0, 20, 3}, qo_not_zero = {1, 20, 23};
  expect_error(
      [&] { pf.plan(with(good, &PrefillBatch::qo_indptr, qo_not_monotone.data()), shape, causal); },
      {"qo_indptr[2]"});
  expect_error(
      [&] { pf.plan(with(good, &PrefillBatch::qo_indptr, qo_not_zero.data()), shape, causal); },
      {"qo_indptr[0]"});
  const std::vector<int32_t> kv_not_monotone = {0, 3, 2}, bad_last = {0, 3};
  expect_error(
      [&] { pf.plan(with(good, &PrefillBatch::kv_indptr, kv_not_monotone.data()), shape, causal); },
      {"kv_indptr[2]"});
  expect_error(
      [&] { pf.plan(with(good, &PrefillBatch::kv_last_page_len, bad_last.data()), shape, causal); },
      {"kv_last_page_len[0]"});
  {
    const std::vector<int32_t> bad_ids = {0, 1, 99, 3};
    PrefillPlanOptions o = causal;
    o.kv_indices_host = bad_ids.data();
    o.num_pages = cache.cache.num_pages();
    expect_error([&] { plan_with(o); }, {"kv_indices[2]"});
  }
  // plan(): options.
  for (int tile : {48, 8, 256}) {
    PrefillPlanOptions o = causal;
    o.tile_rows = tile;
    expect_error([&] { plan_with(o); }, {"tile_rows"});
  }
  {
    PrefillPlanOptions o = causal;
    o.sm_scale = -1.0f;
    expect_error([&] { plan_with(o); }, {"sm_scale"});
    o = causal;
    o.fixed_split_size = -5;
    expect_error([&] { plan_with(o); }, {"fixed_split_size"});
    o = causal;
    o.fixed_split_size = 64;
    o.disable_split_kv = true;
    expect_error([&] { plan_with(o); }, {"fixed_split_size", "disable_split_kv"});
  }
  // A query tile must hold a whole token: 16 rows cannot hold the 32 heads of an MQA group.
  {
    BatchPrefillConfig cfg32 = cfg;
    cfg32.num_qo_heads = 32;
    DeviceBuffer ws32(BatchPrefillPaged::workspace_bytes(cfg32));
    BatchPrefillPaged pf32(cfg32, ws32.data(), ws32.size());
    PrefillPlanOptions o = causal;
    o.tile_rows = 16;
    const AttentionShape mqa{.num_qo_heads = 32,
                             .num_kv_heads = 1,
                             .head_dim = kD,
                             .q_dtype = dt,
                             .kv_dtype = dt,
                             .o_dtype = dt};
    expect_error([&] { pf32.plan(good, mqa, o); }, {"tile_rows"});
  }

  // run(): tensors that do not match the (valid) plan.
  plan_with(causal);
  for (int64_t rows : {22, 24}) {  // nnz_qo is 23
    HostTensor qr(dt, {rows, kHqo, kD});
    const DeviceTensor dqr = to_device(qr);
    expect_error([&] { pf.run(dqr.view, dc.cache, dout.view, dlse.view); }, {"q:"});
  }
  {
    HostTensor qb(DType::bf16, {23, kHqo, kD});
    const DeviceTensor dqb = to_device(qb);
    expect_error([&] { pf.run(dqb.view, dc.cache, dout.view, dlse.view); }, {"q:"});
    expect_error([&] { pf.run(q.view(), dc.cache, dout.view, dlse.view); }, {"q:"});  // host
    HostTensor ob(DType::bf16, {23, kHqo, kD}), oh(dt, {23, kHqo / 2, kD});
    const DeviceTensor dob = to_device(ob), doh = to_device(oh);
    expect_error([&] { pf.run(dq.view, dc.cache, dob.view, dlse.view); }, {"out:"});
    expect_error([&] { pf.run(dq.view, dc.cache, doh.view, dlse.view); }, {"out:"});
    HostTensor lb(DType::f16, {23, kHqo}), lr(DType::f32, {22, kHqo});
    const DeviceTensor dlb = to_device(lb), dlr = to_device(lr);
    expect_error([&] { pf.run(dq.view, dc.cache, dout.view, dlb.view); }, {"lse"});
    expect_error([&] { pf.run(dq.view, dc.cache, dout.view, dlr.view); }, {"lse"});
  }
  {
    // The same KV in pages of 8: page_size differs from the plan's 16.
    const PagedCacheHost c8 = make_paged_cache({40, 3}, 8, kHkv, kD, KVLayout::NHD, dt, 1);
    const DeviceCache d8 = to_device(c8);
    expect_error([&] { pf.run(dq.view, d8.cache, dout.view, dlse.view); }, {"page_size"});
    const PagedCacheHost cb =
        make_paged_cache({40, 3}, kPage, kHkv, kD, KVLayout::NHD, DType::bf16, 1);
    const DeviceCache db = to_device(cb);
    expect_error([&] { pf.run(dq.view, db.cache, dout.view, dlse.view); },
                 {"paged_kv.k", "kv_dtype"});
    const PagedCacheHost c1 = make_paged_cache({40, 3}, kPage, 1, kD, KVLayout::NHD, dt, 1);
    const DeviceCache d1 = to_device(c1);
    expect_error([&] { pf.run(dq.view, d1.cache, dout.view, dlse.view); }, {"num_kv_heads"});
    PagedKVCache short_indices = dc.cache;  // 2 of the 4 page ids the plan needs
    short_indices.indices = dc.cache.indices.slice0(0, 2);
    expect_error([&] { pf.run(dq.view, short_indices, dout.view, dlse.view); }, {"indices"});
  }
  expect_capture_refused([&](Stream s) { pf.run(dq.view, dc.cache, dout.view, dlse.view, s); });
  expect_untouched(dout, out, dlse, lse);

  // Still usable: the valid plan runs and is right.
  pf.run(dq.view, dc.cache, dout.view, dlse.view);
  synchronize();
  HostTensor got(dt, {23, kHqo, kD}), got_lse(DType::f32, {23, kHqo});
  to_host(dout, got);
  to_host(dlse, got_lse);
  HostTensor ref(DType::f32, {23, kHqo, kD}), ref_lse(DType::f32, {23, kHqo});
  AttentionOptions ao;
  ao.causal = true;
  reference::batch_prefill_paged(q.view(), qo.view(), cache.cache, ref.view(), ref_lse.view(), ao);
  EXPECT_TRUE(
      matches_reference(got.to_doubles(), ref.to_doubles(), rounded_to(ref, dt).to_doubles(), dt));
  EXPECT_LE(rel_err(got_lse.to_doubles(), ref_lse.to_doubles()), 1e-4);
}

TEST_F(PrefillGraphGpu, RaggedBadInputsRaiseNamedErrorsAndLeaveOutputUntouched) {
  const DType dt = DType::bf16;
  const BatchPrefillConfig cfg = prefill_config(4, 64, kHqo, kD);
  DeviceBuffer ws(BatchPrefillRagged::workspace_bytes(cfg));
  expect_short_workspace_refused<BatchPrefillRagged>(cfg, ws);
  BatchPrefillRagged pf(cfg, ws.data(), ws.size());

  const HostTensor qo = indptr_of({20, 3}), kv = indptr_of({40, 3});  // 23 query, 43 KV rows
  HostTensor q(dt, {23, kHqo, kD}), k(dt, {43, kHkv, kD}), v(dt, {43, kHkv, kD});
  HostTensor out(dt, {23, kHqo, kD}), lse(DType::f32, {23, kHqo});
  q.fill_random(1);
  k.fill_random(2);
  v.fill_random(3);
  const DeviceTensor dq = to_device(q), dk = to_device(k), dv = to_device(v);
  const DeviceTensor dout = poisoned_like(out), dlse = poisoned_like(lse);
  const int32_t* qp = qo.view().data_as<int32_t>();
  const int32_t* kp = kv.view().data_as<int32_t>();
  // Ragged KV: no last-page lengths, page_size 0.
  const PrefillBatch good{.qo_indptr = qp,
                          .kv_indptr = kp,
                          .kv_last_page_len = nullptr,
                          .batch_size = 2,
                          .page_size = 0};
  const AttentionShape shape{.num_qo_heads = kHqo,
                             .num_kv_heads = kHkv,
                             .head_dim = kD,
                             .q_dtype = dt,
                             .kv_dtype = dt,
                             .o_dtype = dt};
  PrefillPlanOptions causal;
  causal.causal = true;

  expect_error([&] { pf.run(dq.view, dk.view, dv.view, dout.view, dlse.view); }, {"plan"});
  const std::vector<int32_t> qo_bad = {0, 20, 3}, kv_bad = {0, 40, 30};
  expect_error([&] { pf.plan(with(good, &PrefillBatch::qo_indptr, qo_bad.data()), shape, causal); },
               {"qo_indptr[2]"});
  expect_error([&] { pf.plan(with(good, &PrefillBatch::kv_indptr, kv_bad.data()), shape, causal); },
               {"kv_indptr[2]"});
  expect_error([&] { pf.plan(good, with(shape, &AttentionShape::head_dim, 96), causal); },
               {"head_dim"});
  expect_error([&] { pf.plan(good, with(shape, &AttentionShape::kv_dtype, DType::f16), causal); },
               {"kv_dtype"});
  expect_error([&] { pf.plan(with(good, &PrefillBatch::batch_size, 5), shape, causal); },
               {"batch_size"});

  pf.plan(good, shape, causal);
  {
    const DeviceTensor dk42 = to_device(HostTensor(dt, {42, kHkv, kD}));  // kv_indptr[2] is 43
    expect_error([&] { pf.run(dq.view, dk42.view, dv.view, dout.view, dlse.view); },
                 {"k:", "nnz_kv", "kv_indptr"});
    const DeviceTensor dk1 = to_device(HostTensor(dt, {43, 1, kD}));
    expect_error([&] { pf.run(dq.view, dk1.view, dv.view, dout.view, dlse.view); }, {"k:"});
    const DeviceTensor dvh = to_device(HostTensor(DType::f16, {43, kHkv, kD}));
    expect_error([&] { pf.run(dq.view, dk.view, dvh.view, dout.view, dlse.view); }, {"v:"});
    const DeviceTensor dq22 = to_device(HostTensor(dt, {22, kHqo, kD}));
    expect_error([&] { pf.run(dq22.view, dk.view, dv.view, dout.view, dlse.view); }, {"q:"});
    expect_error([&] { pf.run(dq.view, k.view(), v.view(), dout.view, dlse.view); }, {"k:"});
  }
  expect_capture_refused(
      [&](Stream s) { pf.run(dq.view, dk.view, dv.view, dout.view, dlse.view, s); });
  expect_untouched(dout, out, dlse, lse);
}

}  // namespace
}  // namespace flashkv::test
