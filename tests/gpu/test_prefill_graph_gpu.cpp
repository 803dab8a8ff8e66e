// Batch prefill and CUDA graphs: capture run() once, then re-plan for changing batches (requests
// join, leave, grow; one long-context request splits across CTAs), replay, and check every output
// (paged and ragged KV); batch invariance of fixed_split_size + tile_rows, eagerly and replayed;
// what a captured graph cannot run; and the bad-input errors, which must name the argument and
// leave the output untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "gpu/prefill_case.h"
#include "runtime/driver.h"

namespace flashkv::test {
namespace {

using runtime::check_cu;
using runtime::driver;

constexpr int kHqo = 8, kHkv = 2, kD = 128, kPage = 16;
constexpr int kTileRows = 64;  // fixed in every graph test: the captured kernel must not change

// A captured and instantiated graph, destroyed at scope exit.
struct Graph {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() { reset(); }
  void reset() {
    if (exec) driver().cuGraphExecDestroy(exec);
    if (graph) driver().cuGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
  }
  void launch(Stream s) const { check_cu(driver().cuGraphLaunch(exec, s), "cuGraphLaunch"); }
};

// Captures fn() on `s` into `g`. If fn throws, the capture is ended (and its graph dropped)
// before the exception propagates, so the stream is usable again.
template <class Fn>
void capture(Graph& g, Stream s, Fn&& fn) {
  const auto& d = driver();
  check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture");
  try {
    fn();
  } catch (...) {
    CUgraph dropped = nullptr;
    d.cuStreamEndCapture(s, &dropped);
    if (dropped) d.cuGraphDestroy(dropped);
    throw;
  }
  check_cu(d.cuStreamEndCapture(s, &g.graph), "end capture");
  check_cu(d.cuGraphInstantiate(&g.exec, g.graph, 0), "instantiate");
}

// Expects fn() to throw flashkv::Error whose message contains one of `needles` (the argument).
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<const char*> needles) {
  const std::string msg = error_of(fn);
  bool named = false;
  std::string list;
  for (const char* n : needles) {
    named = named || msg.find(n) != std::string::npos;
    list += std::string(list.empty() ? "'" : ", '") + n + "'";
  }
  EXPECT_TRUE(named) << "the message names none of " << list << ": " << msg;
}

bool all_nan(const HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isnan(t.get(i))) return false;
  }
  return true;
}

// The bytes of rows [first_row, first_row + rows) of a tensor (dimension 0 is the row).
std::vector<uint8_t> bytes_of(const HostTensor& t, int64_t first_row, int64_t rows) {
  if (t.shape()[0] == 0) return {};
  const int64_t row_bytes = static_cast<int64_t>(t.nbytes()) / t.shape()[0];
  const auto* p = static_cast<const uint8_t*>(t.data()) + first_row * row_bytes;
  return std::vector<uint8_t>(p, p + rows * row_bytes);
}

struct Req {
  int64_t qo, kv;
};

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
    return PagedKVCache{.k = pool.k.view(),
                        .v = pool.v.view(),
                        .layout = KVLayout::NHD,
                        .indptr = kv_indptr.view(),
                        .indices = indices.view(),
                        .last_page_len = last.view()};
  }
};

// A serving loop: every running request either takes its next prefill chunk (qo > 1, appended
// after its context) or decodes one token; new prompts join, finished ones leave; at step 8 a
// request with a 20000-token cached context joins and appends 16-token chunks until it leaves at
// step 14 (its tiles split across CTAs: the merge runs inside the replayed graph); at step 17 one
// request has no queries (qo 0). Every step fits max_batch and the query capacity.
std::vector<std::vector<Req>> serving_trace(int steps, int max_batch, int64_t qo_cap,
                                            uint64_t seed) {
  struct Running {
    int64_t ctx, prompt_left;
    bool long_ctx;
  };
  std::mt19937 rng(seed);
  std::vector<Running> run = {{0, 300, false}, {0, 1, false}, {500, 0, false}};
  std::vector<std::vector<Req>> trace;
  for (int step = 0; step < steps; ++step) {
    if (step == 8) {
      if (static_cast<int>(run.size()) >= max_batch) run.erase(run.begin());
      run.push_back({20000, 48, true});
    } else if (static_cast<int>(run.size()) < max_batch) {
      run.push_back({0, static_cast<int64_t>(rng() % 700) + 1, false});
    }
    if (step == 14) std::erase_if(run, [](const Running& r) { return r.long_ctx; });
    if (step % 4 == 3 && run.size() > 1) run.erase(run.begin() + rng() % run.size());
    std::vector<Req> reqs;
    int64_t budget = qo_cap;
    for (size_t i = 0; i < run.size(); ++i) {
      Running& r = run[i];
      const int64_t later = static_cast<int64_t>(run.size() - i - 1);  // one token each, at least
      int64_t qo = 1;
      if (r.long_ctx) {
        qo = std::min<int64_t>(16, budget - later);
      } else if (r.prompt_left > 0) {
        qo = std::min<int64_t>(
            {r.prompt_left, 64 + static_cast<int64_t>(rng() % 192), budget - later});
      }
      if (step == 17 && i == 1) qo = 0;  // paused this step: KV but no queries
      qo = std::max<int64_t>(0, qo);
      reqs.push_back({qo, r.ctx + qo});
      r.ctx += qo;
      r.prompt_left = std::max<int64_t>(0, r.prompt_left - qo);
      budget -= qo;
    }
    trace.push_back(reqs);
  }
  return trace;
}

