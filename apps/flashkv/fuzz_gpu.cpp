// `flashkv fuzz` on a GPU: each op of a configuration run on the device against the CPU reference
// (fuzz_inputs.h), outputs poisoned with NaN before every run, judged by fuzz_check.h.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "flashkv/block_sparse.h"
#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/device_errors.h"
#include "flashkv/error.h"
#include "flashkv/kv_ops.h"
#include "flashkv/merge.h"
#include "flashkv/prefill.h"
#include "flashkv/reference.h"
#include "flashkv/reference_block_sparse.h"
#include "flashkv/reference_kv_ops.h"
#include "fuzz_check.h"
#include "fuzz_inputs.h"
#include "fuzz_ops.h"
#include "runtime/driver.h"
#include "runtime/scoped_stream.h"

namespace flashkv::cli {
namespace {

using runtime::check_cu;
using runtime::driver;

// Runs `fn` on `s`, or captures it into a CUDA graph and replays that once (the outputs were
// poisoned before: the capture itself runs nothing), then waits for the stream.
void run_maybe_captured(bool graph, Stream s, const std::function<void()>& fn) {
  if (graph) {
    const runtime::Driver& d = driver();
    check_device_errors(0, s);  // the error record is allocated now, not under capture
    check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture");
    try {
      fn();
    } catch (...) {
      CUgraph dropped = nullptr;
      d.cuStreamEndCapture(s, &dropped);
      if (dropped) d.cuGraphDestroy(dropped);
      throw;
    }
    CUgraph g = nullptr;
    check_cu(d.cuStreamEndCapture(s, &g), "end capture");
    CUgraphExec e = nullptr;
    const CUresult rc = d.cuGraphInstantiate(&e, g, 0);
    d.cuGraphDestroy(g);
    check_cu(rc, "instantiate");
    const CUresult launched = d.cuGraphLaunch(e, s);
    synchronize(s);
    d.cuGraphExecDestroy(e);
    check_cu(launched, "graph launch");
  } else {
    fn();
  }
  synchronize(s);
}

// A poisoned device output of `t`'s shape (`t` is poisoned too) and the buffer to read it back.
struct DeviceOut {
  size_t at = 0;  // index into `keep`
  TensorView view;
};
DeviceOut poisoned(HostTensor& t, std::vector<DeviceBuffer>& keep) {
  t.fill_poison();
  DeviceOut o;
  o.at = keep.size();
  o.view = to_gpu(t, keep);
  return o;
}
void download(const DeviceOut& o, const std::vector<DeviceBuffer>& keep, HostTensor& t) {
  keep[o.at].copy_to_host(t.data(), t.nbytes());
}

AttentionShape shape_of(const FuzzConfig& c) {
  return {.num_qo_heads = c.num_qo_heads(),
          .num_kv_heads = c.num_kv_heads,
          .head_dim = c.head_dim,
          .q_dtype = c.dtype,
          .kv_dtype = c.kv_dtype,
          .o_dtype = c.dtype};
}

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), 0LL); }

double lse_tol(const FuzzConfig& c) {
  const bool rope = c.variant.rope != RopeMode::none || c.step_rope != RopeMode::none;
  return lse_tolerance(c.dtype, rope);
}

// The decode plan of c over a host page table (decode, sparse decode, the step), and its run on
// the device cache: out / lse poisoned first; returns them.
struct DecodeRun {
  const std::vector<int32_t>& indptr;
  const std::vector<int32_t>& last;
  const std::vector<int32_t>& ids;
  int page_size;
  int64_t num_pages;
};

// The workspace of c: the full size, or the least plus c.workspace_pct % of the rest.
size_t workspace_size(const FuzzConfig& c, size_t least, size_t full) {
  if (c.workspace_pct >= 100 || full <= least) return full;
  return least + (full - least) * static_cast<size_t>(c.workspace_pct) / 100 / 16 * 16;
}

BatchDecodeConfig decode_config(const FuzzConfig& c, int64_t kv_tokens) {
  BatchDecodeConfig cfg{.max_batch = std::max(1, c.batch()),
                        .num_qo_heads = c.num_qo_heads(),
                        .head_dim = c.head_dim};
  if (c.split == SplitMode::kFixed) {
    cfg.max_kv_tokens = std::max<int64_t>(1, kv_tokens);
    cfg.min_fixed_split_size = c.fixed_split_size;
  }
  return cfg;
}

