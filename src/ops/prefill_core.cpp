// Host side of batch prefill: validation, plan (scheduler -> pinned buffer -> workspace), launch.
#include "ops/prefill_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "ops/jit_util.h"
#include "ops/variant_jit.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"

namespace flashkv {

namespace ops {
int default_prefill_tile_rows(std::span<const int64_t> qo_lens, int group) {
  return scheduler::choose_query_tile_rows(qo_lens, group);
}

std::string prefill_config_type(DType dtype, int head_dim, int rows, PrefillKV kv) {
  return std::string("flashkv::PrefillConfig<") + device_type_name(dtype, "q") + ", " +
         std::to_string(head_dim) + ", " + std::to_string(rows) + ", " +
         std::to_string(static_cast<int>(kv)) + ">";
}

std::string prefill_kernel_name(DType dtype, int head_dim, int rows, PrefillKV kv,
                                const VariantJit& variant) {
  return "flashkv::batch_prefill_kernel<" + prefill_config_type(dtype, head_dim, rows, kv) + ", " +
         variant.type + ">";
}

KernelSpec prefill_kernel_spec(DType dtype, int head_dim, int rows, int kv_source,
                               const VariantJit& variant) {
  check(kv_source >= 0 && kv_source <= 2, "prefill_kernel_spec: kv_source 0, 1 or 2, got ",
        kv_source);
  static const char* kNames[] = {"ragged", "paged", "paged_any"};
  const auto kv = static_cast<PrefillKV>(kv_source);
  const std::string id = std::string("prefill<") + dtype_name(dtype) + ",d" +
                         std::to_string(head_dim) + ",r" + std::to_string(rows) + "," +
                         kNames[kv_source] + (variant.id.empty() ? "" : "," + variant.id) + ">";
  const std::string kernel = prefill_kernel_name(dtype, head_dim, rows, kv, variant);
  const std::string extra = variant.source;
  return {id, [id, kernel, extra] {
            return make_request(id, "attention/prefill.cuh", {kernel}, extra);
          }};
}

std::string prefill_wgmma_unsupported(const std::string& arch, int rows, bool plain_attention,
                                      int head_dim, int max_smem_per_block) {
  if (arch != "sm_90a") return "it needs an sm_90a GPU (this is " + arch + ")";
  if (rows != 128) return "it runs 128-row query tiles (this plan's are " + std::to_string(rows) + ")";
  if (!plain_attention) return "it runs plain attention (this plan has a variant)";
  // + 1 KB: the kernel's static shared memory (the split merge's flag, 1024-aligned).
  const int smem = prefill_hopper_shape(head_dim).smem_bytes + 1024;
  if (smem > max_smem_per_block)
    return "it needs " + std::to_string(smem) + " bytes of shared memory per block at head_dim " +
           std::to_string(head_dim) + "; this GPU allows " + std::to_string(max_smem_per_block);
  return {};
}

std::string prefill_hopper_kernel_name(DType dtype, int head_dim, PrefillKV kv, bool kv_tma) {
  return std::string("flashkv::batch_prefill_hopper_ws_kernel<flashkv::PrefillHopperConfig<") +
         device_type_name(dtype, "q") + ", " + std::to_string(head_dim) + ", " +
         std::to_string(static_cast<int>(kv)) + ">, flashkv::DefaultVariant, " + (kv_tma ? "true" : "false") +
         ">";
}

KernelSpec prefill_hopper_kernel_spec(DType dtype, int head_dim, int kv_source) {
  check(kv_source >= 0 && kv_source <= 2, "prefill_hopper_kernel_spec: kv_source 0, 1 or 2, got ",
        kv_source);
  static const char* kNames[] = {"ragged", "paged", "paged_any"};
  const auto kv = static_cast<PrefillKV>(kv_source);
  const std::string id = std::string("prefill_wgmma<") + dtype_name(dtype) + ",d" +
                         std::to_string(head_dim) + "," + kNames[kv_source] + ">";
  // Both KV paths (by TMA, by the producer's cp.async): run() launches the one its tensors allow.
  const std::string tma = prefill_hopper_kernel_name(dtype, head_dim, kv, true);
  const std::string gather = prefill_hopper_kernel_name(dtype, head_dim, kv, false);
  return {id, [id, tma, gather] {
            return make_request(id, "attention/prefill_hopper_ws.cuh", {tma, gather}, "");
          }};
}
}  // namespace ops

namespace detail {

PrefillCore::PrefillCore(const BatchPrefillConfig& c, void* workspace, size_t bytes, bool is_paged,
                         const char* wrapper)
    : cfg(c), paged(is_paged), name(wrapper) {
  ws = ops::PrefillWorkspace(cfg, workspace, bytes);
  upload = runtime::PlanUpload(ws.plan_layout().bytes, cfg.device);
}

bool PrefillCore::load_kernel(DType dtype, int hd, int rows, ops::PrefillKV kv,
                              const ops::VariantJit& variant, bool wgmma) {
  if (kernel.fn != nullptr && kernel.dtype == dtype && kernel.head_dim == hd &&
      kernel.rows == rows && kernel.kv == kv && kernel.variant == variant.id && kernel.wgmma == wgmma)
    return true;
  const ops::KernelSpec spec =
      wgmma ? ops::prefill_hopper_kernel_spec(dtype, hd, static_cast<int>(kv))
            : ops::prefill_kernel_spec(dtype, hd, rows, static_cast<int>(kv), variant);
  const runtime::LoadedModule& mod =
      runtime::KernelCache::instance().module(spec.id, cfg.device, spec.make);
  Kernel k;
  k.fn = mod.function(wgmma ? ops::prefill_hopper_kernel_name(dtype, hd, kv, true)
                            : ops::prefill_kernel_name(dtype, hd, rows, kv, variant));
  k.geometry = ops::prefill_geometry(hd, rows, wgmma);
  k.wgmma = wgmma;
  if (wgmma) {
    k.fn_gather = mod.function(ops::prefill_hopper_kernel_name(dtype, hd, kv, false));
    // Their setmaxnreg splits (producer x 128 + consumers x 256 registers) are exactly the 168
    // per thread that the launch bound gives at entry: with fewer, the consumers' setmaxnreg.inc
    // would wait forever. A toolchain that allocates otherwise gets the mma.sync kernel.
    for (CUfunction fn : {k.fn, k.fn_gather}) {
      int regs = 0;
      runtime::check_cu(runtime::driver().cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn),
                        "cuFuncGetAttribute(NUM_REGS) of " + spec.id);
      if (regs != 65536 / static_cast<int>(k.geometry.threads) / 8 * 8) return false;
    }
  }
  const int fit = runtime::max_active_ctas_per_sm(k.fn, k.geometry.threads, k.geometry.smem, spec.id);
  check(fit >= 1, name, ": the prefill kernel ", spec.id, " needs ", k.geometry.smem,
        " bytes of shared memory per block, more than this GPU offers");
  // Persistent CTAs: as many per SM as fit at once (up to the config's k), so the scheduler's
  // CTAs all run concurrently and its balance holds.
  k.ctas_per_sm = std::min(cfg.ctas_per_sm, fit);
  k.dtype = dtype;
  k.head_dim = hd;
  k.rows = rows;
  k.kv = kv;
  k.variant = variant.id;
  k.id = spec.id;
  kernel = std::move(k);
  return true;
}

void PrefillCore::plan(const int32_t* qo_indptr, const int32_t* kv_indptr,
                       const int32_t* kv_last_page_len, int batch_size, int n_qo_heads,
                       int n_kv_heads, int hd, int page_sz, DType qt, DType kvt, DType ot,
                       const PrefillPlanOptions& o, Stream stream) {
  const auto t0 = std::chrono::steady_clock::now();
  runtime::ensure_context(cfg.device);
  check(!runtime::stream_is_capturing(stream), name,
        "::plan: the stream is being captured into a CUDA graph; plan() runs on the CPU and "
        "copies the schedule from pinned memory, so call it before each replay, outside the "
        "capture, and capture only run()");
  planned = false;  // a plan() that throws leaves the object unplanned, never half-planned
  check(batch_size >= 0 && batch_size <= cfg.max_batch, "batch_size: expected 0 <= batch_size <= ",
        cfg.max_batch, " (BatchPrefillConfig.max_batch), got ", batch_size);
  // The checks the host path of the Python wrappers runs too (plan_checks.h).
  check_prefill_plan(qo_indptr, kv_indptr, kv_last_page_len, batch_size, n_qo_heads, n_kv_heads, hd,
                     page_sz, paged, qt, kvt, ot);
  check(n_qo_heads <= cfg.num_qo_heads, "num_qo_heads: expected at most ", cfg.num_qo_heads,
        " (BatchPrefillConfig.num_qo_heads), got ", n_qo_heads);
  check(hd <= cfg.head_dim, "head_dim: expected at most ", cfg.head_dim,
        " (BatchPrefillConfig.head_dim), got ", hd);
  const int group = n_qo_heads / n_kv_heads;
  static_assert(kMaxPrefillGroup <= scheduler::kMaxPrefillTileRows);
  check(o.fixed_split_size >= 0, "fixed_split_size: expected >= 0, got ", o.fixed_split_size);
  check(o.sm_scale >= 0.0f && std::isfinite(o.sm_scale),
        "sm_scale: expected a finite value >= 0 (0 means 1/sqrt(head_dim)), got ", o.sm_scale);
  check(o.tile_rows == 0 || o.tile_rows == 16 || o.tile_rows == 32 || o.tile_rows == 64 ||
            o.tile_rows == 128,
        "PrefillPlanOptions.tile_rows: expected 0 (heuristic), 16, 32, 64 or 128, got ",
        o.tile_rows);
  check(o.tile_rows == 0 || o.tile_rows >= group, "PrefillPlanOptions.tile_rows: expected >= the ",
        "GQA group (", group, ": a tile holds whole query tokens), got ", o.tile_rows);

  qo_lens.resize(batch_size);
  kv_lens.resize(batch_size);
  for (int i = 0; i < batch_size; ++i) {
    qo_lens[i] = qo_indptr[i + 1] - qo_indptr[i];
    kv_lens[i] = paged ? paged_kv_len(kv_indptr, kv_last_page_len, page_sz, i)
                       : kv_indptr[i + 1] - kv_indptr[i];
  }
  const int64_t qo_total = batch_size > 0 ? qo_indptr[batch_size] : 0;
  const int64_t kv_total = batch_size > 0 ? kv_indptr[batch_size] : 0;
  check(qo_total <= cfg.max_qo_tokens, "qo_indptr[batch_size] = ", qo_total,
        ": expected at most ", cfg.max_qo_tokens, " query tokens (BatchPrefillConfig.max_qo_tokens)");
  // A host copy of the page ids: checked here (>= 0, and < num_pages when given); the paged run()
  // compares the largest with the cache's page count before it launches (plan_checks.h).
  check(o.num_pages >= 0,
        "PrefillPlanOptions.num_pages: expected >= 0 (0: the cache's, at run()), got ",
        o.num_pages);
  const PageIdMax plan_page_ids = paged && o.kv_indices_host != nullptr
                                      ? check_page_ids(o.kv_indices_host, kv_total, o.num_pages)
                                      : PageIdMax{};

  // The query tile (the paper's heuristic unless the caller fixes it) and the variant (plain
  // attention unless opts.variant says otherwise) select the kernel, JIT-compiled here (first
  // use only) so run() never compiles.
  ops::VariantJit vj = ops::variant_jit(o.variant);
  // Asked for the wgmma kernel, the caller gets its 128-row tile unless it fixed another.
  const int rows = o.tile_rows > 0                         ? o.tile_rows
                   : o.backend == PrefillBackend::kWgmma ? 128
                                                           : ops::default_prefill_tile_rows(qo_lens, group);
  if (arch.empty()) {  // once: plan() stays on the CPU
    arch = runtime::device_arch(cfg.device);
    max_smem = device_info(cfg.device).max_smem_per_block;
  }
  const std::string why_not = ops::prefill_wgmma_unsupported(arch, rows, vj.id.empty(), hd, max_smem);
  check(o.backend != PrefillBackend::kWgmma || why_not.empty(),
        "PrefillPlanOptions.backend: the wgmma kernel cannot run this plan: ", why_not);
  const bool wgmma = o.backend != PrefillBackend::kMmaSync && why_not.empty();
  if (!load_kernel(qt, hd, rows, ops::prefill_kv_source(paged, page_sz), vj, wgmma)) {
    check(o.backend != PrefillBackend::kWgmma, "PrefillPlanOptions.backend: the wgmma kernel cannot run this plan: ",
          "its compiled register count is not the 168 per thread its register split needs");
    load_kernel(qt, hd, rows, ops::prefill_kv_source(paged, page_sz), vj, false);
  }
  const int num_ctas = ws.max_ctas() / cfg.ctas_per_sm * kernel.ctas_per_sm;

  // A built-in description's causal flag and sm_scale apply where the options set none.
  const bool causal = o.causal || vj.causal;
  const float scale = resolve_sm_scale(o.sm_scale > 0.f ? o.sm_scale : vj.sm_scale, hd);
  // The variant's arguments, checked and packed now (a bad one fails plan(), not every run()).
  const VariantArgsBlock vargs = ops::pack_variant_args(
      o.variant, {name, Device::cuda(cfg.device), batch_size, qo_total,
                  n_qo_heads, hd, batch_size == 1 ? qo_lens[0] * kv_lens[0] : -1});
  if (captured.any) {  // refuse a plan the captured graph cannot run, before anything changes
    const auto& c = captured;
    check(qo_total <= c.q_rows && qo_total <= c.out_rows && (c.lse_rows < 0 || qo_total <= c.lse_rows),
          "qo_indptr[batch_size] = ", qo_total, " exceeds the ", std::min(c.q_rows, c.out_rows),
          " rows of q/out a captured CUDA graph holds; capture run() with max_qo_tokens-row views");
    check(kv_total <= c.kv_capacity, "kv_indptr[batch_size] = ", kv_total, " exceeds the ",
          c.kv_capacity, paged ? " kv_indices entries" : " KV rows",
          " a captured CUDA graph holds; capture with the full buffers");
    check(kernel.id == c.kernel_id && scale == c.sm_scale && causal == c.causal &&
              n_qo_heads == c.num_qo_heads && n_kv_heads == c.num_kv_heads &&
              page_sz == c.page_size,
          "plan: a captured CUDA graph runs kernel ", c.kernel_id, " (sm_scale ", c.sm_scale,
          ", causal ", c.causal, ", heads ", c.num_qo_heads, "/", c.num_kv_heads, ", page_size ",
          c.page_size, "); this plan needs ", kernel.id, " (sm_scale ", scale, ", causal ", causal,
          ", heads ", n_qo_heads, "/", n_kv_heads, ", page_size ", page_sz,
          "). Fix PrefillPlanOptions.tile_rows (and backend) for graphs, or capture a new graph.");
    check(ops::same_variant_args(vargs, c.variant_args),
          "plan: a captured CUDA graph holds the variant arguments of its capture (values and "
          "tensor pointers); this plan's differ. Capture a new graph for new variant arguments.");
  }

  scheduler::PrefillScheduleOptions so;
  so.num_ctas = num_ctas;
  so.num_kv_heads = n_kv_heads;
  so.group = group;
  so.tile_rows = rows;
  so.causal = causal;
  so.fixed_split_size = o.fixed_split_size;
  so.disable_split_kv = o.disable_split_kv;
  // The wgmma kernel loads KV tiles by TMA where every work item starts on a tile.
  const int tile = kernel.wgmma ? prefill_hopper_shape(hd).tile : 1;
  so.split_align = tile;
  so.max_slots = ws.slot_capacity(rows);
  so.max_work_items = ws.max_work_items();
  scheduler::PrefillSchedule& s = schedule;
  try {
    scheduler::plan_prefill(qo_lens, kv_lens, so, &s);
  } catch (const Error& e) {
    // Dynamic splitting fits the workspace; fixed_split_size cannot give way. Say what a slot
    // costs, so the caller can size the buffer.
    if (o.fixed_split_size == 0) throw;
    fail(e.what(), ". A slot is ", rows, " rows of (", hd, " + 1) floats (",
         static_cast<size_t>(rows) * (hd + 1) * sizeof(float), " bytes); this workspace has ",
         ws.bytes_used(), " bytes in use, ", ws.full_bytes(),
         " (workspace_bytes) hold 2 slots per CTA");
  }
  // The op's part of each item: where its queries and pages start and its causal diagonal (the
  // scheduler already set which merge item a split item's partial state belongs to).
  // The lengths are what the variant's hooks see (positions, the custom mask's row stride).
  for (PrefillMergeItem& m : s.merge) {
    m.q_base = qo_indptr[m.request];
    m.qo_len = static_cast<int>(qo_lens[m.request]);
    m.kv_len = static_cast<int>(kv_lens[m.request]);
  }
  // In the same pass: whether every item starts on a KV tile (the wgmma kernel's TMA loads).
  bool tiles_aligned = kernel.wgmma;
  for (PrefillWorkItem& w : s.work) {
    w.page_base = kv_indptr[w.request];
    w.q_base = qo_indptr[w.request];
    w.diag = static_cast<int>(kv_lens[w.request] - qo_lens[w.request]);
    w.qo_len = static_cast<int>(qo_lens[w.request]);
    w.kv_len = static_cast<int>(kv_lens[w.request]);
    tiles_aligned = tiles_aligned && w.kv_start % tile == 0;
  }
  check(!captured.any || !captured.kv_tma || tiles_aligned,
        "plan: a captured CUDA graph loads KV tiles by TMA, which needs every work item to start on a ",
        tile, "-token KV tile; this plan's fixed_split_size (", o.fixed_split_size,
        ") cuts them elsewhere. Use a multiple of ", tile, " or capture a new graph.");
  int used_ctas = 0;
  for (int c = 0; c < s.num_ctas; ++c)
    used_ctas = s.cta_work_indptr[c + 1] > s.cta_work_indptr[c] ? c + 1 : used_ctas;
  const int sched_ctas = s.num_ctas;
  // The workspace's CTA index array is laid out for the most CTAs the config allows: pad it, so
  // the device pointers never depend on the kernel's occupancy.
  s.cta_work_indptr.resize(static_cast<size_t>(ws.max_ctas()) + 1, s.cta_work_indptr.back());
  s.num_ctas = ws.max_ctas();

  // Into the workspace, in stream order after the last run() (on whatever stream) read it.
  const size_t plan_bytes =
      scheduler::serialize_prefill_schedule(s, ws.plan_layout(), upload.begin(stream));
  upload.copy(ws.plan_device_ptr(), 0, plan_bytes, stream);
  upload.end(stream);

  // With CUDA graphs the grid must be the same at every replay: launch every scheduled CTA.
  grid = static_cast<unsigned>(o.enable_cuda_graph ? sched_ctas : used_ctas);
  batch = batch_size;
  num_qo_heads = n_qo_heads;
  num_kv_heads = n_kv_heads;
  head_dim = hd;
  page_size = paged ? page_sz : 0;
  q_dtype = qt;
  kv_dtype = kvt;
  o_dtype = ot;
  opts = o;
  opts.kv_indices_host = nullptr;  // not kept: the caller's array may not outlive the call
  opts.causal = causal;
  variant_jit = std::move(vj);
  variant_args = vargs;
  sm_scale = scale;
  nnz_qo = qo_total;
  nnz_kv = kv_total;
  page_ids = plan_page_ids;
  info.num_ctas = sched_ctas;
  info.num_work_items = static_cast<int>(s.work.size());
  info.num_split_tiles = static_cast<int>(s.merge.size());
  info.num_partial_states = s.num_slots;
  info.slot_capacity = so.max_slots;
  info.split_limited = s.slot_limited;
  info.tile_rows = rows;
  info.wgmma = kernel.wgmma;
  info.chunk_bound = s.chunk_bound;
  kv_tma_plan = tiles_aligned;
  q_tile_tokens = s.tile_tokens;
  planned = true;
  info.plan_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void PrefillCore::check_io(const TensorView& q, const TensorView& out, const TensorView& lse,
                           PrefillParams& p) const {
  check(planned, name, "::run: called before a successful plan()");
  const Device dev = Device::cuda(cfg.device);
  // Under CUDA graphs q/out/lse may hold more rows than this plan (capture them at max_qo_tokens
  // so later, larger plans still fit); eagerly they must match the plan exactly.
  const bool graph = opts.enable_cuda_graph;
  const auto check_rows = [&](const TensorView& t, const char* what) {
    if (graph ? t.size(0) < nnz_qo : t.size(0) != nnz_qo) {
      fail(what, ": expected ", graph ? "at least " : "", nnz_qo,
           " rows (qo_indptr[batch_size] of the plan), got ", t.size(0));
    }
  };
  for (auto [t, what, dtype] : {std::tuple{&q, "q", q_dtype}, {&out, "out", o_dtype}}) {
    check_device(*t, what, dev);
    check_dtype(*t, what, dtype);
    check_ndim(*t, what, 3);
    check_rows(*t, what);
    check_shape(*t, what, {-1, num_qo_heads, head_dim});
    check_last_dim_contiguous(*t, what);
    check_aligned(*t, what, 16);
    check(t->stride(0) % 8 == 0 && t->stride(1) % 8 == 0, what,
          ": row strides must be multiples of 16 bytes");
  }
  check((nnz_qo <= 1 || out.stride(0) != 0) && (num_qo_heads <= 1 || out.stride(1) != 0),
        "out: rows must not overlap (zero stride)");
  check(variant_jit.use_softmax || !lse.defined(),
        "lse: the plan's variant has no softmax (sigmoid attention); pass an undefined lse");
  if (lse.defined()) {
    check_device(lse, "lse", dev);
    check_dtype(lse, "lse", DType::f32);
    check_ndim(lse, "lse", 2);
    check_rows(lse, "lse");
    check_shape(lse, "lse", {-1, num_qo_heads});
    check(lse.stride(1) == 1 && (lse.size(0) <= 1 || lse.stride(0) >= num_qo_heads),
          "lse: expected contiguous heads and non-overlapping rows");
    check_aligned(lse, "lse", 4);
  }
  p.q = q.data();
  p.out = out.data();
  p.lse = lse.defined() ? lse.data_as<float>() : nullptr;
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.o_stride_n = out.stride(0);
  p.o_stride_h = out.stride(1);
  p.lse_stride_n = lse.defined() ? lse.stride(0) : 0;
  p.variant = variant_args;
}

void PrefillCore::set_tma(PrefillParams& p, const TensorView& q, const ops::PrefillKVTensors& kv) {
  p.kv_tma = 0;
  if (!kernel.wgmma || grid == 0) return;  // (no launch: a plan without query tokens needs no map)
  TmaMaps& m = tma_maps;
  // The query tile is always a TMA box; check_io has checked what TMA needs of q.
  const ops::PrefillQTensor qt{q.data(), q_dtype, head_dim, num_qo_heads, q.size(0), q.stride(0), q.stride(1)};
  const int group = num_qo_heads / num_kv_heads;
  if (!m.q_valid || !(m.q == qt) || m.q_tokens != q_tile_tokens || m.q_group != group) {
    m.q_valid = ops::encode_prefill_q_tma(qt, group, q_tile_tokens, m.params);
    m.q = qt;
    m.q_tokens = q_tile_tokens;
    m.q_group = group;
  }
  check(m.q_valid, name, "::run: the CUDA driver refused a TMA descriptor for q (", q.size(0), " rows, strides ",
        q.stride(0), ", ", q.stride(1), ")");
  p.q_tma_tokens = q_tile_tokens;
  p.q_tma = m.params.q_tma;
  // KV by TMA where the plan and the tensors allow it, else the producer's cp.async.
  if (!kv_tma_plan || !ops::prefill_kv_tma_fits(kv)) return;
  if (!m.kv_valid || !(m.kv == kv)) {  // the driver may refuse: cp.async then
    m.kv_valid = ops::encode_prefill_kv_tma(kv, m.params);
    m.kv = kv;
  }
  if (!m.kv_valid) return;
  p.kv_tma = 1;
  p.k_tma = m.params.k_tma;
  p.v_tma = m.params.v_tma;
  p.k1_tma = m.params.k1_tma;
  p.v1_tma = m.params.v1_tma;
}

void PrefillCore::launch(PrefillParams& p, const TensorView& q, const TensorView& out,
                         const TensorView& lse, int64_t kv_capacity, Stream stream) {
  runtime::ensure_context(cfg.device);
  const bool capturing = runtime::stream_is_capturing(stream);
  check(opts.enable_cuda_graph || !capturing, name,
        "::run: the stream is being captured into a CUDA graph, but plan() was called without "
        "enable_cuda_graph; its grid depends on the batch, so a replay after another plan() would "
        "be wrong. Plan with PrefillPlanOptions.enable_cuda_graph = true.");
  p.page_size = page_size;
  p.page_shift = -1;
  for (int sh = 0; sh < 31 && page_size > 0; ++sh)
    if (page_size == (1 << sh)) p.page_shift = sh;
  p.group = num_qo_heads / num_kv_heads;
  p.causal = opts.causal ? 1 : 0;
  p.sm_scale_log2 = static_cast<float>(sm_scale * kLog2e);
  p.plan = ws.plan_ptrs();
  info.kv_tma = p.kv_tma != 0;
  void* args[] = {&p};
  if (grid > 0) {
    // The Hopper kernel's KV path is compiled in: the gather instantiation where KV is not by TMA.
    CUfunction fn = kernel.wgmma && p.kv_tma == 0 ? kernel.fn_gather : kernel.fn;
    runtime::launch(fn, {grid, 1, 1, kernel.geometry.threads, 1, 1, kernel.geometry.smem}, stream, args, kernel.id);
  }
  if (capturing) {
    captured = {true,      q.size(0),    out.size(0),  lse.defined() ? lse.size(0) : -1,
                kv_capacity, kernel.id, sm_scale,     opts.causal,
                num_qo_heads, num_kv_heads, page_size};
    captured.variant_args = p.variant;
    captured.kv_tma = p.kv_tma != 0;
  } else {
    // A later plan() on any stream waits for this run before it rewrites the workspace. (Not
    // recorded while capturing: an event recorded inside a capture cannot be waited on outside.)
    upload.record_run(stream);
  }
}

}  // namespace detail
}  // namespace flashkv
