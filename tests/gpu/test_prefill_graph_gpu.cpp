// Batch prefill and CUDA graphs: capture run() once, then re-plan for changing batches (requests
// join, leave, grow; one long-context request splits across CTAs), replay, and check every output
// (paged and ragged KV); batch invariance of fixed_split_size + tile_rows, eagerly and replayed;
// and what a captured graph cannot run. The bad-input tests of the same suite are in
// test_prefill_bad_input_gpu.cpp; the helpers both files use are in prefill_graph_util.h.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashkv/reference.h"
#include "gpu/prefill_case.h"
#include "gpu/prefill_graph_util.h"
#include "runtime/kernel_cache.h"  // device_arch

namespace flashkv::test {
namespace {

constexpr int kHqo = 8, kHkv = 2, kD = 128, kPage = 16;
constexpr int kTileRows = 64;  // fixed in every graph test: the captured kernel must not change

// The heads of every plan here, with q, KV and out in `dt`.
AttentionShape shape_in(DType dt) {
  return {.num_qo_heads = kHqo,
          .num_kv_heads = kHkv,
          .head_dim = kD,
          .q_dtype = dt,
          .kv_dtype = dt,
          .o_dtype = dt};
}

// The bytes of rows [first_row, first_row + rows) of a tensor (dimension 0 is the row).
std::vector<uint8_t> bytes_of(const HostTensor& t, int64_t first_row, int64_t rows) {
  if (t.shape()[0] == 0) return {};
  const int64_t row_bytes = static_cast<int64_t>(t.nbytes()) / t.shape()[0];
  const auto* p = static_cast<const uint8_t*>(t.data()) + first_row * row_bytes;
  return std::vector<uint8_t>(p, p + rows * row_bytes);
}

// A fixed pool of NHD pages on host and device; each batch picks its pages from it.
struct Pool {
  int num_pages;
  HostTensor k, v;
  DeviceTensor dk, dv;
  Pool(int pages, DType dt, uint64_t seed) : num_pages(pages) {
    k = HostTensor(dt, {pages, kPage, kHkv, kD});
    v = HostTensor(dt, {pages, kPage, kHkv, kD});
    k.fill_random(seed);
    v.fill_random(seed + 1);
    dk = to_device(k);
    dv = to_device(v);
  }
  // The pool's pages on the host / on the device under a batch's index tensors.
  PagedKVCache host_cache(const TensorView& indptr, const TensorView& indices,
                          const TensorView& last_page_len) const {
    return {k.view(), v.view(), KVLayout::NHD, indptr, indices, last_page_len};
  }
  PagedKVCache device_cache(const TensorView& indptr, const TensorView& indices,
                            const TensorView& last_page_len) const {
    return {dk.view, dv.view, KVLayout::NHD, indptr, indices, last_page_len};
  }
};

// The host page table (and qo_indptr) of one batch over a Pool.
struct PagedBatch {
  std::vector<Req> reqs;
  std::vector<int64_t> qo_lens;
  int64_t nnz_qo = 0;
  HostTensor qo_indptr, kv_indptr, indices, last;  // kv_indptr counts pages
  int batch() const { return static_cast<int>(reqs.size()); }
  const int32_t* qo_ptr() const { return qo_indptr.view().data_as<int32_t>(); }
  const int32_t* kv_ptr() const { return kv_indptr.view().data_as<int32_t>(); }
  const int32_t* last_ptr() const { return last.view().data_as<int32_t>(); }
  // The table as plan()'s batch.
  PrefillBatch plan_batch() const {
    return {.qo_indptr = qo_ptr(),
            .kv_indptr = kv_ptr(),
            .kv_last_page_len = last_ptr(),
            .batch_size = batch(),
            .page_size = kPage};
  }
  // `page_of(request, p)` is the pool page holding the request's tokens [p * kPage, ...).
  template <class PageOf>
  PagedBatch(const std::vector<Req>& r, PageOf&& page_of) : reqs(r) {
    std::vector<int64_t> indptr{0}, idx, lp;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const int64_t pages = (reqs[i].kv + kPage - 1) / kPage;
      for (int64_t p = 0; p < pages; ++p) idx.push_back(page_of(i, p));
      indptr.push_back(indptr.back() + pages);
      lp.push_back(pages ? reqs[i].kv - (pages - 1) * kPage : 0);
      qo_lens.push_back(reqs[i].qo);
      nnz_qo += reqs[i].qo;
    }
    qo_indptr = indptr_of(qo_lens);
    kv_indptr = make_i32(indptr);
    indices = make_i32(idx);
    last = make_i32(lp);
  }
  PagedKVCache host_cache(const Pool& pool) const {
    return pool.host_cache(kv_indptr.view(), indices.view(), last.view());
  }
};

// tile_rows 64 runs the mma.sync kernel; 128 (on sm_90a) the wgmma kernel in its warp-specialized
// form with TMA loads (its tensor maps are captured with the graph).
void captured_paged_run_replays_across_replans(int tile_rows) {
  const DType dt = DType::f16;
  const int kMaxBatch = 16;
  const int64_t kQoCap = 1024;
  const int kIdxCap = 8192;
  Pool pool(4096, dt, 91);
  const BatchPrefillConfig cfg = prefill_config(kMaxBatch, kQoCap, kHqo, kD);
  DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
  BatchPrefillPaged pf(cfg, ws.data(), ws.size());
  const PrefillPlanOptions opts = graph_plan_options(tile_rows);

  // What the graph holds: q/out/lse of kQoCap rows, kv_indices of kIdxCap entries.
  HostTensor q_cap(dt, {kQoCap, kHqo, kD}), out_cap(dt, {kQoCap, kHqo, kD});
  HostTensor lse_cap(DType::f32, {kQoCap, kHqo});
  q_cap.fill_random(5);
  DeviceTensor dq = to_device(q_cap), dout = poisoned_like(out_cap), dlse = poisoned_like(lse_cap);
  DeviceTensor dout_eager = poisoned_like(out_cap), dlse_eager = poisoned_like(lse_cap);
  DeviceBuffer d_indices(kIdxCap * sizeof(int32_t));
  d_indices.fill_bytes(0);
  std::mt19937 rng(7);
  auto random_pages = [&](size_t, int64_t) { return static_cast<int64_t>(rng() % pool.num_pages); };

  // Capture with a full batch: kMaxBatch requests holding kQoCap query tokens. run() reads only
  // kv.indices of kv's index tensors; indptr and last_page_len are the capture batch's.
  const PagedBatch cap(std::vector<Req>(kMaxBatch, Req{kQoCap / kMaxBatch, 200}), random_pages);
  const DeviceTensor dindptr = to_device(cap.kv_indptr), dlast = to_device(cap.last);
  const PagedKVCache dc = pool.device_cache(
      dindptr.view, TensorView(d_indices.data(), DType::i32, {kIdxCap}, Device::cuda(0)),
      dlast.view);
  ScopedStream s;
  d_indices.copy_from_host(cap.indices.data(), cap.indices.nbytes());
  pf.plan(cap.plan_batch(), shape_in(dt), opts, s);
  synchronize(s);
  Graph g;
  capture(g, s, [&] { pf.run(dq.view, dc, dout.view, dlse.view, s); });

  AttentionOptions ao;
  ao.causal = true;
  const auto trace = serving_trace(24, kMaxBatch, kQoCap, 11);
  int split_steps = 0;
  for (size_t step = 0; step < trace.size(); ++step) {
    const PagedBatch b(trace[step], random_pages);
    ASSERT_LE(b.indices.numel(), kIdxCap);
    ASSERT_LE(b.nnz_qo, kQoCap);
    const int64_t nnz = b.nnz_qo;
    const HostTensor q = upload_random(dq, dt, {nnz, kHqo, kD}, 1000 + step);
    if (b.indices.numel() > 0) d_indices.copy_from_host(b.indices.data(), b.indices.nbytes());
    repoison(dout, dlse);
    pf.plan(b.plan_batch(), shape_in(dt), opts, s);
    g.launch(s);
    synchronize(s);
    std::string tag = step_tag(step, b.batch(), nnz) + " (qo,kv)";
    for (const Req& r : b.reqs)
      tag += " (" + std::to_string(r.qo) + "," + std::to_string(r.kv) + ")";
    if (has_long_context(b.reqs)) {
      EXPECT_GT(pf.plan_info().num_split_tiles, 0) << tag << ": the 20000-token context must split";
      ++split_steps;
    }
    EXPECT_EQ(pf.plan_info().tile_rows, tile_rows) << tag;
    if (tile_rows == 128 && runtime::device_arch(0) == "sm_90a") {
      EXPECT_TRUE(pf.plan_info().wgmma && pf.plan_info().kv_tma) << tag;
    }

    const OutLse ref = reference_rows(nnz, kHqo, kD);
    reference::batch_prefill_paged(q.view(), b.qo_indptr.view(), b.host_cache(pool), ref.out.view(),
                                   ref.lse.view(), ao);
    const OutLse got = read_rows(dout, dlse, dt, nnz, kHqo, kD);
    expect_matches_reference(got, ref, dt, tag);

    // Every fourth step: run() eagerly on the same plan writes the same bits as the replay.
    if (step % 4 == 3 && nnz > 0) {
      repoison(dout_eager, dlse_eager);
      pf.run(dq.view, dc, dout_eager.view, dlse_eager.view, s);
      synchronize(s);
      const OutLse eager = read_rows(dout_eager, dlse_eager, dt, nnz, kHqo, kD);
      EXPECT_EQ(bytes_of(eager.out, 0, nnz), bytes_of(got.out, 0, nnz))
          << tag << ": eager vs replay";
      EXPECT_EQ(bytes_of(eager.lse, 0, nnz), bytes_of(got.lse, 0, nnz)) << tag << ": lse";
    }
  }
  EXPECT_GT(split_steps, 0) << "the trace never carried the long-context request";
}

TEST_F(PrefillGraphGpu, CapturedPagedRunReplaysAcrossReplans) {
  captured_paged_run_replays_across_replans(kTileRows);
}

TEST_F(PrefillGraphGpu, CapturedPagedWgmmaRunReplaysAcrossReplans) {
  captured_paged_run_replays_across_replans(128);
}

TEST_F(PrefillGraphGpu, CapturedRaggedRunReplaysAcrossReplans) {
  const DType dt = DType::bf16;
  const int kMaxBatch = 12;
  const int64_t kQoCap = 768, kKvCap = 40000;
  const BatchPrefillConfig cfg = prefill_config(kMaxBatch, kQoCap, kHqo, kD);
  DeviceBuffer ws(BatchPrefillRagged::workspace_bytes(cfg));
  BatchPrefillRagged pf(cfg, ws.data(), ws.size());
  const PrefillPlanOptions opts = graph_plan_options(kTileRows);

  // What the graph holds: q/out/lse of kQoCap rows, k/v of kKvCap rows.
  HostTensor q_cap(dt, {kQoCap, kHqo, kD}), out_cap(dt, {kQoCap, kHqo, kD});
  HostTensor lse_cap(DType::f32, {kQoCap, kHqo}), kv_cap(dt, {kKvCap, kHkv, kD});
  q_cap.fill_random(21);
  kv_cap.fill_random(22);
  DeviceTensor dq = to_device(q_cap), dk = to_device(kv_cap), dv = to_device(kv_cap);
  DeviceTensor dout = poisoned_like(out_cap), dlse = poisoned_like(lse_cap);

  std::vector<int64_t> cap_qo(kMaxBatch, kQoCap / kMaxBatch), cap_kv(kMaxBatch, 100);
  const HostTensor cap_qo_ptr = indptr_of(cap_qo), cap_kv_ptr = indptr_of(cap_kv);
  ScopedStream s;
  pf.plan({.qo_indptr = cap_qo_ptr.view().data_as<int32_t>(),
           .kv_indptr = cap_kv_ptr.view().data_as<int32_t>(),
           .kv_last_page_len = nullptr,
           .batch_size = kMaxBatch,
           .page_size = 0},
          shape_in(dt), opts, s);
  synchronize(s);
  Graph g;
  capture(g, s, [&] { pf.run(dq.view, dk.view, dv.view, dout.view, dlse.view, s); });

  AttentionOptions ao;
  ao.causal = true;
  const auto trace = serving_trace(20, kMaxBatch, kQoCap, 12);
  int split_steps = 0;
  for (size_t step = 0; step < trace.size(); ++step) {
    std::vector<int64_t> qo_lens, kv_lens;
    for (const Req& r : trace[step]) {
      qo_lens.push_back(r.qo);
      kv_lens.push_back(r.kv);
    }
    const HostTensor qo_ptr = indptr_of(qo_lens), kv_ptr = indptr_of(kv_lens);
    const int B = static_cast<int>(qo_lens.size());
    const int64_t nnz = qo_ptr.get(B), nnz_kv = kv_ptr.get(B);
    ASSERT_LE(nnz, kQoCap);
    ASSERT_LE(nnz_kv, kKvCap);
    // Fresh queries and KV every step.
    const HostTensor q = upload_random(dq, dt, {nnz, kHqo, kD}, 2000 + step);
    const HostTensor k = upload_random(dk, dt, {nnz_kv, kHkv, kD}, 3000 + step);
    const HostTensor v = upload_random(dv, dt, {nnz_kv, kHkv, kD}, 4000 + step);
    repoison(dout, dlse);
    pf.plan({.qo_indptr = qo_ptr.view().data_as<int32_t>(),
             .kv_indptr = kv_ptr.view().data_as<int32_t>(),
             .kv_last_page_len = nullptr,
             .batch_size = B,
             .page_size = 0},
            shape_in(dt), opts, s);
    g.launch(s);
    synchronize(s);
    const std::string tag = step_tag(step, B, nnz) + " nnz_kv " + std::to_string(nnz_kv);
    if (has_long_context(trace[step])) {
      EXPECT_GT(pf.plan_info().num_split_tiles, 0) << tag;
      ++split_steps;
    }

    const OutLse ref = reference_rows(nnz, kHqo, kD);
    reference::batch_prefill_ragged(q.view(), qo_ptr.view(), k.view(), v.view(), kv_ptr.view(),
                                    ref.out.view(), ref.lse.view(), ao);
    expect_matches_reference(read_rows(dout, dlse, dt, nnz, kHqo, kD), ref, dt, tag);
  }
  EXPECT_GT(split_steps, 0) << "the trace never carried the long-context request";
}

// With fixed_split_size and a fixed tile_rows, request X's output (and lse) is bitwise the same
// whatever else is in the batch and wherever X sits in it, eagerly or replayed from a graph.
TEST_F(PrefillGraphGpu, FixedSplitAndTileRowsAreBatchInvariantEagerAndReplayed) {
  const DType dt = DType::bf16;
  Pool pool(2000, dt, 93);
  const BatchPrefillConfig cfg = prefill_config(16, 4096, kHqo, kD);
  DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
  BatchPrefillPaged pf(cfg, ws.data(), ws.size());
  // X: 40 query tokens appended to 3000 KV tokens; its tiles see up to 3000 keys: six chunks of
  // 512, so X itself goes through the merge. Its query and pages (1500..1687) never change.
  constexpr int64_t kXQo = 40, kXKv = 3000, kXFirstPage = 1500;
  HostTensor qx(dt, {kXQo, kHqo, kD});
  qx.fill_random(77);
  const int64_t row_bytes = kHqo * kD * static_cast<int64_t>(dtype_size(dt));
  struct Rows {
    std::vector<uint8_t> out, lse;
  };

  auto run_batch = [&](const std::vector<Req>& others, int x_pos, bool graph_plan,
                       bool replay) -> Rows {
    std::vector<Req> reqs = others;
    reqs.insert(reqs.begin() + x_pos, Req{kXQo, kXKv});
    int64_t next = 0;
    const PagedBatch b(reqs, [&](size_t i, int64_t p) {
      return static_cast<int>(i) == x_pos ? kXFirstPage + p : next++ % kXFirstPage;
    });
    const int64_t x_row = b.qo_indptr.get(x_pos);
    HostTensor q(dt, {b.nnz_qo, kHqo, kD});
    q.fill_random(5 + reqs.size());
    std::memcpy(static_cast<char*>(q.data()) + x_row * row_bytes, qx.data(), qx.nbytes());
    const DeviceTensor dq = to_device(q), di = to_device(b.kv_indptr), dx = to_device(b.indices),
                       dl = to_device(b.last);
    HostTensor out(dt, {b.nnz_qo, kHqo, kD}), lse(DType::f32, {b.nnz_qo, kHqo});
    const DeviceTensor dout = poisoned_like(out), dlse = poisoned_like(lse);
    const PagedKVCache dc = pool.device_cache(di.view, dx.view, dl.view);
    PrefillPlanOptions opts;
    opts.causal = true;
    opts.fixed_split_size = 512;
    opts.tile_rows = kTileRows;
    opts.enable_cuda_graph = graph_plan;
    ScopedStream s;
    pf.plan(b.plan_batch(), shape_in(dt), opts, s);
    if (replay) {
      Graph g;
      capture(g, s, [&] { pf.run(dq.view, dc, dout.view, dlse.view, s); });
      g.launch(s);
      synchronize(s);
    } else {
      pf.run(dq.view, dc, dout.view, dlse.view, s);
    }
    synchronize(s);
    pf.forget_captured_graphs();  // the graph is gone: later plans are not bound by it
    EXPECT_GT(pf.plan_info().num_split_tiles, 0);
    to_host(dout, out);
    to_host(dlse, lse);
    if (others.empty()) {  // X alone: also right, not merely stable
      HostTensor ref(DType::f32, {kXQo, kHqo, kD}), ref_lse(DType::f32, {kXQo, kHqo});
      AttentionOptions ao;
      ao.causal = true;
      reference::batch_prefill_paged(q.view(), b.qo_indptr.view(), b.host_cache(pool), ref.view(),
                                     ref_lse.view(), ao);
      EXPECT_TRUE(matches_reference(out.to_doubles(), ref.to_doubles(),
                                    rounded_to(ref, dt).to_doubles(), dt));
      EXPECT_LE(rel_err(lse.to_doubles(), ref_lse.to_doubles()), 1e-4);
    }
    return {bytes_of(out, x_row, kXQo), bytes_of(lse, x_row, kXQo)};
  };

  const Rows alone = run_batch({}, 0, false, false);
  const Rows a = run_batch({{100, 100}, {1, 5000}, {7, 7}}, 2, false, false);
  const Rows b =
      run_batch({{1, 1}, {1, 1}, {1, 1}, {1, 1}, {300, 900}, {64, 2000}, {3, 3}}, 5, false, false);
  const Rows c = run_batch({{4, 4000}, {20, 20}}, 1, true, false);  // planned for graphs, eager
  const Rows d = run_batch({{4, 4000}, {20, 20}}, 1, true, true);   // the same, replayed
  const Rows e = run_batch({{250, 250}}, 0, true, true);
  for (const auto& [name, r] : {std::pair{"a", &a},
                                {"b", &b},
                                {"c (graph plan, eager)", &c},
                                {"d (replayed)", &d},
                                {"e (replayed)", &e}}) {
    EXPECT_EQ(r->out, alone.out) << "batch " << name << ": X's output changed with the batch";
    EXPECT_EQ(r->lse, alone.lse) << "batch " << name << ": X's lse changed with the batch";
  }
}

// A captured graph holds fixed q/out/lse/indices pointers and its kernel: a later plan it could
// not run is refused, one it can run is accepted; forget_captured_graphs() lifts the limits.
TEST_F(PrefillGraphGpu, PlanRefusesWhatACapturedGraphCannotRun) {
  const DType dt = DType::f16;
  const BatchPrefillConfig cfg = prefill_config(8, 512, kHqo, kD);
  DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
  BatchPrefillPaged pf(cfg, ws.data(), ws.size());
  const PagedCacheHost cache = make_paged_cache({40, 3}, kPage, kHkv, kD, KVLayout::NHD, dt, 2);
  const DeviceCache dc0 = to_device(cache);
  // Room for 64 page ids, so the batches below are refused for their queries, not their pages.
  DeviceBuffer d_indices(64 * sizeof(int32_t));
  d_indices.fill_bytes(0);
  d_indices.copy_from_host(cache.indices.data(), cache.indices.nbytes());
  PagedKVCache dc = dc0.cache;
  dc.indices = TensorView(d_indices.data(), DType::i32, {64}, Device::cuda(0));
  const HostTensor qo = indptr_of({20, 3});  // 23 query rows
  HostTensor q(dt, {23, kHqo, kD}), out(dt, {23, kHqo, kD});
  q.fill_random(3);
  const DeviceTensor dq = to_device(q), dout = poisoned_like(out);
  const PrefillPlanOptions opts = graph_plan_options(kTileRows);
  ScopedStream s;
  // plan() on `s` of `batch` requests: queries by `qo_ptr`, KV in the pages of `c`.
  const auto plan = [&](const HostTensor& qo_ptr, const PagedCacheHost& c, int batch,
                        const PrefillPlanOptions& o) {
    pf.plan({.qo_indptr = qo_ptr.view().data_as<int32_t>(),
             .kv_indptr = c.indptr.view().data_as<int32_t>(),
             .kv_last_page_len = c.last_page_len.view().data_as<int32_t>(),
             .batch_size = batch,
             .page_size = kPage},
            shape_in(dt), o, s);
  };
  plan(qo, cache, 2, opts);
  {
    Graph g;
    capture(g, s, [&] {
      // plan() inside a capture is refused (it copies to the workspace and waits on events).
      expect_error([&] { plan(qo, cache, 2, opts); }, {"captur"});
      pf.run(dq.view, dc, dout.view, TensorView(), s);
    });
    // 28 query rows no longer fit the 23 rows of q/out the graph holds.
    const PagedCacheHost bigger =
        make_paged_cache({40, 3, 5}, kPage, kHkv, kD, KVLayout::NHD, dt, 4);
    const HostTensor qo_bigger = indptr_of({20, 3, 5});
    expect_error([&] { plan(qo_bigger, bigger, 3, opts); }, {"qo_indptr", "nnz_qo", "q/out"});
    // Another query tile or sm_scale is another kernel / another argument of the graph's launch.
    PrefillPlanOptions other_tile = opts;
    other_tile.tile_rows = 32;
    expect_error([&] { plan(qo, cache, 2, other_tile); }, {"tile_rows", "kernel"});
    PrefillPlanOptions other_scale = opts;
    other_scale.sm_scale = 0.5f;
    expect_error([&] { plan(qo, cache, 2, other_scale); }, {"sm_scale"});
    // A smaller batch fits: that is what the graph is for.
    const PagedCacheHost smaller = make_paged_cache({100}, kPage, kHkv, kD, KVLayout::NHD, dt, 5);
    const HostTensor qo_smaller = indptr_of({7});
    EXPECT_NO_THROW(plan(qo_smaller, smaller, 1, opts));
    synchronize(s);
    // And bigger ones again once the graph is destroyed and forgotten.
    g.reset();
    pf.forget_captured_graphs();
    EXPECT_NO_THROW(plan(qo_bigger, bigger, 3, opts));
  }
  synchronize(s);
}

}  // namespace
}  // namespace flashkv::test
