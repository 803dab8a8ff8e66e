// Host side of batch decode: validation, plan (scheduler -> pinned buffer -> workspace), run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "attention/decode_params.cuh"
#include "attention/decode_shape.cuh"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "ops/decode_shape_choice.h"
#include "ops/decode_step.h"
#include "ops/decode_workspace.h"
#include "ops/jit_util.h"
#include "ops/kernel_specs.h"
#include "ops/variant_jit.h"
#include "runtime/device_errors.h"
#include "runtime/driver.h"
#include "runtime/launch.h"
#include "runtime/plan_upload.h"
#include "scheduler/decode_scheduler.h"

namespace flashkv {
namespace {

std::string decode_config_type(DType q, DType kv, int head_dim, int group, int page_size, bool tc,
                               ops::DecodeTCTuning tuning) {
  const std::string qt = ops::device_type_name(q, "q");
  const std::string kvt = ops::device_type_name(kv, "kv");
  const std::string dims =
      std::to_string(head_dim) + ", " + std::to_string(group) + ", " + std::to_string(page_size);
  const std::string shape = tuning == ops::DecodeTCTuning{}
                                ? ""
                                : ", " + std::to_string(tuning.stages) + ", " + std::to_string(tuning.warps) +
                                      ", " + std::to_string(tuning.ctas);
  return tc ? "flashkv::DecodeTCConfig<" + qt + ", " + kvt + ", " + dims + shape + ">"
            : "flashkv::DecodeConfig<" + qt + ", " + kvt + ", " + qt + ", " + dims + ">";
}

// Launch geometry of a config: the tensor-core kernel's from decode_shape.cuh (the function its
// config reads); the CUDA-core kernel's mirrors kThreads / kSmemBytes in decode.cuh.
struct DecodeGeometry {
  unsigned threads, smem;
};
DecodeGeometry decode_geometry(DType kv, int head_dim, int group, bool tc, ops::DecodeTCTuning tuning) {
  const int elem = static_cast<int>(dtype_size(kv));
  if (tc) {
    const DecodeTCShape s = decode_tc_shape(head_dim, group, tuning.stages, tuning.warps, tuning.ctas);
    return {static_cast<unsigned>(s.threads), static_cast<unsigned>(s.smem_bytes)};
  }
  const int tile = 4096 / head_dim * (2 / elem);
  return {128u, static_cast<unsigned>(2 * 4 * tile * head_dim * elem)};
}

// A fixed_split_size plan's chunks are the contract (batch invariance): they cannot give way to
// a small workspace as dynamic splitting does. Refuse one that does not fit, naming the bytes a
// workspace needs for exactly these keys cut at fixed_split_size (the scheduler would only name
// slots; the config's own min_fixed_split_size, 1 in the Python wrapper, may name an invalid one).
void check_fixed_split_fits(std::span<const int64_t> lens, int fixed_split_size, int num_kv_heads,
                            int group, int max_slots, const BatchDecodeConfig& cfg,
                            size_t bytes_in_use) {
  int64_t slots = 0, total = 0;
  for (const int64_t l : lens) {
    if (l > fixed_split_size) slots += (l + fixed_split_size - 1) / fixed_split_size;
    total += l;
  }
  slots *= num_kv_heads;
  if (slots <= max_slots) return;
  BatchDecodeConfig need = cfg;
  need.max_kv_tokens = std::max<int64_t>(total, 1);
  need.min_fixed_split_size = fixed_split_size;
  fail("fixed_split_size = ", fixed_split_size, ": this plan needs ", slots, " partial states (",
       slots * group, " rows) but the workspace holds ", max_slots, " at a GQA group of ", group,
       "; a workspace of ", BatchDecode::workspace_bytes(need),
       " bytes fits it (BatchDecodeConfig.max_kv_tokens = ", need.max_kv_tokens,
       ", min_fixed_split_size = ", need.min_fixed_split_size, "); this one has ", bytes_in_use,
       " bytes in use");
}

}  // namespace

namespace ops {
bool decode_tc_supported(int head_dim, int group) {
  // kRowTiles * kDTiles * 4 <= 64 output accumulators per thread (decode_tc.cuh).
  return (group + 15) / 16 * (head_dim / 8) * 4 <= 64;
}

std::string decode_kernel_name(DType q_dtype, DType kv_dtype, int head_dim, int group,
                               int page_size, bool tc, const VariantJit& variant, DecodeTCTuning tuning) {
  if (!tc) tuning = {};
  return (tc ? "flashkv::batch_decode_tc_kernel<" : "flashkv::batch_decode_kernel<") +
         decode_config_type(q_dtype, kv_dtype, head_dim, group, page_size, tc, tuning) + ", " +
         variant.type + ">";
}

KernelSpec decode_kernel_spec(DType q_dtype, DType kv_dtype, int head_dim, int group, int page_size,
                              bool tc, const VariantJit& variant, DecodeTCTuning tuning,
                              bool check_pages) {
  if (!tc) tuning = {};
  const std::string tuned = tuning == DecodeTCTuning{} ? ""
                                                       : ",s" + std::to_string(tuning.stages) + ",w" +
                                                             std::to_string(tuning.warps) + ",c" +
                                                             std::to_string(tuning.ctas);
  const std::string id = std::string(tc ? "decode_tc<" : "decode<") + dtype_name(q_dtype) + "," +
                         dtype_name(kv_dtype) + ",d" + std::to_string(head_dim) + ",g" +
                         std::to_string(group) + ",p" + std::to_string(page_size) + tuned +
                         (variant.id.empty() ? "" : "," + variant.id) + (check_pages ? ",checked" : "") +
                         ">";
  const std::string header = tc ? "attention/decode_tc.cuh" : "attention/decode.cuh";
  const std::string kernel =
      decode_kernel_name(q_dtype, kv_dtype, head_dim, group, page_size, tc, variant, tuning);
  const std::string extra = variant.source;
  return {id, [id, header, kernel, extra, check_pages] {
            runtime::CompileRequest r = make_request(id, header, {kernel}, extra);
            // The one switch the decode headers read before anything else (decode_common.cuh).
            if (check_pages) r.source = "#define FLASHKV_DECODE_CHECK_PAGES 1\n" + r.source;
            return r;
          }};
}
}  // namespace ops

namespace {
// What selects the decode kernel of a plan.
struct KernelKey {
  DType q{}, kv{};
  int head_dim = 0, group = 0, page_size = 0;
  bool tensor_cores = false;
  ops::DecodeTCTuning tuning;  // tensor-core kernel only
  std::string variant;  // VariantJit::id
  bool check_pages = false;
  bool operator==(const KernelKey&) const = default;
};
}  // namespace

struct BatchDecode::Impl {
  BatchDecodeConfig cfg;
  ops::DecodeWorkspace ws;
  runtime::PlanUpload upload;  // the plan's pinned buffers and copies into the workspace
  int max_smem = 0;             // the device's opt-in shared memory per block
  int64_t nnz_pages = 0;        // kv_indptr[batch] of the plan in force
  PageIdMax page_ids;           // its largest host page id (DecodePlanOptions::kv_indices_host)
  DeviceErrorRecord* error_record = nullptr;  // the device's (runtime/device_errors.h)
  // What a CUDA graph captured by run() holds fixed: later plans must fit it.
  struct Captured {
    bool any = false;
    int64_t q_rows = 0, out_rows = 0, lse_rows = -1, indices = 0;
    std::string kernel_id;
    float sm_scale = 0.f;
    int64_t step_rows = -1;  // a captured run_step: rows of new_k / new_v / pos_ids (-1: none)
    VariantArgsBlock variant_args{};  // the variant's arguments, by value in the graph
    int ctas_per_unit = 0;  // DecodePlanPtrs::ctas_per_unit, by value in the graph
  } captured;
  // The plan in force.
  bool planned = false;
  int batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, page_size = 0;
  DType q_dtype{}, kv_dtype{}, o_dtype{};
  DecodePlanOptions opts;
  float sm_scale = 0.f;
  unsigned grid = 0;
  int ctas_per_unit = 1;  // the schedule's: CTAs share a unit's stored items (decode_plan.cuh)
  DecodeGeometry geometry{};
  CUfunction decode_fn = nullptr;
  std::string kernel_id;
  KernelKey kernel_key;
  PlanInfo info;
  std::vector<int64_t> kv_lens;
  std::vector<int64_t> window_lens;  // with a sliding window: the keys each request's row sees
  int64_t min_kv_len = 0, max_kv_len = 0;
  ops::RopeSpecMemo rope_memo;  // the fused step's frequency table
  ops::VariantJit variant_jit;  // the plan's variant
  VariantArgsBlock variant_args{};  // its arguments, packed at plan()
  scheduler::DecodeSchedule schedule;  // reused across plans (no reallocation per step)