DecodePlanOptions decode_options(const FuzzConfig& c, const AttentionVariant* dv,
                                 const DecodeRun& r) {
  DecodePlanOptions o;
  o.disable_split_kv = c.split == SplitMode::kDisabled;
  o.fixed_split_size = c.split == SplitMode::kFixed ? c.fixed_split_size : 0;
  o.enable_cuda_graph = c.cuda_graph;
  o.kv_indices_host = r.ids.data();
  o.num_pages = r.num_pages;
  o.backend = c.backend == 1   ? DecodeBackend::kCudaCores
              : c.backend == 2 ? DecodeBackend::kTensorCores
                               : DecodeBackend::kAuto;
  o.balance_tail = c.balance_tail;
  o.check_page_ids = c.check_page_ids;
  o.enable_pdl = c.pdl;
  if (dv != nullptr && c.variant.any()) o.variant = Variant::builtin(*dv);
  return o;
}

// A BatchDecode for c (its workspace per c.workspace_pct), planned on its own stream: what the
// decode, sparse-decode and step runners run.
struct PlannedDecode {
  BatchDecodeConfig cfg;
  DeviceBuffer ws;
  BatchDecode dec;
  ScopedStream s;

  // r: the page table to plan (the cache's, or a selection's); kv_tokens: the batch's KV total.
  PlannedDecode(const FuzzConfig& c, const DecodeRun& r, int64_t kv_tokens,
                const AttentionVariant* dv)
      : cfg(decode_config(c, kv_tokens)),
        ws(workspace_size(c, BatchDecode::min_workspace_bytes(cfg),
                          BatchDecode::workspace_bytes(cfg))),
        dec(cfg, ws.data(), ws.size()) {
    dec.plan({.kv_indptr = r.indptr.data(),
              .kv_last_page_len = r.last.data(),
              .batch_size = static_cast<int>(c.batch()),
              .page_size = r.page_size},
             shape_of(c), decode_options(c, dv, r), s);
  }
};

FuzzOutcome gpu_decode(const FuzzConfig& c) {
  AttentionInputs in = make_attention_inputs(c);
  const int64_t B = c.batch(), Hq = c.num_qo_heads(), D = c.head_dim;
  HostTensor ref(DType::f32, {B, Hq, D}), ref_lse(DType::f32, {B, Hq});
  attention_reference(c, in, ref.view(), c.with_lse ? ref_lse.view() : TensorView());

  std::vector<DeviceBuffer> keep;
  const AttentionVariant dv = device_variant(in, keep);
  const PagedKVCache dc = in.cache->to_device(keep);
  const TensorView dq = to_gpu(in.q, keep);
  HostTensor out(c.dtype, {B, Hq, D}), lse(DType::f32, {B, Hq});
  const DeviceOut dout = poisoned(out, keep), dlse = poisoned(lse, keep);
  const RandomPagedCache& p = *in.cache;
  PlannedDecode pd(c, {p.indptr, p.last, p.idx, c.page_size, p.num_pages()}, total(c.kv_lens), &dv);
  BatchDecode& dec = pd.dec;
  const ScopedStream& s = pd.s;
  run_maybe_captured(c.cuda_graph, s,
                     [&] { dec.run(dq, dc, dout.view, c.with_lse ? dlse.view : TensorView(), s); });
  check_device_errors(0, s);  // valid page ids: the kernel's check (check_page_ids) is silent
  download(dout, keep, out);
  download(dlse, keep, lse);
  FuzzOutcome o;
  o.check_output("out", out, ref, c.dtype, in.rows);
  if (c.with_lse) o.check_lse("lse", lse, ref_lse, lse_tol(c));
  return o;
}

