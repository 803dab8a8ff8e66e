// Batch decode and CUDA graphs: capture run() once, re-plan for 60 changing batches, replay,
// check every output; batch invariance with fixed_split_size; and the bad-input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu_util.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "gpu/decode_case.h"
#include "runtime/driver.h"

namespace flashkv::test {
namespace {

using runtime::check_cu;
using runtime::driver;

constexpr int kHqo = 32, kHkv = 8, kD = 128, kPage = 16;

// The heads of every plan here, with q, KV and out in `dt`.
AttentionShape shape_in(DType dt) {
  return {.num_qo_heads = kHqo,
          .num_kv_heads = kHkv,
          .head_dim = kD,
          .q_dtype = dt,
          .kv_dtype = dt,
          .o_dtype = dt};
}

// A fixed pool of pages on host and device; each step picks pages for its batch from the pool.
struct Pool {
  int num_pages;
  HostTensor k, v;
  DeviceTensor dk, dv;
  explicit Pool(int pages, DType dt) : num_pages(pages) {
    k = HostTensor(dt, {pages, kPage, kHkv, kD});
    v = HostTensor(dt, {pages, kPage, kHkv, kD});
    k.fill_random(91);
    v.fill_random(92);
    dk = to_device(k);
    dv = to_device(v);
  }
};

struct Batch {
  std::vector<int64_t> lens;
  HostTensor indptr, indices, last;
};

Batch make_batch(const std::vector<int64_t>& lens, int pool_pages, std::mt19937& rng) {
  Batch b;
  b.lens = lens;
  std::vector<int64_t> indptr{0}, last, idx;
  std::vector<int64_t> perm(pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  for (int64_t len : lens) {
    const int64_t pages = (len + kPage - 1) / kPage;
    for (int64_t p = 0; p < pages; ++p) idx.push_back(perm[next++ % perm.size()]);
    indptr.push_back(indptr.back() + pages);
    last.push_back(pages ? len - (pages - 1) * kPage : 0);
  }
  if (idx.empty()) idx.push_back(0);
  b.indptr = make_i32(indptr);
  b.indices = make_i32(idx);
  b.last = make_i32(last);
  return b;
}

PagedKVCache host_cache(const Pool& pool, const Batch& b) {
  PagedKVCache c;
  c.k = pool.k.view();
  c.v = pool.v.view();
  c.indptr = b.indptr.view();
  c.indices = TensorView(const_cast<void*>(b.indices.data()), DType::i32,
                         {static_cast<int64_t>(b.indptr.get(b.lens.size()))});
  c.last_page_len = b.last.view();
  return c;
}

class DecodeGraphGpu : public GpuTest {};

// ws_extra < 0: the workspace that never limits splitting; else min_workspace_bytes + ws_extra
// (a caller's small fixed buffer: the plans must fit their splits into it, and say so).
void replays_across_replans(int64_t ws_extra) {
  const DType dt = DType::f16;
  const int kMaxBatch = 64;
  Pool pool(9000, dt);  // 144k tokens: room for the 30k request and the rest
  BatchDecodeConfig cfg{kMaxBatch, kHqo, kD};
  DeviceBuffer ws(ws_extra < 0
                      ? BatchDecode::workspace_bytes(cfg)
                      : BatchDecode::min_workspace_bytes(cfg) + static_cast<size_t>(ws_extra));
  bool any_limited = false;
  BatchDecode dec(cfg, ws.data(), ws.size());
  DecodePlanOptions opts;
  opts.enable_cuda_graph = true;

  HostTensor q_all(dt, {kMaxBatch, kHqo, kD});
  HostTensor out_all(dt, {kMaxBatch, kHqo, kD});
  DeviceTensor dq = to_device(q_all), dout = poisoned_like(out_all);
  DeviceBuffer d_indices(pool.num_pages * sizeof(int32_t) * 2);
  HostTensor lse_all(DType::f32, {kMaxBatch, kHqo});
  DeviceTensor dlse = poisoned_like(lse_all);
  Stream s = create_stream();
  std::mt19937 rng(1);

  // Capture with a full batch.
  std::vector<int64_t> lens(kMaxBatch, 100);
  Batch b = make_batch(lens, pool.num_pages, rng);
  dec.plan({.kv_indptr = b.indptr.view().data_as<int32_t>(),
            .kv_last_page_len = b.last.view().data_as<int32_t>(),
            .batch_size = kMaxBatch,
            .page_size = kPage},
           shape_in(dt), opts, s);
  PagedKVCache dc;
  dc.k = pool.dk.view;
  dc.v = pool.dv.view;
  dc.indices = TensorView(d_indices.data(), DType::i32, {pool.num_pages * 2}, Device::cuda(0));
  HostTensor indptr_dummy = b.indptr, last_dummy = b.last;
  auto dindptr = to_device(indptr_dummy), dlast = to_device(last_dummy);
  dc.indptr = dindptr.view;
  dc.last_page_len = dlast.view;
  synchronize(s);
  const auto& d = driver();
  check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture");
  dec.run(dq.view, dc, dout.view, dlse.view, s);
  CUgraph graph;
  check_cu(d.cuStreamEndCapture(s, &graph), "end capture");
  CUgraphExec exec;
  check_cu(d.cuGraphInstantiate(&exec, graph, 0), "instantiate");

  // 60 steps: requests join, leave, grow; at step 30 one becomes very long (30000 tokens, split
  // across CTAs) and it leaves at step 40, so ten re-plans carry it.
  std::vector<int64_t> cur = {5, 300, 1};
  for (int step = 0; step < 60; ++step) {
    for (auto& l : cur) l += 1;  // every request grows by one token
    if (step % 3 == 0 && cur.size() < kMaxBatch) cur.push_back(rng() % 2000);  // a request joins
    if (step % 7 == 6 && cur.size() > 1) cur.erase(cur.begin() + rng() % cur.size());  // one leaves
    if (step == 30) cur[0] = 30000;  // one becomes very long
    if (step == 40) std::erase_if(cur, [](int64_t l) { return l >= 30000; });  // and leaves
    if (step == 45) cur.push_back(0);                                          // an empty request
    Batch sb = make_batch(cur, pool.num_pages, rng);
    const int B = static_cast<int>(cur.size());
    HostTensor q(dt, {B, kHqo, kD});
    q.fill_random(1000 + step);
    dq.buf.copy_from_host(q.data(), q.nbytes());
    d_indices.copy_from_host(sb.indices.data(), sb.indices.nbytes());
    dout.buf.fill_bytes(0xff);
    dlse.buf.fill_bytes(0xff);  // so a replay that skips the LSE shows, step by step
    dec.plan({.kv_indptr = sb.indptr.view().data_as<int32_t>(),
              .kv_last_page_len = sb.last.view().data_as<int32_t>(),
              .batch_size = B,
              .page_size = kPage},
             shape_in(dt), opts, s);
    check_cu(d.cuGraphLaunch(exec, s), "graph launch");
    synchronize(s);
    const BatchDecode::PlanInfo info = dec.plan_info();
    EXPECT_LE(info.num_partial_states, info.slot_capacity) << "step " << step;
    any_limited = any_limited || info.split_limited;

    HostTensor ref(DType::f32, {B, kHqo, kD}), ref_lowp(dt, {B, kHqo, kD});
    HostTensor ref_lse(DType::f32, {B, kHqo});
    reference::batch_decode(q.view(), host_cache(pool, sb), ref.view(), ref_lse.view());
    for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));  // as decode_case.cpp
    HostTensor got(dt, {B, kHqo, kD}), got_lse(DType::f32, {B, kHqo});
    dout.buf.copy_to_host(got.data(), got.nbytes());
    dlse.buf.copy_to_host(got_lse.data(), got_lse.nbytes());
    const auto got_d = got.to_doubles(), ref_d = ref.to_doubles(),
               ref_lowp_d = ref_lowp.to_doubles();
    EXPECT_TRUE(matches_reference(got_d, ref_d, ref_lowp_d, dt))
        << "step " << step << " batch " << B;
    EXPECT_TRUE(every_request_passes(
        check_tolerance_per_request(got_d, ref_d, ref_lowp_d, B, tolerance_floor(dt))))
        << "step " << step << " batch " << B;
    // LSE: the same bound as decode_case.cpp, whole batch and per request (an empty request's
    // -inf compares equal).
    const auto lse_d = got_lse.to_doubles(), ref_lse_d = ref_lse.to_doubles();
    EXPECT_FALSE(any_nan(lse_d)) << "step " << step << ": an LSE row was not written";
    EXPECT_LE(rel_err(lse_d, ref_lse_d), 1e-4) << "step " << step << " batch " << B;
    EXPECT_TRUE(every_request_within(rel_err_per_request(lse_d, ref_lse_d, B), 1e-4))
        << "step " << step << " batch " << B << " (lse)";
  }
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  destroy_stream(s);
  if (ws_extra >= 0) EXPECT_TRUE(any_limited) << "the small workspace never limited a plan";
  if (ws_extra < 0) EXPECT_FALSE(any_limited);
}

TEST_F(DecodeGraphGpu, CapturedRunReplaysCorrectlyAcrossReplans) { replays_across_replans(-1); }

// The same 60 re-plans in a buffer with room for ~470 partial-state rows (min + 256 KB): the long
// request's plans fit fewer, longer chunks; every replay still matches the reference.
TEST_F(DecodeGraphGpu, CapturedRunReplaysInASmallWorkspace) { replays_across_replans(1 << 18); }

// Batch invariance (fixed_split_size): one request's output is bitwise the same whatever else is
// in the batch, at any position, planned with or without enable_cuda_graph, run eagerly, from a
// graph captured for its batch, or from one graph captured once and replayed after re-plans for
// other batches (peers lose this once split-KV and graphs meet: flashinfer#2424, sglang#10417).
TEST_F(DecodeGraphGpu, FixedSplitSizeIsBatchInvariantEagerAndReplayed) {
  const DType dt = DType::bf16;
  const int kMaxBatch = 16;
  Pool pool(2000, dt);
  BatchDecodeConfig cfg{kMaxBatch, kHqo, kD};
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  DecodePlanOptions graph_opts;
  graph_opts.fixed_split_size = 256;
  graph_opts.enable_cuda_graph = true;
  DecodePlanOptions eager_opts = graph_opts;
  eager_opts.enable_cuda_graph = false;
  const size_t row_bytes = size_t{kHqo} * kD * dtype_size(dt);
  std::mt19937 rng(3);

  // The request under test, x: 3000 tokens (12 chunks), always the same pages and query.
  HostTensor qx(dt, {1, kHqo, kD});
  qx.fill_random(77);
  std::vector<int32_t> x_pages;
  for (int i = 0; i < 188; ++i) x_pages.push_back(1500 + i);  // ceil(3000/16) = 188 pages

  // x at x_pos among `others`, whose pages come from [0, 1500); their queries vary by batch.
  struct XBatch {
    int size = 0, x_pos = 0;
    HostTensor q, indptr, last, indices;
  };
  const auto make_x_batch = [&](const std::vector<int64_t>& others, int x_pos) {
    std::vector<int64_t> lens = others;
    lens.insert(lens.begin() + x_pos, 3000);
    std::vector<int64_t> indptr{0}, last, idx;
    int next = 0;
    for (size_t i = 0; i < lens.size(); ++i) {
      const int64_t pages = (lens[i] + kPage - 1) / kPage;
      for (int64_t p = 0; p < pages; ++p)
        idx.push_back(static_cast<int>(i) == x_pos ? x_pages[p] : (next++ % 1500));
      indptr.push_back(indptr.back() + pages);
      last.push_back(pages ? lens[i] - (pages - 1) * kPage : 0);
    }
    XBatch b;
    b.size = static_cast<int>(lens.size());
    b.x_pos = x_pos;
    b.q = HostTensor(dt, {b.size, kHqo, kD});
    b.q.fill_random(5 + b.size);
    std::memcpy(static_cast<char*>(b.q.data()) + x_pos * row_bytes, qx.data(), row_bytes);
    b.indptr = make_i32(indptr);
    b.last = make_i32(last);
    b.indices = make_i32(idx);
    return b;
  };
  const auto plan = [&](const XBatch& b, const DecodePlanOptions& opts, Stream s) {
    dec.plan({.kv_indptr = b.indptr.view().data_as<int32_t>(),
              .kv_last_page_len = b.last.view().data_as<int32_t>(),
              .batch_size = b.size,
              .page_size = kPage},
             shape_in(dt), opts, s);
  };
  // x's row of a device output, as bytes.
  const auto x_row = [&](const DeviceTensor& dout, int x_pos) {
    std::vector<uint8_t> row(row_bytes);
    dout.buf.copy_to_host(row.data(), row_bytes, x_pos * row_bytes);
    return row;
  };

  // Plans the batch and runs it eagerly, or captures run() into a graph of its own (on tensors
  // of the batch's size) and launches that once.
  const auto run_batch = [&](const XBatch& b, const DecodePlanOptions& opts, bool graph) {
    auto dq = to_device(b.q), di = to_device(b.indptr), dl = to_device(b.last),
         dx = to_device(b.indices);
    HostTensor out(dt, {b.size, kHqo, kD});
    auto dout = poisoned_like(out);
    PagedKVCache dc;
    dc.k = pool.dk.view;
    dc.v = pool.dv.view;
    dc.indptr = di.view;
    dc.indices = dx.view;
    dc.last_page_len = dl.view;
    Stream s = create_stream();
    plan(b, opts, s);
    if (graph) {
      const auto& d = driver();
      CUgraph g;
      CUgraphExec e;
      check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
      dec.run(dq.view, dc, dout.view, TensorView(), s);
      check_cu(d.cuStreamEndCapture(s, &g), "end capture");
      check_cu(d.cuGraphInstantiate(&e, g, 0), "instantiate");
      check_cu(d.cuGraphLaunch(e, s), "launch");
      synchronize(s);
      d.cuGraphExecDestroy(e);
      d.cuGraphDestroy(g);
      dec.forget_captured_graphs();  // the next batch may be larger than this graph's rows
    } else {
      dec.run(dq.view, dc, dout.view, TensorView(), s);
    }
    synchronize(s);
    destroy_stream(s);
    return x_row(dout, b.x_pos);
  };

  const XBatch lone = make_x_batch({}, 0);
  const auto alone = run_batch(lone, graph_opts, false);
  // The baseline itself is right (a wrong but constant output would be "invariant" too).
  {
    PagedKVCache hc;
    hc.k = pool.k.view();
    hc.v = pool.v.view();
    hc.indptr = lone.indptr.view();
    hc.indices = lone.indices.view();
    hc.last_page_len = lone.last.view();
    HostTensor ref(DType::f32, {1, kHqo, kD}), ref_lowp(dt, {1, kHqo, kD}), got(dt, {1, kHqo, kD});
    reference::batch_decode(qx.view(), hc, ref.view(), TensorView());
    for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));
    std::memcpy(got.data(), alone.data(), row_bytes);
    EXPECT_TRUE(matches_reference(got.to_doubles(), ref.to_doubles(), ref_lowp.to_doubles(), dt));
  }
  const std::vector<std::pair<std::vector<int64_t>, int>> others = {
      {{100, 5000, 7}, 2}, {{1, 1, 1, 1, 900, 12000, 64, 3}, 5}, {{4000, 20}, 1}, {{0, 2999}, 0}};
  for (const auto& [lens, pos] : others) {
    const XBatch b = make_x_batch(lens, pos);
    EXPECT_EQ(alone, run_batch(b, graph_opts, false))
        << "eager (enable_cuda_graph plan): output changed with the rest of the batch, x at "
        << pos;
    EXPECT_EQ(alone, run_batch(b, eager_opts, false))
        << "eager (plan without enable_cuda_graph): output changed, x at " << pos;
    EXPECT_EQ(alone, run_batch(b, graph_opts, true))
        << "graph captured for the batch: output changed, x at " << pos;
  }
  EXPECT_EQ(alone, run_batch(lone, eager_opts, false)) << "plan without enable_cuda_graph";

  // The serving pattern: one graph captured at max_batch rows over the full indices buffer,
  // then plan() + replay per batch.
  HostTensor q_rows(dt, {kMaxBatch, kHqo, kD}), out_rows(dt, {kMaxBatch, kHqo, kD});
  DeviceTensor dq = to_device(q_rows), dout = poisoned_like(out_rows);
  const int64_t kIndices = 4096;  // more than any batch below uses (at most ~1100 pages)
  DeviceBuffer d_indices(kIndices * sizeof(int32_t));
  // The graph-mode run() reads only indices; indptr / last_page_len give it a batch of at least
  // the plan's (their values are the plan's business).
  DeviceTensor dindptr = to_device(HostTensor(DType::i32, {kMaxBatch + 1}));
  DeviceTensor dlast = to_device(HostTensor(DType::i32, {kMaxBatch}));
  PagedKVCache dc;
  dc.k = pool.dk.view;
  dc.v = pool.dv.view;
  dc.indptr = dindptr.view;
  dc.last_page_len = dlast.view;
  dc.indices = TensorView(d_indices.data(), DType::i32, {kIndices}, Device::cuda(0));
  std::vector<XBatch> replayed;
  for (const auto& [lens, pos] : others) replayed.push_back(make_x_batch(lens, pos));
  replayed.push_back(lone);
  std::vector<int64_t> full;  // a full batch: x and 15 others of random lengths
  for (int i = 0; i < kMaxBatch - 1; ++i) full.push_back(rng() % 2000);
  replayed.push_back(make_x_batch(full, 9));
  Stream s = create_stream();
  const auto& d = driver();
  const auto upload = [&](const XBatch& b) {
    dq.buf.copy_from_host(b.q.data(), b.q.nbytes());
    d_indices.copy_from_host(b.indices.data(), b.indices.nbytes());
  };
  upload(replayed.back());
  plan(replayed.back(), graph_opts, s);
  synchronize(s);
  CUgraph graph;
  CUgraphExec exec;
  check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture");
  dec.run(dq.view, dc, dout.view, TensorView(), s);
  check_cu(d.cuStreamEndCapture(s, &graph), "end capture");
  check_cu(d.cuGraphInstantiate(&exec, graph, 0), "instantiate");
  for (size_t i = 0; i < replayed.size(); ++i) {
    const XBatch& b = replayed[i];
    synchronize(s);  // the previous replay is done with q / indices
    upload(b);
    dout.buf.fill_bytes(0xff);
    plan(b, graph_opts, s);
    check_cu(d.cuGraphLaunch(exec, s), "graph launch");
    synchronize(s);
    EXPECT_EQ(alone, x_row(dout, b.x_pos)) << "replayed graph after re-plan " << i << " (batch "
                                           << b.size << ", x at " << b.x_pos << "): output changed";
  }
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  destroy_stream(s);
}