  // run() and run_step(): validate against the plan, launch (step.new_k == nullptr: plain decode).
  void launch(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
              const TensorView& lse, const DecodeStepParams& step,
              const VariantArgsBlock& variant_args, Stream stream);
};

size_t BatchDecode::workspace_bytes(const BatchDecodeConfig& cfg) {
  return ops::DecodeWorkspace::required_bytes(cfg);
}

size_t BatchDecode::min_workspace_bytes(const BatchDecodeConfig& cfg) {
  return ops::DecodeWorkspace::min_bytes(cfg);
}

BatchDecode::BatchDecode(const BatchDecodeConfig& cfg, void* workspace, size_t bytes)
    : impl_(std::make_unique<Impl>()) {
  check(cfg.max_batch > 0, "BatchDecodeConfig.max_batch: expected > 0, got ", cfg.max_batch);
  check(cfg.num_qo_heads > 0, "BatchDecodeConfig.num_qo_heads: expected > 0, got ",
        cfg.num_qo_heads);
  check(is_supported_head_dim(cfg.head_dim),
        "BatchDecodeConfig.head_dim: expected 64, 128 or 256, got ", cfg.head_dim);
  impl_->cfg = cfg;
  impl_->ws = ops::DecodeWorkspace(cfg, workspace, bytes);
  impl_->upload = runtime::PlanUpload(impl_->ws.plan_layout().bytes, cfg.device);
  impl_->max_smem = device_info(cfg.device).max_smem_per_block;
  // The error record run() and run_step report bad page ids into: allocated now, so a first run
  // inside a CUDA graph capture does not have to allocate.
  impl_->error_record = runtime::device_error_record(cfg.device);
}

BatchDecode::~BatchDecode() = default;

BatchDecode::PlanInfo BatchDecode::plan_info() const { return impl_->info; }

void BatchDecode::forget_captured_graphs() { impl_->captured = {}; }

void BatchDecode::plan(const int32_t* kv_indptr, const int32_t* kv_last_page_len, int batch_size,
                       int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
                       DType q_dtype, DType kv_dtype, DType o_dtype, const DecodePlanOptions& opts,
                       Stream stream) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  const BatchDecodeConfig& cfg = m.cfg;
  runtime::ensure_context(cfg.device);
  check(!runtime::stream_is_capturing(stream),
        "BatchDecode::plan: the stream is being captured into a CUDA graph; plan() runs on the "
        "CPU and copies the schedule from pinned memory, so call it before each replay, outside "
        "the capture, and capture only run()");
  m.planned = false;  // a plan() that throws leaves the object unplanned, never half-planned
  check(batch_size >= 0 && batch_size <= cfg.max_batch,
        "batch_size: expected 0 <= batch_size <= ", cfg.max_batch,
        " (BatchDecodeConfig.max_batch), got ", batch_size);
  // The checks the host path of the Python wrappers runs too (plan_checks.h).
  check_decode_plan(kv_indptr, kv_last_page_len, batch_size, num_qo_heads, num_kv_heads, head_dim,
                    page_size, q_dtype, kv_dtype, o_dtype);
  check(num_qo_heads <= cfg.num_qo_heads, "num_qo_heads: expected at most ", cfg.num_qo_heads,
        " (BatchDecodeConfig.num_qo_heads), got ", num_qo_heads);
  check(head_dim <= cfg.head_dim, "head_dim: expected at most ", cfg.head_dim,
        " (BatchDecodeConfig.head_dim), got ", head_dim);
  const int group = num_qo_heads / num_kv_heads;
  check(opts.fixed_split_size >= 0, "fixed_split_size: expected >= 0, got ", opts.fixed_split_size);
  check(decode_tc_shape_valid(opts.tc_stages, 0), "DecodePlanOptions.tc_stages: expected 0 (default) or 2-8, got ",
        opts.tc_stages);
  check(decode_tc_shape_valid(0, opts.tc_warps),
        "DecodePlanOptions.tc_warps: expected 0 (default), 2, 4 or 8, got ", opts.tc_warps);
  check(opts.sm_scale >= 0.0f && std::isfinite(opts.sm_scale),
        "sm_scale: expected a finite value >= 0 (0 means 1/sqrt(head_dim)), got ", opts.sm_scale);