// Token selections over token_pages(): each request's page table names single tokens of the
// cache, as a Quest-style selection does.
FuzzOutcome gpu_sparse_decode(const FuzzConfig& c) {
  AttentionInputs in = make_attention_inputs(c);
  const SparseSelection sel = draw_token_selection(c, *in.cache);
  const int64_t B = c.batch(), Hq = c.num_qo_heads(), D = c.head_dim;
  HostTensor ref(DType::f32, {B, Hq, D}), ref_lse(DType::f32, {B, Hq});
  reference::batch_decode(in.q.view(), sel.host, ref.view(),
                          c.with_lse ? ref_lse.view() : TensorView());

  std::vector<DeviceBuffer> keep;
  PagedKVCache dc = in.cache->to_device(keep);
  HostTensor ids(DType::i32, {std::max<int64_t>(1, static_cast<int64_t>(sel.ids.size()))});
  std::copy(sel.ids.begin(), sel.ids.end(), static_cast<int32_t*>(ids.data()));
  PagedKVCache dsel = sel.host;
  dsel.k = token_pages(dc.k, KVLayout::NHD);
  dsel.v = token_pages(dc.v, KVLayout::NHD);
  dsel.indices = to_gpu(ids, keep).slice0(0, static_cast<int64_t>(sel.ids.size()));
  HostTensor dummy_ip(DType::i32, {B + 1}), dummy_last(DType::i32, {B});
  dsel.indptr = to_gpu(dummy_ip, keep);
  dsel.last_page_len = to_gpu(dummy_last, keep);
  const TensorView dq = to_gpu(in.q, keep);
  HostTensor out(c.dtype, {B, Hq, D}), lse(DType::f32, {B, Hq});
  const DeviceOut dout = poisoned(out, keep), dlse = poisoned(lse, keep);
  PlannedDecode pd(c, {sel.indptr, sel.last, sel.ids, 1, sel.host.num_pages()}, total(c.qo_lens),
                   nullptr);
  BatchDecode& dec = pd.dec;
  const ScopedStream& s = pd.s;
  run_maybe_captured(c.cuda_graph, s, [&] {
    dec.run(dq, dsel, dout.view, c.with_lse ? dlse.view : TensorView(), s);
  });
  check_device_errors(0, s);
  download(dout, keep, out);
  download(dlse, keep, lse);
  FuzzOutcome o;
  o.check_output("out", out, ref, c.dtype, in.rows);
  if (c.with_lse) o.check_lse("lse", lse, ref_lse, lse_tol(c));
  return o;
}

// The fused step against rope -> append -> decode on the reference; the cache it wrote too.
FuzzOutcome gpu_decode_step(const FuzzConfig& c) {
  AttentionInputs in = make_attention_inputs(c);
  StepInputs st = make_step_inputs(c, in);
  const int64_t B = c.batch(), Hq = c.num_qo_heads(), D = c.head_dim;
  HostTensor ref(DType::f32, {B, Hq, D}), ref_lse(DType::f32, {B, Hq});
  AttentionInputs ref_in = make_attention_inputs(c);  // same seed: the same cache, appended to
  step_reference(c, st, ref_in, ref.view(), c.with_lse ? ref_lse.view() : TensorView());

  std::vector<DeviceBuffer> keep;
  const size_t k_at = keep.size();
  const PagedKVCache dc = in.cache->to_device(keep);
  const TensorView dq = to_gpu(in.q, keep), dk = to_gpu(st.new_k, keep),
                   dvv = to_gpu(st.new_v, keep);
  HostTensor out(c.dtype, {B, Hq, D}), lse(DType::f32, {B, Hq});
  const DeviceOut dout = poisoned(out, keep), dlse = poisoned(lse, keep);
  const RandomPagedCache& p = *in.cache;
  PlannedDecode pd(c, {p.indptr, p.last, p.idx, c.page_size, p.num_pages()}, total(c.kv_lens),
                   nullptr);
  BatchDecode& dec = pd.dec;
  const ScopedStream& s = pd.s;
  DecodeStepOptions so;
  so.rope = c.step_rope == RopeMode::llama     ? DecodeStepOptions::Rope::kLlama
            : c.step_rope == RopeMode::llama31 ? DecodeStepOptions::Rope::kLlama31
                                               : DecodeStepOptions::Rope::kNone;
  run_maybe_captured(c.cuda_graph, s, [&] {
    dec.run_step(dq, dk, dvv, dc, dout.view, c.with_lse ? dlse.view : TensorView(), so, s);
  });
  check_device_errors(0, s);
  download(dout, keep, out);
  download(dlse, keep, lse);
  HostTensor k_got = p.k, v_got = p.v;
  keep[k_at].copy_to_host(k_got.data(), k_got.nbytes());
  keep[k_at + 1].copy_to_host(v_got.data(), v_got.nbytes());
  FuzzOutcome o;
  o.check_output("out", out, ref, c.dtype, in.rows);
  if (c.with_lse) o.check_lse("lse", lse, ref_lse, lse_tol(c));
  if (c.step_rope == RopeMode::none) {
    // No rotation: the append copies (or quantizes) exactly as the reference does.
    o.check_bitwise("cache k", k_got, ref_in.cache->k);
    o.check_bitwise("cache v", v_got, ref_in.cache->v);
  } else {
    // The kernel rotates in f32, the reference in double: a key may differ in its last bit
    // (a 16-bit tie rounded the other way moves an fp8 key by one step).
    o.check_ulps("cache k", k_got, ref_in.cache->k);
    o.check_bitwise("cache v", v_got, ref_in.cache->v);
  }
  return o;
}

