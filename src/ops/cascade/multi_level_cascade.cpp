// MultiLevelCascade (cascade.h): shared-prefix detection and the cost model (src/scheduler), one
// attention object per level over the same cache, and the gather / ⊕ kernels
// (kernels/attention/cascade/cascade_merge.cuh).
//
// Levels run as: shared prefixes on BatchPrefillPaged (a group's rows form one "request" with
// qo_len = its rows, no causal mask), the suffix level on BatchDecode (decode configs) or
// BatchPrefillPaged (append configs, causal as asked). Every level writes (o, lse) for all cascade
// rows into its own workspace buffers; the merge kernel ⊕s them and scatters to the caller's rows.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "attention/cascade/cascade_params.cuh"
#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "flashkv/prefill.h"
#include "ops/cascade/cascade_workspace.h"
#include "ops/common/plan_lifecycle.h"
#include "ops/common/run_checks.h"
#include "ops/jit/jit_util.h"
#include "ops/jit/kernel_specs.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"
#include "scheduler/cascade_cost.h"
#include "scheduler/prefix_sharing.h"
#include "tuning/policy.cuh"

namespace flashkv {

namespace ops {
KernelSpec cascade_kernel_spec(DType t) {
  const std::string tn = device_type_name(t, "q");
  const std::string id = std::string("cascade<") + dtype_name(t) + ">";
  return {id, [id, tn] {
            return make_request(id, "attention/cascade/cascade_merge.cuh",
                                {"flashkv::cascade_gather_kernel<" + tn + ">",
                                 "flashkv::cascade_merge_kernel<" + tn + ">"});
          }};
}
}  // namespace ops

namespace {

using runtime::check_cu;
using runtime::driver;

// The layout of a plan that shares nothing: one level, the batch's own page table, rows in order.
scheduler::CascadeLayout plain_layout(const CascadeBatch& b, const std::vector<int32_t>& qo) {
  scheduler::CascadeLayout l;
  l.page_size = b.page_size;
  l.request_order.resize(b.batch_size);
  std::iota(l.request_order.begin(), l.request_order.end(), 0);
  l.qo_rows.resize(qo.back());
  std::iota(l.qo_rows.begin(), l.qo_rows.end(), 0);
  scheduler::CascadeLevel lv;
  lv.request_indptr.resize(b.batch_size + 1);
  std::iota(lv.request_indptr.begin(), lv.request_indptr.end(), 0);
  lv.qo_indptr = qo;
  lv.kv_indptr.assign(b.kv_indptr, b.kv_indptr + b.batch_size + 1);
  lv.kv_indices.assign(b.kv_indices, b.kv_indices + b.kv_indptr[b.batch_size]);
  lv.kv_last_page_len.assign(b.kv_last_page_len, b.kv_last_page_len + b.batch_size);
  for (int i = 0; i < b.batch_size; ++i)
    if (lv.kv_indptr[i + 1] == lv.kv_indptr[i]) lv.kv_last_page_len[i] = 0;
  l.levels.push_back(std::move(lv));
  return l;
}

// A level with every group empty (graph mode keeps max_levels passes whatever the plan shares).
scheduler::CascadeLevel empty_level(int64_t rows) {
  scheduler::CascadeLevel lv;
  lv.request_indptr = {0, 0};
  lv.qo_indptr = {0, static_cast<int32_t>(rows)};
  lv.kv_indptr = {0, 0};
  lv.kv_last_page_len = {0};
  return lv;
}

bool is_identity(const std::vector<int32_t>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<int32_t>(i)) return false;
  return true;
}

}  // namespace

struct MultiLevelCascade::Impl {
  MultiLevelCascadeConfig cfg;
  bool decode_mode = true;  // max_qo_tokens == 0: one query row per request, suffix on BatchDecode
  ops::CascadeWorkspace ws;
  ops::PlanLifecycle life;  // plan/run guards and the index arrays' copies into the workspace
  // What a CUDA graph that captured run() holds fixed (its rows; the levels' ops record the rest).
  ops::CapturedRun captured;
  std::vector<std::unique_ptr<BatchPrefillPaged>> prefix;  // one per shared level
  std::unique_ptr<BatchPrefillPaged> suffix_prefill;
  std::unique_ptr<BatchDecode> suffix_decode;
  // The plan in force.
  CascadeShape shape;
  CascadePlanOptions opts;
  scheduler::CascadeLayout layout;
  int num_levels = 0;  // levels that run (graph mode: always max_levels)
  int64_t rows = 0;
  bool gather = false;  // q rows reordered (or graph mode): gather q, merge-scatter the output
  CascadePlanInfo info;
  PageIdMax page_ids;  // the plan's largest page id (run() checks it against the cache)
  std::string kv_indices_name = "kv_indices";  // how run() names them (CascadePlanOptions::names)
  CUfunction gather_fn = nullptr, merge_fn = nullptr;
};