  m.kv_lens.resize(batch_size);
  for (int i = 0; i < batch_size; ++i)
    m.kv_lens[i] = paged_kv_len(kv_indptr, kv_last_page_len, page_size, i);

  // A host copy of the page ids: checked here (>= 0, and < num_pages when given); run() compares
  // the largest with the cache's page count before it launches (plan_checks.h).
  check(opts.num_pages >= 0,
        "DecodePlanOptions.num_pages: expected >= 0 (0: the cache's, at run()), got ",
        opts.num_pages);
  const PageIdMax page_ids =
      opts.kv_indices_host != nullptr
          ? check_page_ids(opts.kv_indices_host, batch_size > 0 ? kv_indptr[batch_size] : 0,
                           opts.num_pages)
          : PageIdMax{};

  // The kernel's shape: CTAs per SM and warps per CTA (ops/decode_shape_choice.cpp says why).
  ops::DecodeShapeInputs shape_in;
  shape_in.config_ctas_per_sm = m.cfg.ctas_per_sm;
  shape_in.sms = m.ws.sms();
  shape_in.head_dim = head_dim;
  shape_in.group = group;
  shape_in.num_kv_heads = num_kv_heads;
  shape_in.max_smem_bytes = m.max_smem;
  shape_in.kv_lens = m.kv_lens;
  shape_in.enable_cuda_graph = opts.enable_cuda_graph;
  shape_in.fixed_split_size = opts.fixed_split_size;
  shape_in.tc_stages = opts.tc_stages;
  shape_in.tc_warps = opts.tc_warps;
  const ops::DecodeShapeChoice shape = ops::choose_decode_shape(shape_in);
  int ctas_per_sm = shape.ctas_per_sm;
  ops::DecodeTCTuning tuning = shape.tuning;
  const bool tc_ok = ops::decode_tc_supported(head_dim, group);
  check(opts.backend != DecodeBackend::kTensorCores || tc_ok,
        "DecodePlanOptions.backend: the tensor-core ", "decode kernel does not support head_dim ",
        head_dim, " with a GQA group of ", group);
  // The tensor-core kernel needs ~68 KB of shared memory at head_dim 128: more than some GPUs
  // allow per block; auto falls back to CUDA cores there.
  const unsigned tc_smem = decode_geometry(kv_dtype, head_dim, group, true, tuning).smem;
  const bool tc_fits = tc_smem <= static_cast<unsigned>(m.max_smem);
  check(opts.backend != DecodeBackend::kTensorCores || tc_fits, "DecodePlanOptions.backend: the ",
        "tensor-core decode kernel needs more shared memory than this GPU allows per block");
  check((opts.tc_stages == 0 && opts.tc_warps == 0) || tc_fits, "DecodePlanOptions.tc_stages / tc_warps: ",
        tc_smem, " bytes of shared memory per block; this GPU allows ", m.max_smem);
  const bool tc = opts.backend == DecodeBackend::kTensorCores ||
                  (opts.backend == DecodeBackend::kAuto && tc_ok && tc_fits);
  if (!tc) {
    tuning = {};
    if (m.cfg.ctas_per_sm == 0) ctas_per_sm = 2;  // the CUDA-core kernel's default grid
  }