PrefillPlanOptions prefill_options(const FuzzConfig& c, const AttentionVariant& dv) {
  PrefillPlanOptions o;
  o.causal = c.causal;
  o.disable_split_kv = c.split == SplitMode::kDisabled;
  o.fixed_split_size = c.split == SplitMode::kFixed ? c.fixed_split_size : 0;
  o.enable_cuda_graph = c.cuda_graph;
  o.backend = c.backend == 1 ? PrefillBackend::kMmaSync : PrefillBackend::kAuto;
  o.enable_pdl = c.pdl;
  o.tile_rows = c.tile_rows;
  o.item_order = c.item_order == 1   ? PrefillItemOrder::kRequestMajor
                 : c.item_order == 2 ? PrefillItemOrder::kHeadMajor
                                     : PrefillItemOrder::kAuto;
  if (c.variant.any()) o.variant = Variant::builtin(dv);
  return o;
}

FuzzOutcome gpu_prefill(const FuzzConfig& c) {
  AttentionInputs in = make_attention_inputs(c);
  const int64_t rows = in.rows.back(), Hq = c.num_qo_heads(), D = c.head_dim;
  HostTensor ref(DType::f32, {rows, Hq, D}), ref_lse(DType::f32, {rows, Hq});
  attention_reference(c, in, ref.view(), c.with_lse ? ref_lse.view() : TensorView());

  std::vector<DeviceBuffer> keep;
  const AttentionVariant dv = device_variant(in, keep);
  const TensorView dq = to_gpu(in.q, keep);
  HostTensor out(c.dtype, {rows, Hq, D}), lse(DType::f32, {rows, Hq});
  const DeviceOut dout = poisoned(out, keep), dlse = poisoned(lse, keep);
  const TensorView lse_arg = c.with_lse ? dlse.view : TensorView();
  BatchPrefillConfig cfg;
  cfg.max_batch = c.batch();
  cfg.max_qo_tokens = std::max<int64_t>(1, rows);
  cfg.num_qo_heads = static_cast<int>(Hq);
  cfg.head_dim = c.head_dim;
  PrefillPlanOptions po = prefill_options(c, dv);
  const RandomPagedCache& p = *in.cache;
  ScopedStream s;
  if (c.op == FuzzOp::kPrefillPaged) {
    const PagedKVCache dc = p.to_device(keep);
    DeviceBuffer ws(workspace_size(c, BatchPrefillPaged::min_workspace_bytes(cfg),
                                   BatchPrefillPaged::workspace_bytes(cfg)));
    BatchPrefillPaged pf(cfg, ws.data(), ws.size());
    po.kv_indices_host = p.idx.data();
    po.num_pages = p.num_pages();
    pf.plan({.qo_indptr = in.qo_indptr.data(),
             .kv_indptr = p.indptr.data(),
             .kv_last_page_len = p.last.data(),
             .batch_size = c.batch(),
             .page_size = c.page_size},
            shape_of(c), po, s);
    run_maybe_captured(c.cuda_graph, s, [&] { pf.run(dq, dc, dout.view, lse_arg, s); });
  } else {
    HostTensor kr, vr;
    std::vector<int32_t> kv_indptr;
    in.ragged_kv(kr, vr, kv_indptr);
    const TensorView dk = to_gpu(kr, keep), dvv = to_gpu(vr, keep);
    DeviceBuffer ws(workspace_size(c, BatchPrefillRagged::min_workspace_bytes(cfg),
                                   BatchPrefillRagged::workspace_bytes(cfg)));
    BatchPrefillRagged pf(cfg, ws.data(), ws.size());
    pf.plan({.qo_indptr = in.qo_indptr.data(),
             .kv_indptr = kv_indptr.data(),
             .kv_last_page_len = nullptr,
             .batch_size = c.batch(),
             .page_size = 0},
            shape_of(c), po, s);
    run_maybe_captured(c.cuda_graph, s, [&] {
      if (is_fp8_dtype(c.kv_dtype))
        pf.run(dq, dk, dvv, dout.view, lse_arg, KVScale{.k = c.k_scale, .v = c.v_scale}, s);
      else
        pf.run(dq, dk, dvv, dout.view, lse_arg, s);
    });
  }
  download(dout, keep, out);
  download(dlse, keep, lse);
  FuzzOutcome o;
  o.check_output("out", out, ref, c.dtype, in.rows);
  if (c.with_lse) o.check_lse("lse", lse, ref_lse, lse_tol(c));
  return o;
}