class PrefillGraphGpu : public GpuTest {};

TEST_F(PrefillGraphGpu, CapturedPagedRunReplaysAcrossReplans) {
  const DType dt = DType::f16;
  const int kMaxBatch = 16;
  const int64_t kQoCap = 1024;
  const int kIdxCap = 8192;
  Pool pool(4096, dt, 91);
  BatchPrefillConfig cfg;
  cfg.max_batch = kMaxBatch;
  cfg.max_qo_tokens = kQoCap;
  cfg.num_qo_heads = kHqo;
  cfg.head_dim = kD;
  DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
  BatchPrefillPaged pf(cfg, ws.data(), ws.size());
  PrefillPlanOptions opts;
  opts.causal = true;
  opts.enable_cuda_graph = true;
  opts.tile_rows = kTileRows;

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
  const PagedKVCache dc{
      .k = pool.dk.view,
      .v = pool.dv.view,
      .layout = KVLayout::NHD,
      .indptr = dindptr.view,
      .indices = TensorView(d_indices.data(), DType::i32, {kIdxCap}, Device::cuda(0)),
      .last_page_len = dlast.view};
  ScopedStream s;
  d_indices.copy_from_host(cap.indices.data(), cap.indices.nbytes());
  pf.plan(cap.qo_ptr(), cap.kv_ptr(), cap.last_ptr(), cap.batch(), kHqo, kHkv, kD, kPage, dt, dt,
          dt, opts, s);
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
    HostTensor q(dt, {nnz, kHqo, kD});
    q.fill_random(1000 + step);
    if (nnz > 0) dq.buf.copy_from_host(q.data(), q.nbytes());
    if (b.indices.numel() > 0) d_indices.copy_from_host(b.indices.data(), b.indices.nbytes());
    dout.buf.fill_bytes(0xff);
    dlse.buf.fill_bytes(0xff);
    pf.plan(b.qo_ptr(), b.kv_ptr(), b.last_ptr(), b.batch(), kHqo, kHkv, kD, kPage, dt, dt, dt,
            opts, s);
    g.launch(s);
    synchronize(s);
    const bool long_ctx =
        std::any_of(b.reqs.begin(), b.reqs.end(), [](const Req& r) { return r.kv >= 20000; });
    std::string tag = "step " + std::to_string(step) + " batch " + std::to_string(b.batch()) +
                      " nnz_qo " + std::to_string(nnz) + " (qo,kv)";
    for (const Req& r : b.reqs)
      tag += " (" + std::to_string(r.qo) + "," + std::to_string(r.kv) + ")";
    if (long_ctx) {
      EXPECT_GT(pf.plan_info().num_split_tiles, 0) << tag << ": the 20000-token context must split";
      ++split_steps;
    }
    EXPECT_EQ(pf.plan_info().tile_rows, kTileRows) << tag;

    HostTensor ref(DType::f32, {nnz, kHqo, kD}), ref_lse(DType::f32, {nnz, kHqo});
    reference::batch_prefill_paged(q.view(), b.qo_indptr.view(), b.host_cache(pool), ref.view(),
                                   ref_lse.view(), ao);
    HostTensor got(dt, {nnz, kHqo, kD}), got_lse(DType::f32, {nnz, kHqo});
    if (nnz > 0) {
      dout.buf.copy_to_host(got.data(), got.nbytes());
      dlse.buf.copy_to_host(got_lse.data(), got_lse.nbytes());
    }
    EXPECT_TRUE(
        matches_reference(got.to_doubles(), ref.to_doubles(), rounded_to(ref, dt).to_doubles(), dt))
        << tag;
    EXPECT_LE(rel_err(got_lse.to_doubles(), ref_lse.to_doubles()), 1e-4) << tag << ": lse";
    EXPECT_EQ(count_bad_empty_rows(got, &got_lse, ref_lse), 0) << tag;

    // Every fourth step: run() eagerly on the same plan writes the same bits as the replay.
    if (step % 4 == 3 && nnz > 0) {
      dout_eager.buf.fill_bytes(0xff);
      dlse_eager.buf.fill_bytes(0xff);
      pf.run(dq.view, dc, dout_eager.view, dlse_eager.view, s);
      synchronize(s);
      HostTensor eager(dt, {nnz, kHqo, kD}), eager_lse(DType::f32, {nnz, kHqo});
      dout_eager.buf.copy_to_host(eager.data(), eager.nbytes());
      dlse_eager.buf.copy_to_host(eager_lse.data(), eager_lse.nbytes());
      EXPECT_EQ(bytes_of(eager, 0, nnz), bytes_of(got, 0, nnz)) << tag << ": eager vs replay";
      EXPECT_EQ(bytes_of(eager_lse, 0, nnz), bytes_of(got_lse, 0, nnz)) << tag << ": lse";
    }
  }
  EXPECT_GT(split_steps, 0) << "the trace never carried the long-context request";
}