  scheduler::DecodeScheduleOptions so;
  so.num_ctas = m.ws.sms() * ctas_per_sm;
  so.num_kv_heads = num_kv_heads;
  so.fixed_split_size = opts.fixed_split_size;
  so.disable_split_kv = opts.disable_split_kv;
  check(opts.work_item_cost_tokens >= 0.0 && opts.min_chunk_tokens >= 0,
        "DecodePlanOptions: work_item_cost_tokens and min_chunk_tokens must be >= 0 (0: default)");
  if (opts.work_item_cost_tokens > 0.0) so.cost.alpha = opts.work_item_cost_tokens;
  if (opts.min_chunk_tokens > 0) so.min_chunk_tokens = opts.min_chunk_tokens;
  so.balance_chunk_bound = opts.balance_chunk_bound;
  so.balance_tail = opts.balance_tail;
  so.max_slots = m.ws.slot_capacity(group, head_dim);
  so.max_work_items = m.ws.max_work_items();
  // A sliding window (built-in window_left) hides every key before kv_len - 1 - window_left from
  // the one query row: schedule only the keys it can see, so a long context costs its window.
  const int window_left =
      opts.variant.is_builtin() ? opts.variant.builtin_description().window_left : -1;
  if (window_left >= 0) {
    m.window_lens.resize(batch_size);
    for (int i = 0; i < batch_size; ++i)
      m.window_lens[i] = std::min<int64_t>(m.kv_lens[i], int64_t{window_left} + 1);
    so.full_kv_lens = m.kv_lens;
  }
  const std::span<const int64_t> scheduled_lens = window_left >= 0
                                                      ? std::span<const int64_t>(m.window_lens)
                                                      : std::span<const int64_t>(m.kv_lens);
  if (opts.fixed_split_size > 0) {
    check_fixed_split_fits(scheduled_lens, opts.fixed_split_size, num_kv_heads, group, so.max_slots,
                           cfg, m.ws.bytes_used());
  }
  scheduler::DecodeSchedule& s = m.schedule;
  // The op's part of each work item (where its pages start, the request's length), written by
  // the scheduler in the pass that places the items.
  so.page_base = std::span<const int32_t>(kv_indptr, static_cast<size_t>(batch_size));
  // The pinned image the plan is copied from (once the copy that last read it is done): the
  // scheduler writes the work items straight into it. A plan that fails from here on leaves it
  // unused.
  std::byte* const image = m.upload.begin(stream);
  so.work_out = reinterpret_cast<DecodeWorkItem*>(image + m.ws.plan_layout().work);
  const auto t_schedule = std::chrono::steady_clock::now();
  scheduler::plan_decode(scheduled_lens, so, &s);
  m.info.schedule_us = std::chrono::duration<double, std::micro>(
                           std::chrono::steady_clock::now() - t_schedule).count();
  m.min_kv_len = batch_size > 0 ? *std::min_element(m.kv_lens.begin(), m.kv_lens.end()) : 0;
  m.max_kv_len = batch_size > 0 ? *std::max_element(m.kv_lens.begin(), m.kv_lens.end()) : 0;