// A captured graph holds fixed q/out/indices pointers, kernel, sm_scale and CTA units: a later
// plan it could not run is refused before the workspace changes; forget_captured_graphs() lifts
// the limits.
TEST_F(DecodeGraphGpu, PlanRefusesWhatACapturedGraphCannotRun) {
  const DType dt = DType::f16;
  BatchDecodeConfig cfg{8, kHqo, kD};
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  PagedCacheHost cache = make_paged_cache({40, 3}, kPage, kHkv, kD, KVLayout::NHD, dt, 2);
  DeviceCache dc = to_device(cache);
  HostTensor q(dt, {2, kHqo, kD}), out(dt, {2, kHqo, kD});
  q.fill_random(3);
  auto dq = to_device(q), dout = poisoned_like(out);
  DecodePlanOptions opts;
  opts.enable_cuda_graph = true;
  const DecodeBatch two{.kv_indptr = cache.indptr.view().data_as<int32_t>(),
                        .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
                        .batch_size = 2,
                        .page_size = kPage};
  const AttentionShape shape = shape_in(dt);
  Stream s = create_stream();
  dec.plan(two, shape, opts, s);
  const int ctas = dec.plan_info().num_ctas;
  const auto& d = driver();
  check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
  // plan() inside a capture is refused too.
  EXPECT_NE(error_of([&] { dec.plan(two, shape, opts, s); }).find("captured"), std::string::npos);
  dec.run(dq.view, dc.cache, dout.view, TensorView(), s);
  CUgraph g;
  check_cu(d.cuStreamEndCapture(s, &g), "end capture");
  // The graph holds 2 rows of q/out: a batch of 3 no longer fits.
  PagedCacheHost bigger = make_paged_cache({40, 3, 5}, kPage, kHkv, kD, KVLayout::NHD, dt, 4);
  const DecodeBatch three{.kv_indptr = bigger.indptr.view().data_as<int32_t>(),
                          .kv_last_page_len = bigger.last_page_len.view().data_as<int32_t>(),
                          .batch_size = 3,
                          .page_size = kPage};
  EXPECT_NE(error_of([&] { dec.plan(three, shape, opts, s); }).find("batch_size"),
            std::string::npos);
  DecodePlanOptions other = opts;
  other.sm_scale = 0.5f;
  EXPECT_NE(error_of([&] { dec.plan(two, shape, other, s); }).find("sm_scale"), std::string::npos);
  // The graph's CTAs share work items in blocks of num_kv_heads CTAs where that divides the grid
  // (decode_plan.cuh): half the heads (the same group, so the same kernel) need other blocks.
  const auto ctas_per_unit = [&](int heads) { return ctas % heads == 0 ? heads : 1; };
  if (ctas_per_unit(kHkv / 2) != ctas_per_unit(kHkv)) {
    const AttentionShape half{.num_qo_heads = kHqo / 2,
                              .num_kv_heads = kHkv / 2,
                              .head_dim = kD,
                              .q_dtype = dt,
                              .kv_dtype = dt,
                              .o_dtype = dt};
    EXPECT_NE(error_of([&] { dec.plan(two, half, opts, s); }).find("units of"), std::string::npos);
  }
  d.cuGraphDestroy(g);
  dec.forget_captured_graphs();
  EXPECT_NO_THROW(dec.plan(three, shape, opts, s));
  synchronize(s);
  destroy_stream(s);
}