TEST_F(PrefillGraphGpu, CapturedRaggedRunReplaysAcrossReplans) {
  const DType dt = DType::bf16;
  const int kMaxBatch = 12;
  const int64_t kQoCap = 768, kKvCap = 40000;
  BatchPrefillConfig cfg;
  cfg.max_batch = kMaxBatch;
  cfg.max_qo_tokens = kQoCap;
  cfg.num_qo_heads = kHqo;
  cfg.head_dim = kD;
  DeviceBuffer ws(BatchPrefillRagged::workspace_bytes(cfg));
  BatchPrefillRagged pf(cfg, ws.data(), ws.size());
  PrefillPlanOptions opts;
  opts.causal = true;
  opts.enable_cuda_graph = true;
  opts.tile_rows = kTileRows;

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
  pf.plan(cap_qo_ptr.view().data_as<int32_t>(), cap_kv_ptr.view().data_as<int32_t>(), kMaxBatch,
          kHqo, kHkv, kD, dt, dt, dt, opts, s);
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
    HostTensor q(dt, {nnz, kHqo, kD}), k(dt, {nnz_kv, kHkv, kD}), v(dt, {nnz_kv, kHkv, kD});
    q.fill_random(2000 + step);
    k.fill_random(3000 + step);
    v.fill_random(4000 + step);
    if (nnz > 0) dq.buf.copy_from_host(q.data(), q.nbytes());
    if (nnz_kv > 0) {
      dk.buf.copy_from_host(k.data(), k.nbytes());
      dv.buf.copy_from_host(v.data(), v.nbytes());
    }
    dout.buf.fill_bytes(0xff);
    dlse.buf.fill_bytes(0xff);
    pf.plan(qo_ptr.view().data_as<int32_t>(), kv_ptr.view().data_as<int32_t>(), B, kHqo, kHkv, kD,
            dt, dt, dt, opts, s);
    g.launch(s);
    synchronize(s);
    const std::string tag = "step " + std::to_string(step) + " batch " + std::to_string(B) +
                            " nnz_qo " + std::to_string(nnz) + " nnz_kv " + std::to_string(nnz_kv);
    if (std::any_of(kv_lens.begin(), kv_lens.end(), [](int64_t l) { return l >= 20000; })) {
      EXPECT_GT(pf.plan_info().num_split_tiles, 0) << tag;
      ++split_steps;
    }

    HostTensor ref(DType::f32, {nnz, kHqo, kD}), ref_lse(DType::f32, {nnz, kHqo});
    reference::batch_prefill_ragged(q.view(), qo_ptr.view(), k.view(), v.view(), kv_ptr.view(),
                                    ref.view(), ref_lse.view(), ao);
    HostTensor got(dt, {nnz, kHqo, kD}), got_lse(DType::f32, {nnz, kHqo});
    if (nnz > 0) {
      dout.buf.copy_to_host(got.data(), got.nbytes());
      dlse.buf.copy_to_host(got_lse.data(), got_lse.nbytes());
    }
    EXPECT_TRUE(
        matches_reference(got.to_doubles(), ref.to_doubles(), rounded_to(ref, dt).to_doubles(), dt))
        << tag;
    EXPECT_LE(rel_err(got_lse.to_doubles(), ref_lse.to_doubles()), 1e-4) << tag << ": lse";
    EXPECT_EQ(count_bad_empty_rows(got, &got_lse, ref_lse), 0) << tag;
  }
  EXPECT_GT(split_steps, 0) << "the trace never carried the long-context request";
}