FuzzOutcome gpu_append(const FuzzConfig& c) {
  AppendInputs ap = make_append_inputs(c);
  AppendInputs ref = make_append_inputs(c);  // the same seed: the same cache and rows
  reference::append_paged_kv_cache(ref.new_k.view(), ref.new_v.view(), ref.batch_indices.view(),
                                   ref.positions.view(), ref.cache->host);
  std::vector<DeviceBuffer> keep;
  const size_t k_at = keep.size();
  const PagedKVCache dc = ap.cache->to_device(keep, /*page_table=*/true);
  const TensorView dk = to_gpu(ap.new_k, keep), dvv = to_gpu(ap.new_v, keep),
                   dbi = to_gpu(ap.batch_indices, keep), dpos = to_gpu(ap.positions, keep);
  ScopedStream s;
  append_paged_kv_cache(dk, dvv, dbi, dpos, dc, s);
  check_device_errors(0, s);
  HostTensor k_got = ap.cache->k, v_got = ap.cache->v;
  keep[k_at].copy_to_host(k_got.data(), k_got.nbytes());
  keep[k_at + 1].copy_to_host(v_got.data(), v_got.nbytes());
  FuzzOutcome o;
  o.check_bitwise("cache k", k_got, ref.cache->k);
  o.check_bitwise("cache v", v_got, ref.cache->v);
  return o;
}