// Every refused call throws flashkv::Error naming the argument and writes nothing: out and lse
// are poisoned (0xff bytes) and every byte must still be poison after each refused call.
// (test_decode_bad_input_gpu.cpp has the page-table, dtype, shape and device cases.)
TEST_F(DecodeGraphGpu, BadInputsRaiseNamedErrors) {
  const DType dt = DType::f16;
  BatchDecodeConfig cfg{4, kHqo, kD};
  const size_t need = BatchDecode::workspace_bytes(cfg);
  DeviceBuffer ws(need);
  PagedCacheHost cache = make_paged_cache({40, 3}, kPage, kHkv, kD, KVLayout::NHD, dt, 1);
  DeviceCache dc = to_device(cache);
  HostTensor q(dt, {2, kHqo, kD}), out(dt, {2, kHqo, kD}), lse(DType::f32, {2, kHqo});
  q.fill_random(1);
  auto dq = to_device(q), dout = poisoned_like(out), dlse = poisoned_like(lse);
  auto expect_error = [&](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected flashkv::Error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(all_bytes_are(dout)) << "out written by the call refused for '" << needle << "'";
    EXPECT_TRUE(all_bytes_are(dlse)) << "lse written by the call refused for '" << needle << "'";
  };
  // Below the plan arrays (any buffer from there up works: WorkspaceFitGpu).
  expect_error(
      [&] { BatchDecode small(cfg, ws.data(), BatchDecode::min_workspace_bytes(cfg) - 1); },
      "workspace: expected at least");

  BatchDecode dec(cfg, ws.data(), ws.size());
  const DecodeBatch good{.kv_indptr = cache.indptr.view().data_as<int32_t>(),
                         .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
                         .batch_size = 2,
                         .page_size = kPage};
  const AttentionShape shape = shape_in(dt);
  expect_error([&] { dec.run(dq.view, dc.cache, dout.view, dlse.view); },
               "before a successful plan");
  expect_error([&] { dec.plan(with(good, &DecodeBatch::batch_size, 5), shape); }, "batch_size");
  expect_error([&] { dec.plan(good, with(shape, &AttentionShape::num_kv_heads, 5)); },
               "num_kv_heads");
  expect_error([&] { dec.plan(good, with(shape, &AttentionShape::head_dim, 96)); }, "head_dim");
  expect_error([&] { dec.plan(good, with(shape, &AttentionShape::kv_dtype, DType::bf16)); },
               "kv_dtype");
  std::vector<int32_t> bad_last = {0, 3};
  expect_error(
      [&] { dec.plan(with(good, &DecodeBatch::kv_last_page_len, bad_last.data()), shape); },
      "kv_last_page_len[0]");
  std::vector<int32_t> bad_indptr = {0, 3, 2};
  expect_error([&] { dec.plan(with(good, &DecodeBatch::kv_indptr, bad_indptr.data()), shape); },
               "kv_indptr[2]");
  DecodePlanOptions neg_scale;
  neg_scale.sm_scale = -1.f;
  expect_error([&] { dec.plan(good, shape, neg_scale); }, "sm_scale");
  DecodePlanOptions bad_shape;
  bad_shape.tc_stages = 1;
  expect_error([&] { dec.plan(good, shape, bad_shape); }, "tc_stages");
  bad_shape = {};
  bad_shape.tc_warps = 3;
  expect_error([&] { dec.plan(good, shape, bad_shape); }, "tc_warps");
  bad_shape = {};
  bad_shape.tc_stages = 8;
  bad_shape.tc_warps = 8;  // 8 stages of 128 tokens: 1 MB of shared memory
  expect_error([&] { dec.plan(good, shape, bad_shape); }, "shared memory");
  BatchDecodeConfig neg_ctas = cfg;
  neg_ctas.ctas_per_sm = -1;
  expect_error([&] { (void)BatchDecode::workspace_bytes(neg_ctas); }, "ctas_per_sm");
  DecodePlanOptions check_idx;
  std::vector<int32_t> bad_idx = {0, 1, 99, 3};
  check_idx.kv_indices_host = bad_idx.data();
  check_idx.num_pages = cache.cache.num_pages();
  expect_error([&] { dec.plan(good, shape, check_idx); }, "kv_indices[2]");

  // A plan() that throws leaves the object unplanned, never half-planned (batch_decode.cpp), even
  // after a successful one: run() is then refused rather than run on a stale plan.
  dec.plan(good, shape);
  expect_error([&] { dec.plan(good, with(shape, &AttentionShape::kv_dtype, DType::bf16)); },
               "kv_dtype");
  expect_error([&] { dec.run(dq.view, dc.cache, dout.view, dlse.view); },
               "before a successful plan");

  dec.plan(good, shape);
  HostTensor q3(dt, {3, kHqo, kD});
  auto dq3 = to_device(q3);
  expect_error([&] { dec.run(dq3.view, dc.cache, dout.view, dlse.view); }, "q:");
  expect_error([&] { dec.run(q.view(), dc.cache, dout.view, dlse.view); }, "q:");  // host tensor
  HostTensor lse_bad(DType::f16, {2, kHqo});
  auto dlse_bad = poisoned_like(lse_bad);
  expect_error([&] { dec.run(dq.view, dc.cache, dout.view, dlse_bad.view); }, "lse");
  EXPECT_TRUE(all_bytes_are(dlse_bad)) << "the refused f16 lse was written";
  // A page stride of 2^32 bytes or more (the kernels keep in-page and page offsets in 32 bits):
  // refused before anything is read.
  {
    PagedKVCache wide = dc.cache;
    const int64_t shape[4] = {dc.cache.k.size(0), kPage, kHkv, kD};
    const int64_t strides[4] = {int64_t{1} << 31, int64_t{kHkv} * kD, kD, 1};  // 2^32 bytes at f16
    wide.k = TensorView(dc.cache.k.data(), dt, 4, shape, strides, dc.cache.k.device());
    wide.v = TensorView(dc.cache.v.data(), dt, 4, shape, strides, dc.cache.v.device());
    expect_error([&] { dec.run(dq.view, wide, dout.view, dlse.view); }, "2^32");
  }
  // Capturing run() of a plan made without enable_cuda_graph is refused.
  Stream s = create_stream();
  const auto& d = driver();
  check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
  try {
    dec.run(dq.view, dc.cache, dout.view, dlse.view, s);
    ADD_FAILURE() << "expected flashkv::Error containing 'enable_cuda_graph'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("enable_cuda_graph"), std::string::npos) << e.what();
  }
  CUgraph g = nullptr;
  d.cuStreamEndCapture(s, &g);
  if (g) d.cuGraphDestroy(g);
  destroy_stream(s);
  // (Checked after the capture ended: a synchronizing copy is not allowed during one.)
  EXPECT_TRUE(all_bytes_are(dout)) << "a refused capture wrote out";
  EXPECT_TRUE(all_bytes_are(dlse)) << "a refused capture wrote lse";
}

}  // namespace
}  // namespace flashkv::test