  // JIT: compile (first use only) at plan time so run() never compiles.
  // Same kernel as the last plan (the common case, every generation step): skip building its
  // id and the cache lookup.
  // The variant (plain attention unless opts.variant says otherwise): a built-in's flags or a
  // user's source enter the kernel's id.
  // A built-in window needs no mask in decode: the schedule holds only the window's keys (above),
  // and no key of a request lies right of its one row. So the kernel is compiled without it.
  Variant kernel_variant = opts.variant;
  if (window_left >= 0 || (opts.variant.is_builtin() &&
                           opts.variant.builtin_description().window_right >= 0)) {
    AttentionVariant v = opts.variant.builtin_description();
    v.window_left = v.window_right = -1;
    kernel_variant = Variant::builtin(v);
  }
  ops::VariantJit vj = ops::variant_jit(kernel_variant);
  // The variant's arguments, checked and packed now (a bad one fails plan(), not every run()).
  const VariantArgsBlock variant_args = ops::pack_variant_args(
      kernel_variant, {"BatchDecode::plan", Device::cuda(cfg.device), batch_size, batch_size,
                       num_qo_heads, head_dim, batch_size == 1 ? m.kv_lens[0] : -1});
  const ops::DecodeTCTuning kernel_tuning = tc ? tuning : ops::DecodeTCTuning{};
  // Page ids checked in the kernel where asked, or in the device-error debug mode.
  const bool check_pages = opts.check_page_ids || runtime::device_error_debug_mode();
  const KernelKey key{q_dtype, kv_dtype, head_dim, group, page_size, tc, kernel_tuning, vj.id,
                      check_pages};
  if (!(m.decode_fn != nullptr && m.kernel_key == key)) {
    const ops::KernelSpec spec = ops::decode_kernel_spec(q_dtype, kv_dtype, head_dim, group,
                                                         page_size, tc, vj, kernel_tuning,
                                                         check_pages);
    const runtime::LoadedModule& mod =
        runtime::KernelCache::instance().module(spec.id, cfg.device, spec.make);
    m.decode_fn = mod.function(
        ops::decode_kernel_name(q_dtype, kv_dtype, head_dim, group, page_size, tc, vj, kernel_tuning));
    m.geometry = decode_geometry(kv_dtype, head_dim, group, tc, kernel_tuning);
    m.kernel_id = spec.id;
    m.kernel_key = key;
  }
  m.info.tensor_cores = tc;
  m.info.ctas_per_sm = ctas_per_sm;
  m.info.warps = static_cast<int>(m.geometry.threads / 32);
  m.info.kernel_id = m.kernel_id;