FuzzOutcome gpu_cascade(const FuzzConfig& c) {
  CascadeInputs ci = make_cascade_inputs(c);
  const int64_t rows = ci.rows.back(), Hq = c.num_qo_heads(), D = c.head_dim;
  HostTensor ref(DType::f32, {rows, Hq, D}), ref_lse(DType::f32, {rows, Hq});
  cascade_plain_reference(c, ci, ref.view(), c.with_lse ? ref_lse.view() : TensorView());

  std::vector<DeviceBuffer> keep;
  PagedKVCache dc = ci.storage->to_device(keep);
  HostTensor ip(DType::i32, {c.batch() + 1}),
      ids(DType::i32, {std::max<int64_t>(1, ci.ids.size())}), last(DType::i32, {c.batch()});
  std::copy(ci.indptr.begin(), ci.indptr.end(), static_cast<int32_t*>(ip.data()));
  std::copy(ci.ids.begin(), ci.ids.end(), static_cast<int32_t*>(ids.data()));
  std::copy(ci.last.begin(), ci.last.end(), static_cast<int32_t*>(last.data()));
  dc.indptr = to_gpu(ip, keep);
  dc.indices = to_gpu(ids, keep).slice0(0, static_cast<int64_t>(ci.ids.size()));
  dc.last_page_len = to_gpu(last, keep);
  const TensorView dq = to_gpu(ci.q, keep);
  HostTensor out(c.dtype, {rows, Hq, D}), lse(DType::f32, {rows, Hq});
  const DeviceOut dout = poisoned(out, keep), dlse = poisoned(lse, keep);
  MultiLevelCascadeConfig cfg{.max_batch = c.batch(),
                              .max_qo_tokens = std::max<int64_t>(1, rows),
                              .max_pages = std::max<int64_t>(1, ci.ids.size()),
                              .num_qo_heads = static_cast<int>(Hq),
                              .head_dim = c.head_dim};
  DeviceBuffer ws(MultiLevelCascade::workspace_bytes(cfg));
  MultiLevelCascade cas(cfg, ws.data(), ws.size());
  CascadePlanOptions po;
  po.causal = c.causal;
  po.use = c.cascade_always ? CascadePlanOptions::Use::kAlways : CascadePlanOptions::Use::kAuto;
  po.enable_cuda_graph = c.cuda_graph;
  ScopedStream s;
  cas.plan({.qo_indptr = c.qo_lens.empty() ? nullptr : ci.qo_indptr.data(),
            .kv_indptr = ci.indptr.data(),
            .kv_indices = ci.ids.data(),
            .kv_last_page_len = ci.last.data(),
            .batch_size = c.batch(),
            .page_size = c.page_size},
           {.num_qo_heads = static_cast<int>(Hq),
            .num_kv_heads = c.num_kv_heads,
            .head_dim = c.head_dim,
            .dtype = c.dtype,
            .kv_dtype = is_fp8_dtype(c.kv_dtype) ? c.kv_dtype : DType::f32},
           po, s);
  run_maybe_captured(c.cuda_graph, s,
                     [&] { cas.run(dq, dc, dout.view, c.with_lse ? dlse.view : TensorView(), s); });
  download(dout, keep, out);
  download(dlse, keep, lse);
  FuzzOutcome o;
  o.check_output("out", out, ref, c.dtype, ci.rows);
  if (c.with_lse) o.check_lse("lse", lse, ref_lse, lse_tol(c));
  return o;
}

FuzzOutcome gpu_block_sparse(const FuzzConfig& c) {
  SparseInputs si = make_sparse_inputs(c);
  const int64_t M = c.qo_lens[0], Hq = c.num_qo_heads(), D = c.head_dim;
  HostTensor ref(DType::f32, {M, Hq, D}), ref_lse(DType::f32, {M, Hq});
  const TensorView ref_lse_arg = c.with_lse ? ref_lse.view() : TensorView();
  const BlockSparseOptions host_o = si.options(nullptr);
  std::vector<DeviceBuffer> keep;
  const BlockSparseOptions dev_o = si.options(&keep);
  const TensorView dq = to_gpu(si.q, keep), dk = to_gpu(si.k, keep), dvv = to_gpu(si.v, keep);
  HostTensor out(c.dtype, {M, Hq, D}), lse(DType::f32, {M, Hq});
  const DeviceOut dout = poisoned(out, keep), dlse = poisoned(lse, keep);
  const TensorView lse_arg = c.with_lse ? dlse.view : TensorView();
  ScopedStream s;
  if (c.op == FuzzOp::kBlockSparse) {
    const BlockSparseLayout l = si.bsr_layout();
    reference::block_sparse_attention(si.q.view(), si.k.view(), si.v.view(), l, ref.view(),
                                      ref_lse_arg, host_o);
    BlockSparseConfig cfg;
    cfg.max_rows = M;
    cfg.max_block_rows = std::max<int64_t>(1, l.num_block_rows());
    cfg.max_blocks = std::max<int64_t>(1, si.indices.size());
    cfg.max_mask_bytes = block_sparse_mask_bytes(l, c.causal);
    cfg.num_qo_heads = static_cast<int>(Hq);
    cfg.head_dim = c.head_dim;
    DeviceBuffer ws(BlockSparseAttention::workspace_bytes(cfg));
    BlockSparseAttention op(cfg, ws.data(), ws.size());
    op.plan(l, shape_of(c), dev_o, s);
    op.run(dq, dk, dvv, dout.view, lse_arg, s);
    synchronize(s);
  } else {
    const VariableBlockSparseLayout l = si.variable_layout();
    reference::variable_block_sparse_attention(si.q.view(), si.k.view(), si.v.view(), l, ref.view(),
                                               ref_lse_arg, host_o);
    const VariableBlockSparseNeeds needs = variable_block_sparse_needs(l, c.causal);
    VariableBlockSparseConfig cfg;
    cfg.max_rows = M;
    cfg.max_block_rows = l.MB;
    cfg.max_kv_ids = std::max<int64_t>(1, needs.kv_ids);
    cfg.max_mask_bytes = needs.mask_bytes;
    cfg.num_qo_heads = static_cast<int>(Hq);
    cfg.num_kv_heads = c.num_kv_heads;
    cfg.head_dim = c.head_dim;
    DeviceBuffer ws(VariableBlockSparseAttention::workspace_bytes(cfg));
    VariableBlockSparseAttention op(cfg, ws.data(), ws.size());
    op.plan(l, shape_of(c), dev_o, s);
    op.run(dq, dk, dvv, dout.view, lse_arg, s);
    synchronize(s);
  }
  download(dout, keep, out);
  download(dlse, keep, lse);
  FuzzOutcome o;
  o.check_output("out", out, ref, c.dtype);
  if (c.with_lse) o.check_lse("lse", lse, ref_lse, lse_tol(c));
  return o;
}