size_t MultiLevelCascade::workspace_bytes(const MultiLevelCascadeConfig& cfg) {
  return ops::CascadeWorkspace::required_bytes(cfg);
}

size_t MultiLevelCascade::min_workspace_bytes(const MultiLevelCascadeConfig& cfg) {
  return ops::CascadeWorkspace::min_bytes(cfg);
}

MultiLevelCascade::MultiLevelCascade(const MultiLevelCascadeConfig& cfg, void* workspace,
                                     size_t bytes)
    : impl_(std::make_unique<Impl>()) {
  check(cfg.max_levels >= 1 && cfg.max_levels <= kCascadeMaxLevels,
        "MultiLevelCascadeConfig.max_levels: expected 1..", kCascadeMaxLevels, ", got ",
        cfg.max_levels);
  Impl& m = *impl_;
  m.cfg = cfg;
  m.decode_mode = cfg.max_qo_tokens == 0;
  m.ws = ops::CascadeWorkspace(cfg, workspace, bytes);
  runtime::ensure_context(cfg.device);
  m.life = ops::PlanLifecycle("MultiLevelCascade", m.ws.index_bytes(), cfg.device);
  const BatchPrefillConfig pc = m.ws.prefill_config();
  for (int l = 0; l + 1 < cfg.max_levels; ++l) {
    m.prefix.push_back(std::make_unique<BatchPrefillPaged>(pc, m.ws.level_workspace(l),
                                                           m.ws.level_workspace_bytes(l)));
  }
  const int last = cfg.max_levels - 1;
  if (m.decode_mode) {
    m.suffix_decode = std::make_unique<BatchDecode>(
        m.ws.decode_config(), m.ws.level_workspace(last), m.ws.level_workspace_bytes(last));
  } else {
    m.suffix_prefill = std::make_unique<BatchPrefillPaged>(pc, m.ws.level_workspace(last),
                                                           m.ws.level_workspace_bytes(last));
  }
}

MultiLevelCascade::~MultiLevelCascade() = default;

CascadePlanInfo MultiLevelCascade::plan_info() const { return impl_->info; }

void MultiLevelCascade::forget_captured_graphs() {
  impl_->captured = {};
  for (auto& p : impl_->prefix) p->forget_captured_graphs();
  if (impl_->suffix_prefill) impl_->suffix_prefill->forget_captured_graphs();
  if (impl_->suffix_decode) impl_->suffix_decode->forget_captured_graphs();
}