  // A captured graph keeps its q/out/lse/indices pointers, kernel and sm_scale: refuse a plan it
  // cannot run (before anything in the workspace changes).
  const int64_t nnz = batch_size > 0 ? kv_indptr[batch_size] : 0;
  // A built-in description's sm_scale applies when the options set none.
  const float sm_scale =
      resolve_sm_scale(opts.sm_scale > 0.f ? opts.sm_scale : vj.sm_scale, head_dim);
  if (m.captured.any) {
    const auto& c = m.captured;
    check(batch_size <= c.q_rows && batch_size <= c.out_rows &&
              (c.lse_rows < 0 || batch_size <= c.lse_rows),
          "batch_size: ", batch_size, " exceeds the ", std::min(c.q_rows, c.out_rows),
          " rows of q/out a captured CUDA graph holds; capture run() with max_batch-row views");
    check(c.step_rows < 0 || batch_size <= c.step_rows, "batch_size: ", batch_size,
          " exceeds the ", c.step_rows, " rows of new_k / new_v / pos_ids a captured run_step ",
          "graph holds; capture run_step with max_batch-row views");
    check(nnz <= c.indices, "kv_indptr[batch_size] = ", nnz, " exceeds the ", c.indices,
          " kv_indices entries a captured CUDA graph holds; capture with the full indices buffer");
    check(m.kernel_id == c.kernel_id && sm_scale == c.sm_scale,
          "plan: a captured CUDA graph runs kernel ", c.kernel_id, " with sm_scale ", c.sm_scale,
          "; this plan needs ", m.kernel_id, " with sm_scale ", sm_scale,
          ". Capture a new graph for a new configuration.");
    check(ops::same_variant_args(variant_args, c.variant_args),
          "plan: a captured CUDA graph holds the variant arguments of its capture (values and "
          "tensor pointers); this plan's differ. Capture a new graph for new variant arguments.");
    // Block mode (num_kv_heads dividing the CTA count) runs each unit's items on ctas_per_unit
    // CTAs, a kernel parameter the graph holds.
    check(s.ctas_per_unit == c.ctas_per_unit, "plan: a captured CUDA graph runs its work items ",
          "in units of ", c.ctas_per_unit, " CTA(s); this plan (num_kv_heads = ", num_kv_heads,
          ", ", s.num_ctas, " CTAs) needs units of ", s.ctas_per_unit,
          ". Capture a new graph for a new configuration.");
  }

  // Into the workspace, in stream order after the last run() (on whatever stream) read it.
  const size_t plan_bytes = scheduler::serialize_decode_schedule(s, m.ws.plan_layout(), image);
  m.upload.copy(m.ws.plan_device_ptr(), 0, plan_bytes, stream);
  m.upload.end(stream);

  // Without CUDA graphs the grid ends with the last unit that has work (all its CTAs).
  int used_units = 0;
  for (int u = 0; u < s.num_units; ++u)
    used_units = s.unit_work_indptr[u + 1] > s.unit_work_indptr[u] ? u + 1 : used_units;
  const int used_ctas = used_units * s.ctas_per_unit;
  // With CUDA graphs the grids must be the same at every replay: launch the full fixed grid.
  m.grid =
      opts.enable_cuda_graph ? static_cast<unsigned>(s.num_ctas) : static_cast<unsigned>(used_ctas);
  m.batch = batch_size;
  m.num_qo_heads = num_qo_heads;
  m.num_kv_heads = num_kv_heads;
  m.head_dim = head_dim;
  m.page_size = page_size;
  m.q_dtype = q_dtype;
  m.kv_dtype = kv_dtype;
  m.o_dtype = o_dtype;
  m.opts = opts;
  m.variant_jit = std::move(vj);
  m.variant_args = variant_args;
  m.sm_scale = sm_scale;
  m.nnz_pages = nnz;
  m.page_ids = page_ids;
  m.opts.kv_indices_host = nullptr;  // not kept: the caller's array may not outlive the call
  m.ctas_per_unit = s.ctas_per_unit;
  m.info.num_ctas = s.num_ctas;
  m.info.num_work_items = static_cast<int>(s.num_cta_work_items());  // what the CTAs run
  m.info.num_split_tiles = static_cast<int>(s.merge.size());
  m.info.num_partial_states = s.num_slots;
  m.info.slot_capacity = so.max_slots;
  m.info.split_limited = s.slot_limited;
  m.info.chunk_bound = s.chunk_bound;
  m.planned = true;
  m.info.plan_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void BatchDecode::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                      const TensorView& lse, Stream stream) {
  check(impl_->planned, "BatchDecode::run: called before a successful plan()");
  impl_->launch(q, kv, out, lse, DecodeStepParams{}, impl_->variant_args, stream);
}

void BatchDecode::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                      const TensorView& lse, const VariantArgs& variant_args, Stream stream) {
  check(impl_->planned, "BatchDecode::run: called before a successful plan()");
  check(impl_->opts.variant.is_user(),
        "BatchDecode::run: variant_args given, but the plan's variant is not a user variant");
  Impl& m = *impl_;
  const VariantArgsBlock args = ops::pack_variant_args(
      m.opts.variant.with_args(variant_args),  // a user variant: compiled as given
      {"BatchDecode::run", Device::cuda(m.cfg.device), m.batch, m.batch, m.num_qo_heads,
       m.head_dim, m.batch == 1 ? m.kv_lens[0] : -1});
  m.launch(q, kv, out, lse, DecodeStepParams{}, args, stream);
}