FuzzOutcome gpu_merge(const FuzzConfig& c) {
  MergeInputs mi = make_merge_inputs(c);
  const int64_t n = c.qo_lens[0], H = c.num_kv_heads, D = c.head_dim;
  HostTensor ref(DType::f32, {n, H, D}), ref_s(DType::f32, {n, H});
  reference::merge_states(mi.v.view(), mi.s.view(), ref.view(), ref_s.view());
  std::vector<DeviceBuffer> keep;
  HostTensor out(c.dtype, {n, H, D}), out_s(DType::f32, {n, H});
  ScopedStream s;
  if (c.merge_kind == 0) {
    const TensorView dv = to_gpu(mi.v, keep), ds = to_gpu(mi.s, keep);
    const DeviceOut dout = poisoned(out, keep), douts = poisoned(out_s, keep);
    merge_states(dv, ds, dout.view, douts.view, s);
    synchronize(s);
    download(dout, keep, out);
    download(douts, keep, out_s);
  } else {
    HostTensor va, sa, vb, sb;
    mi.split_pair(va, sa, vb, sb);
    const TensorView dva = to_gpu(va, keep), dsa = to_gpu(sa, keep), dvb = to_gpu(vb, keep),
                     dsb = to_gpu(sb, keep);
    if (c.merge_kind == 1) {
      const DeviceOut dout = poisoned(out, keep), douts = poisoned(out_s, keep);
      merge_state(dva, dsa, dvb, dsb, dout.view, douts.view, s);
      synchronize(s);
      download(dout, keep, out);
      download(douts, keep, out_s);
    } else {
      merge_state_in_place(dva, dsa, dvb, dsb, s);
      synchronize(s);
      keep[0].copy_to_host(out.data(), out.nbytes());
      keep[1].copy_to_host(out_s.data(), out_s.nbytes());
    }
  }
  FuzzOutcome o;
  o.check_output("v", out, ref, c.dtype);
  o.check_lse("s", out_s, ref_s, kLseTolerance);
  return o;
}

}  // namespace

FuzzOutcome run_on_gpu(const FuzzConfig& c) {
  switch (c.op) {
    case FuzzOp::kDecode:
      return gpu_decode(c);
    case FuzzOp::kSparseDecode:
      return gpu_sparse_decode(c);
    case FuzzOp::kDecodeStep:
      return gpu_decode_step(c);
    case FuzzOp::kPrefillPaged:
    case FuzzOp::kPrefillRagged:
      return gpu_prefill(c);
    case FuzzOp::kAppend:
      return gpu_append(c);
    case FuzzOp::kCascade:
      return gpu_cascade(c);
    case FuzzOp::kBlockSparse:
    case FuzzOp::kVariableBlockSparse:
      return gpu_block_sparse(c);
    case FuzzOp::kMerge:
      return gpu_merge(c);
  }
  throw Error("run_on_gpu: unknown op");
}

}  // namespace flashkv::cli