// With fixed_split_size and a fixed tile_rows, request X's output (and lse) is bitwise the same
// whatever else is in the batch and wherever X sits in it, eagerly or replayed from a graph.
TEST_F(PrefillGraphGpu, FixedSplitAndTileRowsAreBatchInvariantEagerAndReplayed) {
  const DType dt = DType::bf16;
  Pool pool(2000, dt, 93);
  BatchPrefillConfig cfg;
  cfg.max_batch = 16;
  cfg.max_qo_tokens = 4096;
  cfg.num_qo_heads = kHqo;
  cfg.head_dim = kD;
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
    const PagedKVCache dc{.k = pool.dk.view,
                          .v = pool.dv.view,
                          .layout = KVLayout::NHD,
                          .indptr = di.view,
                          .indices = dx.view,
                          .last_page_len = dl.view};
    PrefillPlanOptions opts;
    opts.causal = true;
    opts.fixed_split_size = 512;
    opts.tile_rows = kTileRows;
    opts.enable_cuda_graph = graph_plan;
    ScopedStream s;
    pf.plan(b.qo_ptr(), b.kv_ptr(), b.last_ptr(), b.batch(), kHqo, kHkv, kD, kPage, dt, dt, dt,
            opts, s);
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
  BatchPrefillConfig cfg;
  cfg.max_batch = 8;
  cfg.max_qo_tokens = 512;
  cfg.num_qo_heads = kHqo;
  cfg.head_dim = kD;
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
  PrefillPlanOptions opts;
  opts.causal = true;
  opts.enable_cuda_graph = true;
  opts.tile_rows = kTileRows;
  const int32_t* ip = cache.indptr.view().data_as<int32_t>();
  const int32_t* lp = cache.last_page_len.view().data_as<int32_t>();
  ScopedStream s;
  pf.plan(qo.view().data_as<int32_t>(), ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, opts, s);
  {
    Graph g;
    capture(g, s, [&] {
      // plan() inside a capture is refused (it copies to the workspace and waits on events).
      expect_error(
          [&] {
            pf.plan(qo.view().data_as<int32_t>(), ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt,
                    opts, s);
          },
          {"captur"});
      pf.run(dq.view, dc, dout.view, TensorView(), s);
    });
    // 28 query rows no longer fit the 23 rows of q/out the graph holds.
    const PagedCacheHost bigger =
        make_paged_cache({40, 3, 5}, kPage, kHkv, kD, KVLayout::NHD, dt, 4);
    const HostTensor qo_bigger = indptr_of({20, 3, 5});
    expect_error(
        [&] {
          pf.plan(qo_bigger.view().data_as<int32_t>(), bigger.indptr.view().data_as<int32_t>(),
                  bigger.last_page_len.view().data_as<int32_t>(), 3, kHqo, kHkv, kD, kPage, dt, dt,
                  dt, opts, s);
        },
        {"qo_indptr", "nnz_qo", "q/out"});
    // Another query tile or sm_scale is another kernel / another argument of the graph's launch.
    PrefillPlanOptions other_tile = opts;
    other_tile.tile_rows = 32;
    expect_error(
        [&] {
          pf.plan(qo.view().data_as<int32_t>(), ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt,
                  other_tile, s);
        },
        {"tile_rows", "kernel"});
    PrefillPlanOptions other_scale = opts;
    other_scale.sm_scale = 0.5f;
    expect_error(
        [&] {
          pf.plan(qo.view().data_as<int32_t>(), ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt,
                  other_scale, s);
        },
        {"sm_scale"});
    // A smaller batch fits: that is what the graph is for.
    const PagedCacheHost smaller = make_paged_cache({100}, kPage, kHkv, kD, KVLayout::NHD, dt, 5);
    const HostTensor qo_smaller = indptr_of({7});
    EXPECT_NO_THROW(pf.plan(qo_smaller.view().data_as<int32_t>(),
                            smaller.indptr.view().data_as<int32_t>(),
                            smaller.last_page_len.view().data_as<int32_t>(), 1, kHqo, kHkv, kD,
                            kPage, dt, dt, dt, opts, s));
    synchronize(s);
    // And bigger ones again once the graph is destroyed and forgotten.
    g.reset();
    pf.forget_captured_graphs();
    EXPECT_NO_THROW(pf.plan(qo_bigger.view().data_as<int32_t>(),
                            bigger.indptr.view().data_as<int32_t>(),
                            bigger.last_page_len.view().data_as<int32_t>(), 3, kHqo, kHkv, kD,
                            kPage, dt, dt, dt, opts, s));
  }
  synchronize(s);
}