void BatchDecode::run_step(const TensorView& q, const TensorView& new_k, const TensorView& new_v,
                           const PagedKVCache& kv, const TensorView& out, const TensorView& lse,
                           const DecodeStepOptions& step, Stream stream) {
  Impl& m = *impl_;
  check(m.planned, "BatchDecode::run_step: called before a successful plan()");
  ops::DecodeStepShape shape;
  shape.batch = m.batch;
  shape.num_qo_heads = m.num_qo_heads;
  shape.num_kv_heads = m.num_kv_heads;
  shape.head_dim = m.head_dim;
  shape.device = m.cfg.device;
  shape.kv_dtype = m.kv_dtype;
  shape.min_kv_len = m.min_kv_len;
  shape.max_kv_len = m.max_kv_len;
  shape.graph = m.opts.enable_cuda_graph;
  runtime::ensure_context(m.cfg.device);
  check(!m.variant_jit.transforms_qk,
        "BatchDecode::run_step: the plan's variant rotates q and k itself (variant.rope); the "
        "fused step rotates them too. Use DecodeStepOptions.rope, or run() with the variant.");
  const DecodeStepParams sp = ops::make_decode_step_params(new_k, new_v, step, shape, m.rope_memo);
  m.launch(q, kv, out, lse, sp, m.variant_args, stream);
  if (runtime::stream_is_capturing(stream)) {  // launch() recorded the rest of the capture
    int64_t rows = std::min(new_k.size(0), new_v.size(0));
    if (step.pos_ids.defined()) rows = std::min(rows, step.pos_ids.size(0));
    m.captured.step_rows = rows;
  }
}

