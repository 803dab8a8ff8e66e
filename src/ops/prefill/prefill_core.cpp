// Host side of batch prefill: validation, plan (scheduler -> pinned buffer -> workspace), launch.
#include "ops/prefill/prefill_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "ops/jit/jit_util.h"
#include "ops/jit/variant_jit.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"
#include "tuning/policy.cuh"

namespace flashkv {

namespace ops {
int default_prefill_tile_rows(std::span<const int64_t> qo_lens, int group) {
  return scheduler::choose_query_tile_rows(qo_lens, group);
}

std::string prefill_wgmma_unsupported(const std::string& arch, int rows, bool variant_rewrites_kv,
                                      int head_dim, int max_smem_per_block, int kv_elem_bytes,
                                      bool variant_softmax) {
  if (arch != "sm_90a") return "it needs an sm_90a GPU (this is " + arch + ")";
  if (rows != 128)
    return "it runs 128-row query tiles (this plan's are " + std::to_string(rows) + ")";
  if (variant_rewrites_kv)
    return "this plan's variant rewrites keys or values (a key RoPE, key_transform or "
           "value_transform), which only the mma.sync kernel runs";
  // Without softmax (sigmoid attention) and with a window, ptxas serializes the kernel's wgmma
  // for want of registers (C7512); such variants are rare in serving, so all take mma.sync.
  if (!variant_softmax)
    return "this plan's variant has no softmax (sigmoid attention), which only the mma.sync "
           "kernel runs";
  // + 1 KB: the kernel's static shared memory (the split merge's flag, 1024-aligned).
  const int smem = prefill_hopper_shape(head_dim, kv_elem_bytes).smem_bytes + 1024;
  if (smem > max_smem_per_block)
    return "it needs " + std::to_string(smem) + " bytes of shared memory per block at head_dim " +
           std::to_string(head_dim) + "; this GPU allows " + std::to_string(max_smem_per_block);
  return {};
}

}  // namespace ops

namespace detail {

PrefillCore::PrefillCore(const BatchPrefillConfig& c, void* workspace, size_t bytes, bool is_paged,
                         const char* wrapper)
    : cfg(c), paged(is_paged), name(wrapper) {
  ws = ops::PrefillWorkspace(cfg, workspace, bytes);
  life = ops::PlanLifecycle(name, ws.plan_layout().bytes, cfg.device);
}

bool PrefillCore::load_kernel(const PrefillKernelKey& key) {
  const bool fresh = !kernel.holds(key);
  const ops::LoadedKernel& k = kernel.load(key, cfg.device);
  if (!fresh && kernel_fit.id == k.id) return kernel_fit.runnable;
  kernel_fit = {k.id, 0, false};
  if (key.wgmma) {
    // Its setmaxnreg splits (producer x 128 + consumers x 256 registers) are exactly the 168 per
    // thread that the launch bound gives at entry: with fewer, the consumers' setmaxnreg.inc would
    // wait forever. A toolchain that allocates otherwise gets the mma.sync kernel.
    for (CUfunction fn : k.functions) {
      int regs = 0;
      runtime::check_cu(runtime::driver().cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn),
                        "cuFuncGetAttribute(NUM_REGS) of " + k.id);
      if (regs != 65536 / static_cast<int>(k.geometry.threads) / 8 * 8) return false;
    }
  }
  const int fit =
      runtime::max_active_ctas_per_sm(k.functions[0], k.geometry.threads, k.geometry.smem, k.id);
  check(fit >= 1, name, ": the prefill kernel ", k.id, " needs ", k.geometry.smem,
        " bytes of shared memory per block, more than this GPU offers");
  // Persistent CTAs: as many per SM as fit at once (up to the config's k), so the scheduler's
  // CTAs all run concurrently and its balance holds.
  kernel_fit.ctas_per_sm = std::min(cfg.ctas_per_sm, fit);
  kernel_fit.runnable = true;
  return true;
}

void PrefillCore::plan(const PrefillBatch& b, const AttentionShape& sh, const PrefillPlanOptions& o,
                       Stream stream) {
  const auto t0 = std::chrono::steady_clock::now();
  runtime::ensure_context(cfg.device);
  life.begin_plan(stream);  // refused under capture; unplanned until commit()
  check_arguments(b, sh, o);
  ops::VariantJit vj;
  select_kernel(b, sh, o, vj);
  const PrefillKernelKey& key = *kernel.key();

  // A built-in description's causal flag and sm_scale apply where the options set none.
  const bool causal = o.causal || vj.causal;
  const float scale = resolve_sm_scale(o.sm_scale > 0.f ? o.sm_scale : vj.sm_scale, sh.head_dim);
  const int64_t qo_total = b.batch_size > 0 ? b.qo_indptr[b.batch_size] : 0;
  const int64_t kv_total = b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0;
  // The variant's arguments, checked and packed now (a bad one fails plan(), not every run()).
  const VariantArgsBlock vargs = ops::pack_variant_args(
      o.variant, {name, Device::cuda(cfg.device), b.batch_size, qo_total, sh.num_qo_heads,
                  sh.head_dim, b.batch_size == 1 ? qo_lens[0] * kv_lens[0] : -1});
  const int page_sz = paged ? b.page_size : 0;
  check_captured_graph_fits(sh, qo_total, kv_total, causal, scale, page_sz, vargs);
  const bool tiles_aligned = schedule_work(b, sh, o, causal, key.rows);
  const int tile = key.wgmma ? prefill_hopper_shape(sh.head_dim, key.has_fp8_kv() ? 1 : 2).tile : 1;
  check(!captured.any || !captured.kv_tma || tiles_aligned,
        "plan: a captured CUDA graph loads KV tiles by TMA, which needs every work item to start "
        "on a ",
        tile, "-token KV tile; this plan's fixed_split_size (", o.fixed_split_size,
        ") cuts them elsewhere. Use a multiple of ", tile, " or capture a new graph.");
  scheduler::PrefillSchedule& s = schedule;
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
      scheduler::serialize_prefill_schedule(s, ws.plan_layout(), life.begin_upload(stream));
  life.upload(ws.plan_device_ptr(), 0, plan_bytes, stream);
  life.end_upload(stream);

  // With CUDA graphs the grid must be the same at every replay: launch every scheduled CTA.
  grid = static_cast<unsigned>(o.enable_cuda_graph ? sched_ctas : used_ctas);
  batch = b.batch_size;
  shape = sh;
  page_size = page_sz;
  opts = o;
  opts.kv_indices_host = nullptr;  // not kept: the caller's array may not outlive the call
  opts.names = {};                 // nor its strings (the one run() uses is copied)
  kv_indices_name = o.names.kv_indices;
  opts.causal = causal;
  variant_jit = std::move(vj);
  variant_args = vargs;
  sm_scale = scale;
  nnz_qo = qo_total;
  nnz_kv = kv_total;
  info.num_ctas = sched_ctas;
  info.num_work_items = static_cast<int>(s.work.size());
  info.num_split_tiles = static_cast<int>(s.merge.size());
  info.num_partial_states = s.num_slots;
  info.split_limited = s.slot_limited;
  info.tile_rows = key.rows;
  info.wgmma = key.wgmma;
  info.chunk_bound = s.chunk_bound;
  kv_tma_plan = tiles_aligned;
  q_tile_tokens = s.tile_tokens;
  life.commit();
  info.plan_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// plan() step 1: the arguments against the config and each other; the requests' lengths; the host
// page ids where given.
void PrefillCore::check_arguments(const PrefillBatch& b, const AttentionShape& sh,
                                  const PrefillPlanOptions& o) {
  check(b.batch_size >= 0 && b.batch_size <= cfg.max_batch,
        "batch_size: expected 0 <= batch_size <= ", cfg.max_batch,
        " (BatchPrefillConfig.max_batch), got ", b.batch_size);
  check(
      paged || (b.kv_last_page_len == nullptr && b.page_size == 0), name,
      "::plan: ragged KV has no pages: expected kv_last_page_len = nullptr and page_size = 0, got ",
      b.kv_last_page_len == nullptr ? "nullptr" : "an array", " and ", b.page_size);
  // The checks the host path of the Python wrappers runs too (plan_checks.h).
  check_prefill_plan(b.qo_indptr, b.kv_indptr, b.kv_last_page_len, b.batch_size, sh.num_qo_heads,
                     sh.num_kv_heads, sh.head_dim, b.page_size, paged, sh.q_dtype, sh.kv_dtype,
                     sh.o_dtype, PlanTarget::kGpu, o.names, sh.kv_format);
  check(sh.num_qo_heads <= cfg.num_qo_heads, "num_qo_heads: expected at most ", cfg.num_qo_heads,
        " (BatchPrefillConfig.num_qo_heads), got ", sh.num_qo_heads);
  check(sh.head_dim <= cfg.head_dim, "head_dim: expected at most ", cfg.head_dim,
        " (BatchPrefillConfig.head_dim), got ", sh.head_dim);
  const int group = sh.num_qo_heads / sh.num_kv_heads;
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

  qo_lens.resize(b.batch_size);
  kv_lens.resize(b.batch_size);
  for (int i = 0; i < b.batch_size; ++i) {
    qo_lens[i] = b.qo_indptr[i + 1] - b.qo_indptr[i];
    kv_lens[i] = paged ? paged_kv_len(b.kv_indptr, b.kv_last_page_len, b.page_size, i)
                       : b.kv_indptr[i + 1] - b.kv_indptr[i];
  }
  const int64_t qo_total = b.batch_size > 0 ? b.qo_indptr[b.batch_size] : 0;
  const int64_t kv_total = b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0;
  check(qo_total <= cfg.max_qo_tokens, "qo_indptr[batch_size] = ", qo_total, ": expected at most ",
        cfg.max_qo_tokens, " query tokens (BatchPrefillConfig.max_qo_tokens)");
  // A host copy of the page ids: checked here (>= 0, and < num_pages when given); the paged run()
  // compares the largest with the cache's page count before it launches (plan_checks.h).
  check(o.num_pages >= 0,
        "PrefillPlanOptions.num_pages: expected >= 0 (0: the cache's, at run()), got ",
        o.num_pages);
  page_ids = paged && o.kv_indices_host != nullptr
                 ? check_page_ids(o.kv_indices_host, kv_total, o.num_pages, o.names.kv_indices)
                 : PageIdMax{};
}

// plan() step 2.
void PrefillCore::select_kernel(const PrefillBatch& b, const AttentionShape& sh,
                                const PrefillPlanOptions& o, ops::VariantJit& vj) {
  vj = ops::variant_jit(o.variant);
  const int group = sh.num_qo_heads / sh.num_kv_heads;
  // Asked for the wgmma kernel, the caller gets its 128-row tile unless it fixed another.
  const int rows = o.tile_rows > 0 ? o.tile_rows
                   : o.backend == PrefillBackend::kWgmma
                       ? 128
                       : ops::default_prefill_tile_rows(qo_lens, group);
  if (arch.empty()) {  // once: plan() stays on the CPU
    arch = runtime::device_arch(cfg.device);
    max_smem = device_info(cfg.device).max_smem_per_block;
  }
  const bool fp8 = is_fp8_dtype(sh.kv_dtype);
  const std::string why_not =
      ops::prefill_wgmma_unsupported(arch, rows, vj.transforms_kv, sh.head_dim, max_smem,
                                     static_cast<int>(dtype_size(sh.kv_dtype)), vj.use_softmax);
  check(o.backend != PrefillBackend::kWgmma || why_not.empty(),
        "PrefillPlanOptions.backend: the wgmma kernel cannot run this plan: ", why_not);
  PrefillKernelKey key;
  key.dtype = sh.q_dtype;
  key.head_dim = sh.head_dim;
  key.rows = rows;
  key.kv = prefill_kv_source(paged, b.page_size);
  key.wgmma = o.backend != PrefillBackend::kMmaSync && why_not.empty();
  key.variant = vj.kernel();
  key.fp8_kv = fp8 ? sh.kv_dtype : DType::f32;
  key.widen_kv = ops::fp8_kv_widened(sh.kv_dtype, vj);
  if (!load_kernel(key)) {
    check(o.backend != PrefillBackend::kWgmma,
          "PrefillPlanOptions.backend: the wgmma kernel cannot run this plan: ",
          "its compiled register count is not the 168 per thread its register split needs");
    key.wgmma = false;
    load_kernel(key);
  }
}

// plan() step 3: a captured graph keeps its q/out/lse/KV pointers, kernel, sm_scale, mask, heads,
// page size and variant arguments: refuse a plan it cannot run (before anything changes).
void PrefillCore::check_captured_graph_fits(const AttentionShape& sh, int64_t qo_total,
                                            int64_t kv_total, bool causal, float scale, int page_sz,
                                            const VariantArgsBlock& args) const {
  const Captured& c = captured;
  if (!c.any) return;
  c.check_rows(qo_total, "qo_indptr[batch_size] = " + std::to_string(qo_total),
               "max_qo_tokens-row views");
  c.check_kv(kv_total, "kv_indptr[batch_size] = " + std::to_string(kv_total),
             paged ? " kv_indices entries" : " KV rows");
  const std::string& id = kernel.kernel().id;
  check(id == c.kernel_id && scale == c.sm_scale && causal == c.causal &&
            sh.num_qo_heads == c.num_qo_heads && sh.num_kv_heads == c.num_kv_heads &&
            page_sz == c.page_size,
        "plan: a captured CUDA graph runs kernel ", c.kernel_id, " (sm_scale ", c.sm_scale,
        ", causal ", c.causal, ", heads ", c.num_qo_heads, "/", c.num_kv_heads, ", page_size ",
        c.page_size, "); this plan needs ", id, " (sm_scale ", scale, ", causal ", causal,
        ", heads ", sh.num_qo_heads, "/", sh.num_kv_heads, ", page_size ", page_sz,
        "). Fix PrefillPlanOptions.tile_rows (and backend) for graphs, or capture a new graph.");
  c.check_variant_args(args);
}

// PrefillItemOrder::kAuto: head-major where the batch's KV exceeds the L2 and some request's KV
// per head is long (tuning/sm90.cuh says why and what was measured).
bool PrefillCore::prefer_head_major(const AttentionShape& sh) const {
  const int64_t token_head_bytes =
      int64_t{sh.head_dim} * 2 * static_cast<int64_t>(dtype_size(sh.kv_dtype));  // K and V
  int64_t total = 0, longest = 0;
  for (int64_t l : kv_lens) {
    total += l;
    longest = std::max(longest, l);
  }
  return total * sh.num_kv_heads * token_head_bytes > tuning::Policy::kPrefillHeadMajorKvBytes &&
         longest * token_head_bytes >= tuning::Policy::kPrefillHeadMajorHeadKvBytes;
}

// plan() step 4.
bool PrefillCore::schedule_work(const PrefillBatch& b, const AttentionShape& sh,
                                const PrefillPlanOptions& o, bool causal, int rows) {
  const bool wgmma = kernel.key()->wgmma;
  scheduler::PrefillScheduleOptions so;
  so.num_ctas = ws.max_ctas() / cfg.ctas_per_sm * kernel_fit.ctas_per_sm;
  so.num_kv_heads = sh.num_kv_heads;
  so.group = sh.num_qo_heads / sh.num_kv_heads;
  so.tile_rows = rows;
  so.causal = causal;
  so.fixed_split_size = o.fixed_split_size;
  so.disable_split_kv = o.disable_split_kv;
  // The wgmma kernel loads KV tiles by TMA where every work item starts on a tile.
  const int tile =
      wgmma ? prefill_hopper_shape(sh.head_dim, kernel.key()->has_fp8_kv() ? 1 : 2).tile : 1;
  so.split_align = tile;
  // A built-in sliding window: tiles are scheduled over the keys their rows can see, so a 4096
  // window over a 32k prompt costs about the window (a user variant's first_visible_key is only
  // known to the kernel, which skips the KV tiles left of it).
  so.window_left = o.variant.is_builtin() ? o.variant.builtin_description().window_left : -1;
  so.head_major = o.item_order == PrefillItemOrder::kHeadMajor ||
                  (o.item_order == PrefillItemOrder::kAuto && prefer_head_major(sh));
  so.max_slots = ws.slot_capacity(rows);
  so.max_work_items = ws.max_work_items();
  scheduler::PrefillSchedule& s = schedule;
  try {
    scheduler::plan_prefill(qo_lens, kv_lens, so, &s);
  } catch (const Error& e) {
    // Dynamic splitting fits the workspace; fixed_split_size cannot give way. Say what a slot
    // costs, so the caller can size the buffer.
    if (o.fixed_split_size == 0) throw;
    fail(e.what(), ". A slot is ", rows, " rows of (", sh.head_dim, " + 1) floats (",
         static_cast<size_t>(rows) * (sh.head_dim + 1) * sizeof(float),
         " bytes); this workspace has ", ws.bytes_used(), " bytes in use, ", ws.full_bytes(),
         " (workspace_bytes) hold 2 slots per CTA");
  }
  info.slot_capacity = so.max_slots;
  // The op's part of each item: where its queries and pages start and its causal diagonal (the
  // scheduler already set which merge item a split item's partial state belongs to).
  // The lengths are what the variant's hooks see (positions, the custom mask's row stride).
  for (PrefillMergeItem& m : s.merge) {
    m.q_base = b.qo_indptr[m.request];
    m.qo_len = static_cast<int>(qo_lens[m.request]);
    m.kv_len = static_cast<int>(kv_lens[m.request]);
  }
  // In the same pass: whether every item starts on a KV tile (the wgmma kernel's TMA loads).
  bool tiles_aligned = wgmma;
  for (PrefillWorkItem& w : s.work) {
    w.page_base = b.kv_indptr[w.request];
    w.q_base = b.qo_indptr[w.request];
    w.diag = static_cast<int>(kv_lens[w.request] - qo_lens[w.request]);
    w.qo_len = static_cast<int>(qo_lens[w.request]);
    w.kv_len = static_cast<int>(kv_lens[w.request]);
    tiles_aligned = tiles_aligned && w.kv_start % tile == 0;
  }
  return tiles_aligned;
}

void PrefillCore::check_io(const TensorView& q, const TensorView& out, const TensorView& lse,
                           PrefillParams& p) const {
  life.require_planned("run");
  ops::PlannedQueries queries;
  queries.device = Device::cuda(cfg.device);
  queries.q_dtype = shape.q_dtype;
  queries.o_dtype = shape.o_dtype;
  queries.num_qo_heads = shape.num_qo_heads;
  queries.head_dim = shape.head_dim;
  queries.rows = nnz_qo;
  queries.rows_of = "qo_indptr[batch_size] of the plan";
  queries.graph = opts.enable_cuda_graph;
  queries.softmax = variant_jit.use_softmax;
  ops::check_planned_queries(q, out, lse, queries);
  ops::set_query_params(p, q, out, lse);
  p.variant = variant_args;
}

void PrefillCore::set_tma(PrefillParams& p, const TensorView& q, const ops::PrefillKVTensors& kv) {
  p.kv_tma = 0;
  if (!kernel.key()->wgmma || grid == 0)
    return;  // (no launch: a plan without query tokens needs no map)
  TmaMaps& m = tma_maps;
  // The query tile is always a TMA box; check_io has checked what TMA needs of q.
  const ops::PrefillQTensor qt{q.data(),  shape.q_dtype, shape.head_dim, shape.num_qo_heads,
                               q.size(0), q.stride(0),   q.stride(1)};
  const int group = shape.num_qo_heads / shape.num_kv_heads;
  if (!m.q_valid || !(m.q == qt) || m.q_tokens != q_tile_tokens || m.q_group != group) {
    m.q_valid = ops::encode_prefill_q_tma(qt, group, q_tile_tokens, m.params);
    m.q = qt;
    m.q_tokens = q_tile_tokens;
    m.q_group = group;
  }
  check(m.q_valid, name, "::run: the CUDA driver refused a TMA descriptor for q (", q.size(0),
        " rows, strides ", q.stride(0), ", ", q.stride(1), ")");
  p.q_tma_tokens = q_tile_tokens;
  p.q_tma = m.params.q_tma;
  // KV by TMA where the plan and the tensors allow it, else the producer's cp.async (always for
  // fp8 KV, which the producer widens into the 16-bit stages).
  if (!kv_tma_plan || kernel.key()->has_fp8_kv() || !ops::prefill_kv_tma_fits(kv)) return;
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
  const bool capturing = life.begin_run(opts.enable_cuda_graph, "PrefillPlanOptions", stream);
  p.page_size = page_size;
  p.page_shift = -1;
  for (int sh = 0; sh < 31 && page_size > 0; ++sh)
    if (page_size == (1 << sh)) p.page_shift = sh;
  p.group = shape.num_qo_heads / shape.num_kv_heads;
  p.causal = opts.causal ? 1 : 0;
  p.sm_scale_log2 = static_cast<float>(sm_scale * kLog2e);
  p.plan = ws.plan_ptrs();
  info.kv_tma = p.kv_tma != 0;
  void* args[] = {&p};
  const ops::LoadedKernel& k = kernel.kernel();
  const bool wgmma = kernel.key()->wgmma;
  if (grid > 0) {
    // The Hopper kernel's KV path is compiled in: the gather instantiation where KV is not by TMA.
    CUfunction fn = wgmma && p.kv_tma == 0 ? k.functions.back() : k.functions[0];
    runtime::LaunchConfig lc{grid, 1, 1, k.geometry.threads, 1, 1, k.geometry.smem};
    lc.pdl = opts.enable_pdl && runtime::device_supports_pdl(cfg.device);
    runtime::launch(fn, lc, stream, args, k.id);
  }
  if (capturing) {
    captured.record(q, out, lse, kv_capacity, k.id, sm_scale, p.variant);
    captured.causal = opts.causal;
    captured.num_qo_heads = shape.num_qo_heads;
    captured.num_kv_heads = shape.num_kv_heads;
    captured.page_size = page_size;
    captured.kv_tma = p.kv_tma != 0;
  }
  life.end_run(capturing, stream);
}

}  // namespace detail
}  // namespace flashkv