// Every refused call throws flashkv::Error naming the argument, before anything is written: out
// and lse are poisoned first and must still be all NaN at the end. The object stays usable.
TEST_F(PrefillGraphGpu, PagedBadInputsRaiseNamedErrorsAndLeaveOutputUntouched) {
  const DType dt = DType::f16;
  BatchPrefillConfig cfg;
  cfg.max_batch = 4;
  cfg.max_qo_tokens = 64;
  cfg.num_qo_heads = kHqo;
  cfg.head_dim = kD;
  const size_t need = BatchPrefillPaged::workspace_bytes(cfg);
  DeviceBuffer ws(need);
  expect_error([&] { BatchPrefillPaged small(cfg, ws.data(), need - 1); }, {"workspace"});
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
  PrefillPlanOptions causal;
  causal.causal = true;

  expect_error([&] { pf.run(dq.view, dc.cache, dout.view, dlse.view); }, {"plan"});

  // plan(): sizes beyond the configuration.
  {
    const PagedCacheHost five =
        make_paged_cache({1, 1, 1, 1, 1}, kPage, kHkv, kD, KVLayout::NHD, dt, 2);
    const HostTensor qo5 = indptr_of({1, 1, 1, 1, 1});
    expect_error(
        [&] {
          pf.plan(qo5.view().data_as<int32_t>(), five.indptr.view().data_as<int32_t>(),
                  five.last_page_len.view().data_as<int32_t>(), 5, kHqo, kHkv, kD, kPage, dt, dt,
                  dt, causal);
        },
        {"batch_size"});
  }
  {
    const HostTensor qo65 = indptr_of({60, 5});  // 65 > max_qo_tokens = 64
    expect_error(
        [&] {
          pf.plan(qo65.view().data_as<int32_t>(), ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt,
                  causal);
        },
        {"max_qo_tokens", "nnz_qo", "qo_indptr"});
  }
  expect_error([&] { pf.plan(qp, ip, lp, 2, 16, kHkv, kD, kPage, dt, dt, dt, causal); },
               {"num_qo_heads"});
  expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, kHkv, 96, kPage, dt, dt, dt, causal); },
               {"head_dim"});
  expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, kHkv, 256, kPage, dt, dt, dt, causal); },
               {"head_dim"});  // supported, but more than the configuration's 128
  expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, 3, kD, kPage, dt, dt, dt, causal); },
               {"num_kv_heads"});
  expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, kHkv, kD, kPage, dt, DType::bf16, dt, causal); },
               {"kv_dtype"});
  // plan(): index arrays, each error naming the entry.
  const std::vector<int32_t> qo_not_monotone = {0, 20, 3}, qo_not_zero = {1, 20, 23};
  expect_error(
      [&] {
        pf.plan(qo_not_monotone.data(), ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, causal);
      },
      {"qo_indptr[2]"});
  expect_error(
      [&] { pf.plan(qo_not_zero.data(), ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, causal); },
      {"qo_indptr[0]"});
  const std::vector<int32_t> kv_not_monotone = {0, 3, 2}, bad_last = {0, 3};
  expect_error(
      [&] {
        pf.plan(qp, kv_not_monotone.data(), lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, causal);
      },
      {"kv_indptr[2]"});
  expect_error(
      [&] { pf.plan(qp, ip, bad_last.data(), 2, kHqo, kHkv, kD, kPage, dt, dt, dt, causal); },
      {"kv_last_page_len[0]"});
  {
    const std::vector<int32_t> bad_ids = {0, 1, 99, 3};
    PrefillPlanOptions o = causal;
    o.kv_indices_host = bad_ids.data();
    o.num_pages = cache.cache.num_pages();
    expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, o); },
                 {"kv_indices[2]"});
  }
  // plan(): options.
  for (int tile : {48, 8, 256}) {
    PrefillPlanOptions o = causal;
    o.tile_rows = tile;
    expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, o); },
                 {"tile_rows"});
  }
  {
    PrefillPlanOptions o = causal;
    o.sm_scale = -1.0f;
    expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, o); },
                 {"sm_scale"});
    o = causal;
    o.fixed_split_size = -5;
    expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, o); },
                 {"fixed_split_size"});
    o = causal;
    o.fixed_split_size = 64;
    o.disable_split_kv = true;
    expect_error([&] { pf.plan(qp, ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, o); },
                 {"fixed_split_size", "disable_split_kv"});
  }
  // A query tile must hold a whole token: 16 rows cannot hold the 32 heads of an MQA group.
  {
    BatchPrefillConfig cfg32 = cfg;
    cfg32.num_qo_heads = 32;
    DeviceBuffer ws32(BatchPrefillPaged::workspace_bytes(cfg32));
    BatchPrefillPaged pf32(cfg32, ws32.data(), ws32.size());
    PrefillPlanOptions o = causal;
    o.tile_rows = 16;
    expect_error([&] { pf32.plan(qp, ip, lp, 2, 32, 1, kD, kPage, dt, dt, dt, o); }, {"tile_rows"});
  }

  // run(): tensors that do not match the (valid) plan.
  pf.plan(qp, ip, lp, 2, kHqo, kHkv, kD, kPage, dt, dt, dt, causal);
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
  // Capturing run() of a plan made without enable_cuda_graph.
  {
    ScopedStream s;
    Graph g;
    expect_error(
        [&] { capture(g, s, [&] { pf.run(dq.view, dc.cache, dout.view, dlse.view, s); }); },
        {"enable_cuda_graph"});
  }
  HostTensor got(dt, {23, kHqo, kD}), got_lse(DType::f32, {23, kHqo});
  to_host(dout, got);
  to_host(dlse, got_lse);
  EXPECT_TRUE(all_nan(got)) << "a refused call wrote out";
  EXPECT_TRUE(all_nan(got_lse)) << "a refused call wrote lse";

  // Still usable: the valid plan runs and is right.
  pf.run(dq.view, dc.cache, dout.view, dlse.view);
  synchronize();
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
  BatchPrefillConfig cfg;
  cfg.max_batch = 4;
  cfg.max_qo_tokens = 64;
  cfg.num_qo_heads = kHqo;
  cfg.head_dim = kD;
  const size_t need = BatchPrefillRagged::workspace_bytes(cfg);
  DeviceBuffer ws(need);
  expect_error([&] { BatchPrefillRagged small(cfg, ws.data(), need - 1); }, {"workspace"});
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
  PrefillPlanOptions causal;
  causal.causal = true;

  expect_error([&] { pf.run(dq.view, dk.view, dv.view, dout.view, dlse.view); }, {"plan"});
  const std::vector<int32_t> qo_bad = {0, 20, 3}, kv_bad = {0, 40, 30};
  expect_error([&] { pf.plan(qo_bad.data(), kp, 2, kHqo, kHkv, kD, dt, dt, dt, causal); },
               {"qo_indptr[2]"});
  expect_error([&] { pf.plan(qp, kv_bad.data(), 2, kHqo, kHkv, kD, dt, dt, dt, causal); },
               {"kv_indptr[2]"});
  expect_error([&] { pf.plan(qp, kp, 2, kHqo, kHkv, 96, dt, dt, dt, causal); }, {"head_dim"});
  expect_error([&] { pf.plan(qp, kp, 2, kHqo, kHkv, kD, dt, DType::f16, dt, causal); },
               {"kv_dtype"});
  expect_error([&] { pf.plan(qp, kp, 5, kHqo, kHkv, kD, dt, dt, dt, causal); }, {"batch_size"});

  pf.plan(qp, kp, 2, kHqo, kHkv, kD, dt, dt, dt, causal);
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
  {
    ScopedStream s;
    Graph g;
    expect_error(
        [&] { capture(g, s, [&] { pf.run(dq.view, dk.view, dv.view, dout.view, dlse.view, s); }); },
        {"enable_cuda_graph"});
  }
  HostTensor got(dt, {23, kHqo, kD}), got_lse(DType::f32, {23, kHqo});
  to_host(dout, got);
  to_host(dlse, got_lse);
  EXPECT_TRUE(all_nan(got)) << "a refused call wrote out";
  EXPECT_TRUE(all_nan(got_lse)) << "a refused call wrote lse";
}

}  // namespace
}  // namespace flashkv::test