void BatchDecode::Impl::launch(const TensorView& q, const PagedKVCache& kv,
                               const TensorView& out, const TensorView& lse,
                               const DecodeStepParams& step,
                               const VariantArgsBlock& variant_args, Stream stream) {
  Impl& m = *this;
  const Device dev = Device::cuda(m.cfg.device);
  // Under CUDA graphs, q/out/lse may hold more rows than this plan's batch (capture them at
  // max_batch so later, larger plans still fit); eagerly they must match the plan exactly.
  const bool graph = m.opts.enable_cuda_graph;
  const auto check_rows = [&](const TensorView& t, const char* name) {
    if (graph ? t.size(0) < m.batch : t.size(0) != m.batch) {
      fail(name, ": expected ", graph ? "at least " : "", m.batch, " rows (the plan's batch), got ",
           t.size(0));
    }
  };
  check_device(q, "q", dev);
  check_dtype(q, "q", m.q_dtype);
  check_ndim(q, "q", 3);
  check_rows(q, "q");
  check_shape(q, "q", {-1, m.num_qo_heads, m.head_dim});
  check_last_dim_contiguous(q, "q");
  check_aligned(q, "q", 16);
  check_device(out, "out", dev);
  check_dtype(out, "out", m.o_dtype);
  check_ndim(out, "out", 3);
  check_rows(out, "out");
  check_shape(out, "out", {-1, m.num_qo_heads, m.head_dim});
  check_last_dim_contiguous(out, "out");
  check_aligned(out, "out", 16);
  check(m.variant_jit.use_softmax || !lse.defined(),
        "lse: the plan's variant has no softmax (sigmoid attention); pass an undefined lse");
  if (lse.defined()) {
    check_device(lse, "lse", dev);
    check_dtype(lse, "lse", DType::f32);
    check_ndim(lse, "lse", 2);
    check_rows(lse, "lse");
    check_shape(lse, "lse", {-1, m.num_qo_heads});
    check(lse.stride(1) == 1 && (lse.size(0) <= 1 || lse.stride(0) >= m.num_qo_heads),
          "lse: expected contiguous heads and non-overlapping rows");
    check_aligned(lse, "lse", 4);
  }
  kv.validate_shapes();
  check_device(kv.k, "paged_kv.k", dev);
  check_device(kv.indices, "paged_kv.indices", dev);
  // The plan's host page ids (if it had them) against this cache: no GPU work.
  check_page_ids_fit(m.page_ids, kv.num_pages());
  // The kernel reads kv_indices[0 .. kv_indptr[batch]) with unit stride.
  if (kv.indices.size(0) < m.nnz_pages) {
    fail("paged_kv.indices: expected at least ", m.nnz_pages,
         " entries (kv_indptr[batch] of the plan), got ", kv.indices.size(0));
  }
  check(kv.indices.size(0) <= 1 || kv.indices.stride(0) == 1,
        "paged_kv.indices: expected a contiguous array");
  check_aligned(kv.indices, "paged_kv.indices", 4);
  check_dtype(kv.k, "paged_kv.k", m.kv_dtype);
  check(kv.page_size() == m.page_size, "paged_kv.page_size: expected ", m.page_size,
        " (the plan's), got ", kv.page_size());
  check(kv.num_kv_heads() == m.num_kv_heads, "paged_kv.num_kv_heads: expected ", m.num_kv_heads,
        " (the plan's), got ", kv.num_kv_heads());
  check(kv.head_dim() == m.head_dim, "paged_kv.head_dim: expected ", m.head_dim,
        " (the plan's), got ", kv.head_dim());
  if (graph ? kv.batch_size() < m.batch : kv.batch_size() != m.batch) {
    fail("paged_kv batch: expected ", graph ? "at least " : "", m.batch,
         " requests (the plan's), got ", kv.batch_size());
  }
  check_aligned(kv.k, "paged_kv.k", 16);
  check_aligned(kv.v, "paged_kv.v", 16);
  for (int64_t s : {kv.page_stride(), kv.token_stride(), kv.head_stride()}) {
    check(s * static_cast<int64_t>(dtype_size(m.kv_dtype)) % 16 == 0,
          "paged_kv: strides must be multiples of 16 bytes for vector loads");
    check(s >= 0, "paged_kv: expected non-negative strides, got ", s);
  }
  // The kernels address an element as page * page_stride + (its offset in the page), each part
  // in 32 bits (kernels/attention/decode_common.cuh: the address arithmetic is most of what a
  // decode CTA issues).
  const int64_t elem = static_cast<int64_t>(dtype_size(m.kv_dtype));
  const int64_t in_page = ((m.page_size - 1) * kv.token_stride() +
                           (m.num_kv_heads - 1) * kv.head_stride() + m.head_dim) * elem;
  check(kv.page_stride() * elem <= int64_t{UINT32_MAX} && in_page <= int64_t{UINT32_MAX},
        "paged_kv: the page stride (", kv.page_stride() * elem, " bytes) and the offsets within a ",
        "page (up to ", in_page, " bytes) must be below 2^32 bytes");
  check(q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 && out.stride(0) % 8 == 0 &&
            out.stride(1) % 8 == 0,
        "q/out: row strides must be multiples of 16 bytes");
  check((m.batch <= 1 || out.stride(0) != 0) && (m.num_qo_heads <= 1 || out.stride(1) != 0),
        "out: rows must not overlap (zero stride)");
  runtime::ensure_context(m.cfg.device);
  const bool capturing = runtime::stream_is_capturing(stream);
  check(
      m.opts.enable_cuda_graph || !capturing,
      "BatchDecode::run: the stream is being captured into a CUDA graph, but plan() was called "
      "without enable_cuda_graph; its grid depends on the batch, so a replay after another plan() "
      "would be wrong. Plan with DecodePlanOptions.enable_cuda_graph = true.");

  DecodeParams p{};
  p.q = q.data();
  p.k = kv.k.data();
  p.v = kv.v.data();
  p.kv_indices = kv.indices.data_as<const int>();
  p.out = out.data();
  p.lse = lse.defined() ? lse.data_as<float>() : nullptr;
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.o_stride_n = out.stride(0);
  p.o_stride_h = out.stride(1);
  p.lse_stride_n = lse.defined() ? lse.stride(0) : 0;
  p.page_stride = kv.page_stride();
  p.token_stride = kv.token_stride();
  p.head_stride = kv.head_stride();
  p.num_pages = kv.num_pages();
  p.error = m.error_record;
  p.sm_scale_log2 = static_cast<float>(m.sm_scale * kLog2e);
  p.plan = m.ws.plan_ptrs();
  p.plan.ctas_per_unit = m.ctas_per_unit;
  p.step = step;
  p.variant = variant_args;
  void* args[] = {&p};
  if (m.grid > 0) {
    runtime::launch(m.decode_fn, {m.grid, 1, 1, m.geometry.threads, 1, 1, m.geometry.smem}, stream,
                    args, m.kernel_id);
  }
  if (capturing) {
    m.captured = {
        true,        q.size(0), out.size(0), lse.defined() ? lse.size(0) : -1, kv.indices.size(0),
        m.kernel_id, m.sm_scale};
    m.captured.variant_args = variant_args;
    m.captured.ctas_per_unit = m.ctas_per_unit;
  } else {
    // A later plan() on any stream waits for this run before it rewrites the workspace. (Not
    // recorded while capturing: an event recorded inside a capture cannot be waited on outside.)
    m.upload.record_run(stream);
  }
  runtime::check_device_errors_if_debug(m.cfg.device, stream);
}

}  // namespace flashkv