void MultiLevelCascade::plan(const CascadeBatch& b, const CascadeShape& shape,
                             const CascadePlanOptions& opts, Stream stream) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  const MultiLevelCascadeConfig& cfg = m.cfg;
  runtime::ensure_context(cfg.device);
  m.life.begin_plan(stream);  // refused under capture; unplanned until commit()
  check(b.batch_size >= 0 && b.batch_size <= cfg.max_batch, "batch_size: expected 0..",
        cfg.max_batch, " (MultiLevelCascadeConfig.max_batch), got ", b.batch_size);
  check(b.kv_indptr != nullptr && b.kv_indices != nullptr &&
            (b.batch_size == 0 || b.kv_last_page_len != nullptr),
        "CascadeBatch: kv_indptr, kv_indices and kv_last_page_len are required host arrays");
  check(b.page_size >= 1, "CascadeBatch.page_size: expected >= 1, got ", b.page_size);
  // The checks the host path of the Python wrapper runs too (plan_checks.h); the largest page id
  // is compared with the cache's page count at run().
  const PageIdMax page_ids = check_cascade_plan(b, shape, PlanTarget::kGpu, opts.names);
  check(shape.num_qo_heads <= cfg.num_qo_heads && shape.head_dim <= cfg.head_dim,
        "CascadeShape: num_qo_heads / head_dim exceed MultiLevelCascadeConfig's (",
        cfg.num_qo_heads, " / ", cfg.head_dim, ")");
  check(b.kv_indptr[b.batch_size] <= cfg.max_pages,
        "kv_indptr[batch] = ", b.kv_indptr[b.batch_size],
        " pages exceed MultiLevelCascadeConfig.max_pages = ", cfg.max_pages);
  // Query rows per request.
  std::vector<int32_t> qo(b.batch_size + 1, 0);
  for (int i = 0; i < b.batch_size; ++i) {
    const int32_t n = b.qo_indptr ? b.qo_indptr[i + 1] - b.qo_indptr[i] : 1;
    check(n >= 0, "qo_indptr: expected non-decreasing, got qo_indptr[", i + 1, "] < qo_indptr[", i,
          "]");
    check(!m.decode_mode || n == 1, "qo_indptr: a decode cascade (MultiLevelCascadeConfig.",
          "max_qo_tokens = 0) takes one query row per request; request ", i, " has ", n);
    qo[i + 1] = qo[i] + n;
  }
  check(b.qo_indptr == nullptr || b.qo_indptr[0] == 0, "qo_indptr[0]: expected 0");
  const int64_t max_rows = m.ws.max_rows();
  check(qo.back() <= max_rows, "query rows: ", qo.back(), " exceed the configured ", max_rows);
  check(shape.dtype == DType::f16 || shape.dtype == DType::bf16,
        "CascadeShape.dtype: expected f16 or bf16, got ", dtype_name(shape.dtype));
  if (m.captured.any) {
    m.captured.check_rows(qo.back(), "query rows: " + std::to_string(qo.back()), "max-row views");
  }

  // Detection, cost model, decision.
  scheduler::PrefixSharingOptions po;
  po.max_levels = cfg.max_levels;
  po.min_group_size = opts.min_group_size;
  po.causal = opts.causal && !m.decode_mode;
  if (b.qo_indptr) po.qo_indptr = std::span<const int32_t>(qo);
  scheduler::PageTableSpan table{std::span<const int32_t>(b.kv_indptr, b.batch_size + 1),
                                 std::span<const int32_t>(b.kv_indices, b.kv_indptr[b.batch_size]),
                                 std::span<const int32_t>(b.kv_last_page_len, b.batch_size),
                                 b.page_size};
  scheduler::CascadeLayout layout;
  bool use = false;
  m.info = {};
  if (opts.use != CascadePlanOptions::Use::kNever && cfg.max_levels > 1) {
    layout = scheduler::detect_shared_prefixes(table, po);
    if (layout.has_shared_prefix()) {
      scheduler::CascadeProblemShape ps{shape.num_qo_heads, shape.num_kv_heads, shape.head_dim,
                                        static_cast<int>(dtype_size(shape.cache_dtype()))};
      const scheduler::CascadeEstimate est = scheduler::estimate_cascade(layout, ps);
      m.info.plain_kv_bytes = est.plain_kv_bytes;
      m.info.cascade_kv_bytes = est.cascade_kv_bytes;
      m.info.estimated_plain_us = est.plain_us;
      m.info.estimated_cascade_us = est.cascade_us;
      use = opts.use == CascadePlanOptions::Use::kAlways || est.use_cascade;
    }
  }
  if (!use) layout = plain_layout(b, qo);
  if (m.info.plain_kv_bytes == 0) {
    int64_t tokens = 0;
    for (int i = 0; i < b.batch_size; ++i)
      tokens += paged_kv_len(b.kv_indptr, b.kv_last_page_len, b.page_size, i);
    m.info.plain_kv_bytes = m.info.cascade_kv_bytes =
        tokens * 2 * shape.num_kv_heads * shape.head_dim *
        static_cast<int64_t>(dtype_size(shape.cache_dtype()));
  }
  if (!use) m.info.cascade_kv_bytes = m.info.plain_kv_bytes;
  const int64_t rows = qo.back();
  // Graph mode: always max_levels passes (empty shared levels in front), gather and merge.
  const int real_levels = layout.num_levels();
  const int levels = opts.enable_cuda_graph ? cfg.max_levels : real_levels;
  while (static_cast<int>(layout.levels.size()) < levels)
    layout.levels.insert(layout.levels.begin(), empty_level(rows));

  // Sub-plans: shared levels on the prefill objects (no mask), the suffix level on its object.
  const AttentionShape sub_shape{.num_qo_heads = shape.num_qo_heads,
                                 .num_kv_heads = shape.num_kv_heads,
                                 .head_dim = shape.head_dim,
                                 .q_dtype = shape.dtype,
                                 .kv_dtype = shape.cache_dtype(),
                                 .o_dtype = shape.dtype};
  PrefillPlanOptions pp;
  pp.sm_scale = opts.sm_scale;
  pp.enable_cuda_graph = opts.enable_cuda_graph;
  // A captured graph pins the query tile.
  if (opts.enable_cuda_graph) pp.tile_rows = tuning::Policy::kCascadeGraphTileRows;
  for (int l = 0; l + 1 < levels; ++l) {
    const scheduler::CascadeLevel& lv = layout.levels[l];
    pp.causal = false;
    m.prefix[l]->plan({.qo_indptr = lv.qo_indptr.data(),
                       .kv_indptr = lv.kv_indptr.data(),
                       .kv_last_page_len = lv.kv_last_page_len.data(),
                       .batch_size = lv.num_groups(),
                       .page_size = b.page_size},
                      sub_shape, pp, stream);
  }
  const scheduler::CascadeLevel& last = layout.levels.back();
  if (m.decode_mode) {
    DecodePlanOptions dp;
    dp.sm_scale = opts.sm_scale;
    dp.enable_cuda_graph = opts.enable_cuda_graph;
    m.suffix_decode->plan({.kv_indptr = last.kv_indptr.data(),
                           .kv_last_page_len = last.kv_last_page_len.data(),
                           .batch_size = last.num_groups(),
                           .page_size = b.page_size},
                          sub_shape, dp, stream);
  } else {
    pp.causal = opts.causal;
    m.suffix_prefill->plan({.qo_indptr = last.qo_indptr.data(),
                            .kv_indptr = last.kv_indptr.data(),
                            .kv_last_page_len = last.kv_last_page_len.data(),
                            .batch_size = last.num_groups(),
                            .page_size = b.page_size},
                           sub_shape, pp, stream);
  }

  // Index arrays to the device: row map, row count, each level's page ids — after the previous
  // copy left the pinned buffer and the last run() (on any stream) is done reading the region.
  std::byte* const base = m.life.begin_upload(stream);
  const int32_t nrows = static_cast<int32_t>(rows);
  std::memcpy(base + m.ws.rows_offset(), layout.qo_rows.data(), rows * 4);
  std::memcpy(base + m.ws.num_rows_offset(), &nrows, 4);
  m.life.upload(m.ws.index_device_ptr(), 0, m.ws.level_indices_offset(0), stream);
  for (int l = 0; l < levels; ++l) {
    const auto& ids = layout.levels[l].kv_indices;
    if (ids.empty()) continue;
    const size_t offset = m.ws.level_indices_offset(l);
    std::memcpy(base + offset, ids.data(), ids.size() * 4);
    m.life.upload(m.ws.index_device_ptr() + offset, offset, ids.size() * 4, stream);
  }
  m.life.end_upload(stream);

  if (m.gather_fn == nullptr || m.shape.dtype != shape.dtype) {
    const ops::KernelSpec spec = ops::cascade_kernel_spec(shape.dtype);
    const auto& mod = runtime::KernelCache::instance().module(spec.id, cfg.device, spec.make);
    const std::string tn = ops::device_type_name(shape.dtype, "q");
    m.gather_fn = mod.function("flashkv::cascade_gather_kernel<" + tn + ">");
    m.merge_fn = mod.function("flashkv::cascade_merge_kernel<" + tn + ">");
  }
  m.shape = shape;
  m.opts = opts;
  // The caller's strings may not outlive the call: the one run() uses is copied.
  m.opts.names = {};
  m.kv_indices_name = opts.names.kv_indices;
  m.layout = std::move(layout);
  m.num_levels = levels;
  m.rows = rows;
  m.page_ids = page_ids;
  m.gather = opts.enable_cuda_graph || !is_identity(m.layout.qo_rows);
  m.info.num_levels = real_levels;
  m.info.cascade = use;
  // Splits over every level's plan (each fits its share of the workspace).
  m.info.num_split_tiles = 0;
  m.info.split_limited = false;
  for (int l = 0; l + 1 < levels; ++l) {
    const PrefillPlanInfo pi = m.prefix[l]->plan_info();
    m.info.num_split_tiles += pi.num_split_tiles;
    m.info.split_limited = m.info.split_limited || pi.split_limited;
  }
  if (m.decode_mode) {
    const BatchDecode::PlanInfo di = m.suffix_decode->plan_info();
    m.info.num_split_tiles += di.num_split_tiles;
    m.info.split_limited = m.info.split_limited || di.split_limited;
  } else {
    const PrefillPlanInfo pi = m.suffix_prefill->plan_info();
    m.info.num_split_tiles += pi.num_split_tiles;
    m.info.split_limited = m.info.split_limited || pi.split_limited;
  }
  m.life.commit();
  m.info.plan_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void MultiLevelCascade::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                            const TensorView& lse, Stream stream) {
  Impl& m = *impl_;
  m.life.require_planned("run");
  const CascadeShape& sh = m.shape;
  const Device dev = Device::cuda(m.cfg.device);
  ops::PlannedQueries queries;
  queries.device = dev;
  queries.q_dtype = queries.o_dtype = sh.dtype;
  queries.num_qo_heads = sh.num_qo_heads;
  queries.head_dim = sh.head_dim;
  queries.rows = m.rows;
  queries.rows_of = "the plan's query rows";
  queries.graph = m.opts.enable_cuda_graph;
  ops::check_planned_queries(q, out, lse, queries);
  check_defined(kv.k, "paged_kv.k");
  // The plan's page ids against this cache, before anything is launched: no GPU work.
  check_page_ids_fit(m.page_ids, kv.num_pages(), m.kv_indices_name.c_str());
  runtime::ensure_context(m.cfg.device);
  const bool capturing = m.life.begin_run(m.opts.enable_cuda_graph, "CascadePlanOptions", stream);
  const int64_t max_rows = m.ws.max_rows();
  const TensorView qc = m.ws.rows_view(0, sh, max_rows);  // q in cascade order
  // Level l's page table: the cache tensors with this plan's device page ids for the level (its
  // indptr / last_page_len views only carry the shape the runs validate).
  auto level_kv = [&](int l) {
    const int groups = m.layout.levels[l].num_groups();
    PagedKVCache c = kv;
    c.indices = m.ws.level_indices_view(l);
    c.indptr = TensorView(c.indices.data(), DType::i32, {groups + 1}, dev);
    c.last_page_len = TensorView(c.indices.data(), DType::i32, {groups}, dev);
    return c;
  };
  const CascadeRowsParams rp{m.ws.num_rows_ptr(), m.ws.rows_ptr(), sh.num_qo_heads, sh.head_dim};
  const unsigned grid = m.ws.merge_grid();
  auto finish = [&] {
    if (capturing) m.captured.record(q, out, lse, 0, "", 0.f, {});
    m.life.end_run(capturing, stream);
  };
  if (!m.gather && m.num_levels == 1) {  // plain attention, in the caller's order
    if (m.decode_mode) {
      m.suffix_decode->run(q, level_kv(0), out, lse, stream);
    } else {
      m.suffix_prefill->run(q, level_kv(0), out, lse, stream);
    }
    return finish();
  }
  TensorView q_src = q;
  if (m.gather) {
    const void* src = q.data();
    void* dst = qc.data();
    long long sn = q.stride(0), shh = q.stride(1);
    void* args[] = {const_cast<CascadeRowsParams*>(&rp), &src, &sn, &shh, &dst};
    runtime::launch(m.gather_fn, {grid, 1, 1, 256, 1, 1, 0}, stream, args, "cascade gather");
    q_src = m.opts.enable_cuda_graph ? qc : qc.slice0(0, m.rows);
  }
  CascadeMergeParams mp{};
  mp.r = rp;
  mp.num_levels = m.num_levels;
  for (int l = 0; l < m.num_levels; ++l) {
    const bool graph = m.opts.enable_cuda_graph;
    const TensorView o_l = graph ? m.ws.rows_view(l + 1, sh, max_rows)
                                 : m.ws.rows_view(l + 1, sh, max_rows).slice0(0, m.rows);
    const TensorView s_l =
        graph ? m.ws.lse_view(l, sh, max_rows) : m.ws.lse_view(l, sh, max_rows).slice0(0, m.rows);
    if (l + 1 < m.num_levels) {
      m.prefix[l]->run(q_src, level_kv(l), o_l, s_l, stream);
    } else if (m.decode_mode) {
      m.suffix_decode->run(q_src, level_kv(l), o_l, s_l, stream);
    } else {
      m.suffix_prefill->run(q_src, level_kv(l), o_l, s_l, stream);
    }
    mp.o[l] = o_l.data();
    mp.lse[l] = s_l.data_as<const float>();
  }
  mp.out = out.data();
  mp.out_lse = lse.defined() ? lse.data_as<float>() : nullptr;
  mp.o_stride_n = out.stride(0);
  mp.o_stride_h = out.stride(1);
  mp.lse_stride_n = lse.defined() ? lse.stride(0) : 0;
  void* args[] = {&mp};
  runtime::launch(m.merge_fn, {grid, 1, 1, 256, 1, 1, 0}, stream, args, "cascade merge");
  finish();
}

}  // namespace flashkv
