// Host side of batch decode: validation, plan (scheduler -> pinned buffer -> workspace), run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "attention/decode/decode_key.h"
#include "attention/decode/decode_params.cuh"
#include "attention/decode/decode_shape.cuh"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "ops/common/kernel_memo.h"
#include "ops/common/kv_scale_params.h"
#include "ops/common/plan_lifecycle.h"
#include "ops/common/run_checks.h"
#include "ops/decode/decode_shape_choice.h"
#include "ops/decode/decode_step.h"
#include "ops/decode/decode_workspace.h"
#include "ops/jit/jit_util.h"
#include "ops/jit/kernel_specs.h"
#include "ops/jit/variant_jit.h"
#include "runtime/device_errors.h"
#include "runtime/driver.h"
#include "runtime/launch.h"
#include "runtime/plan_upload.h"
#include "scheduler/decode_scheduler.h"
#include "tuning/policy.cuh"

namespace flashkv {
namespace {

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

// The tensor-core or CUDA-core kernel and the grid's CTAs per SM
// (ops/decode/decode_shape_choice.cpp).
struct DecodeKernelChoice {
  bool tensor_cores = false;
  int ctas_per_sm = 2;
  DecodeTCTuning tuning;
};

}  // namespace

struct BatchDecode::Impl {
  BatchDecodeConfig cfg;
  ops::DecodeWorkspace ws;
  ops::PlanLifecycle life;  // plan/run guards and the plan's copy into the workspace
  int max_smem = 0;         // the device's opt-in shared memory per block
  DeviceErrorRecord* error_record = nullptr;  // the device's (runtime/device_errors.h)
  // What a CUDA graph captured by run() holds fixed: later plans must fit it.
  struct Captured : ops::CapturedRun {
    int64_t step_rows = -1;  // a captured run_step: rows of new_k / new_v / pos_ids (-1: none)
    int ctas_per_unit = 0;   // DecodePlanPtrs::ctas_per_unit, by value in the graph
  } captured;
  // The plan in force.
  int batch = 0, page_size = 0;
  AttentionShape shape;
  DecodePlanOptions opts;
  float sm_scale = 0.f;
  unsigned grid = 0;
  int ctas_per_unit = 1;  // the schedule's: CTAs share a unit's stored items (decode_plan.cuh)
  int64_t nnz_pages = 0;  // kv_indptr[batch] of the plan in force
  PageIdMax page_ids;     // its largest host page id (DecodePlanOptions::kv_indices_host)
  std::string kv_indices_name = "kv_indices";  // how run() names them (DecodePlanOptions::names)
  ops::KernelMemo<DecodeKernelKey> kernel;
  PlanInfo info;
  std::vector<int64_t> kv_lens;
  std::vector<int64_t> window_lens;  // with a sliding window: the keys each request's row sees
  int64_t min_kv_len = 0, max_kv_len = 0;
  ops::RopeSpecMemo rope_memo;         // the fused step's frequency table
  ops::VariantJit variant_jit;         // the plan's variant
  VariantArgsBlock variant_args{};     // its arguments, packed at plan()
  scheduler::DecodeSchedule schedule;  // reused across plans (no reallocation per step)

  // plan()'s steps, in order.
  void check_arguments(const DecodeBatch& b, const AttentionShape& sh, const DecodePlanOptions& o);
  DecodeKernelChoice choose_kernel(const AttentionShape& sh, const DecodePlanOptions& o,
                                   bool widen_kv) const;
  void schedule_work(const DecodeBatch& b, const AttentionShape& sh, const DecodePlanOptions& o,
                     const DecodeKernelChoice& k, Stream stream);
  void check_captured_graph_fits(const DecodeBatch& b, const AttentionShape& sh, int64_t nnz,
                                 float scale, const VariantArgsBlock& args) const;

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

// The scheduler's fixed split (scheduler/decode_scheduler.h): request i in ceil(kv_len_i / fs)
// chunks, whatever the rest of the batch.
int64_t BatchDecode::fixed_split_chunks(const DecodeBatch& b, int fixed_split_size) {
  if (fixed_split_size <= 0 || b.kv_indptr == nullptr || b.kv_last_page_len == nullptr) return 0;
  int64_t chunks = 0;
  for (int i = 0; i < b.batch_size; ++i) {
    const int64_t len = paged_kv_len(b.kv_indptr, b.kv_last_page_len, b.page_size, i);
    if (len > 0) chunks += (len + fixed_split_size - 1) / fixed_split_size;
  }
  return chunks;
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
  impl_->life = ops::PlanLifecycle("BatchDecode", impl_->ws.plan_layout().bytes, cfg.device);
  impl_->max_smem = device_info(cfg.device).max_smem_per_block;
  // The error record run() and run_step report bad page ids into: allocated now, so a first run
  // inside a CUDA graph capture does not have to allocate.
  impl_->error_record = runtime::device_error_record(cfg.device);
}

BatchDecode::~BatchDecode() = default;

BatchDecode::PlanInfo BatchDecode::plan_info() const { return impl_->info; }

void BatchDecode::forget_captured_graphs() { impl_->captured = {}; }

void BatchDecode::plan(const DecodeBatch& b, const AttentionShape& sh,
                       const DecodePlanOptions& opts, Stream stream) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  runtime::ensure_context(m.cfg.device);
  m.life.begin_plan(stream);  // refused under capture; unplanned until commit()
  m.check_arguments(b, sh, opts);
  // The variant (plain attention unless opts.variant says otherwise): a built-in's flags or a
  // user's source enter the kernel's key; one that rewrites staged keys or values has an fp8
  // cache staged widened, which the kernel's shape depends on.
  const Variant kernel_variant = ops::decode_kernel_variant(opts.variant);
  ops::VariantJit vj = ops::variant_jit(kernel_variant);
  const bool widen_kv = ops::fp8_kv_widened(sh.kv_dtype, vj);
  const DecodeKernelChoice k = m.choose_kernel(sh, opts, widen_kv);
  m.schedule_work(b, sh, opts, k, stream);  // into the pinned image

  // JIT: compile (first use only) at plan time so run() never compiles.
  // The variant's arguments, checked and packed now (a bad one fails plan(), not every run()).
  const VariantArgsBlock variant_args = ops::pack_variant_args(
      kernel_variant, {"BatchDecode::plan", Device::cuda(m.cfg.device), b.batch_size, b.batch_size,
                       sh.num_qo_heads, sh.head_dim, b.batch_size == 1 ? m.kv_lens[0] : -1});
  DecodeKernelKey key;
  key.q = sh.q_dtype;
  key.kv = sh.kv_dtype;
  key.head_dim = sh.head_dim;
  key.group = sh.num_qo_heads / sh.num_kv_heads;
  key.page_size = b.page_size;
  key.tensor_cores = k.tensor_cores;
  key.tuning = k.tensor_cores ? k.tuning : DecodeTCTuning{};
  // Page ids checked in the kernel where asked, or in the device-error debug mode.
  key.check_pages = opts.check_page_ids || runtime::device_error_debug_mode();
  key.variant = vj.kernel();
  key.widen_kv = widen_kv;
  const ops::LoadedKernel& kernel = m.kernel.load(key, m.cfg.device);

  // A captured graph keeps its q/out/lse/indices pointers, kernel and sm_scale: refuse a plan it
  // cannot run (before anything in the workspace changes). A built-in description's sm_scale
  // applies when the options set none.
  const int64_t nnz = b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0;
  const float sm_scale =
      resolve_sm_scale(opts.sm_scale > 0.f ? opts.sm_scale : vj.sm_scale, sh.head_dim);
  m.check_captured_graph_fits(b, sh, nnz, sm_scale, variant_args);

  // Into the workspace, in stream order after the last run() (on whatever stream) read it.
  const scheduler::DecodeSchedule& s = m.schedule;
  const size_t plan_bytes =
      scheduler::serialize_decode_schedule(s, m.ws.plan_layout(), m.life.begin_upload(stream));
  m.life.upload(m.ws.plan_device_ptr(), 0, plan_bytes, stream);
  m.life.end_upload(stream);

  // Without CUDA graphs the grid ends with the last unit that has work (all its CTAs); with them
  // the grids must be the same at every replay: the full fixed grid.
  int used_units = 0;
  for (int u = 0; u < s.num_units; ++u)
    used_units = s.unit_work_indptr[u + 1] > s.unit_work_indptr[u] ? u + 1 : used_units;
  m.grid =
      static_cast<unsigned>(opts.enable_cuda_graph ? s.num_ctas : used_units * s.ctas_per_unit);
  m.batch = b.batch_size;
  m.page_size = b.page_size;
  m.shape = sh;
  m.opts = opts;
  m.opts.kv_indices_host = nullptr;  // not kept: the caller's array may not outlive the call
  m.opts.names = {};                 // nor its strings (the one run() uses is copied)
  m.kv_indices_name = opts.names.kv_indices;
  m.variant_jit = std::move(vj);
  m.variant_args = variant_args;
  m.sm_scale = sm_scale;
  m.nnz_pages = nnz;
  m.ctas_per_unit = s.ctas_per_unit;
  m.info.tensor_cores = k.tensor_cores;
  m.info.ctas_per_sm = k.ctas_per_sm;
  m.info.warps = static_cast<int>(kernel.geometry.threads / 32);
  m.info.kernel_id = kernel.id;
  m.info.num_ctas = s.num_ctas;
  m.info.num_work_items = static_cast<int>(s.num_cta_work_items());  // what the CTAs run
  m.info.num_split_tiles = static_cast<int>(s.merge.size());
  m.info.num_partial_states = s.num_slots;
  m.info.split_limited = s.slot_limited;
  m.info.chunk_bound = s.chunk_bound;
  m.life.commit();
  m.info.plan_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// plan() step 1: the arguments against the config and each other; the requests' KV lengths; the
// host page ids where given.
void BatchDecode::Impl::check_arguments(const DecodeBatch& b, const AttentionShape& sh,
                                        const DecodePlanOptions& o) {
  check(b.batch_size >= 0 && b.batch_size <= cfg.max_batch,
        "batch_size: expected 0 <= batch_size <= ", cfg.max_batch,
        " (BatchDecodeConfig.max_batch), got ", b.batch_size);
  // The checks the host path of the Python wrappers runs too (plan_checks.h).
  check_decode_plan(b.kv_indptr, b.kv_last_page_len, b.batch_size, sh.num_qo_heads, sh.num_kv_heads,
                    sh.head_dim, b.page_size, sh.q_dtype, sh.kv_dtype, sh.o_dtype, PlanTarget::kGpu,
                    o.names, sh.kv_format);
  check(sh.num_qo_heads <= cfg.num_qo_heads, "num_qo_heads: expected at most ", cfg.num_qo_heads,
        " (BatchDecodeConfig.num_qo_heads), got ", sh.num_qo_heads);
  check(sh.head_dim <= cfg.head_dim, "head_dim: expected at most ", cfg.head_dim,
        " (BatchDecodeConfig.head_dim), got ", sh.head_dim);
  check(o.fixed_split_size >= 0, "fixed_split_size: expected >= 0, got ", o.fixed_split_size);
  check(decode_tc_shape_valid(o.tc_stages, 0),
        "DecodePlanOptions.tc_stages: expected 0 (default) or 2-8, got ", o.tc_stages);
  check(decode_tc_shape_valid(0, o.tc_warps),
        "DecodePlanOptions.tc_warps: expected 0 (default), 2, 4 or 8, got ", o.tc_warps);
  check(o.sm_scale >= 0.0f && std::isfinite(o.sm_scale),
        "sm_scale: expected a finite value >= 0 (0 means 1/sqrt(head_dim)), got ", o.sm_scale);
  check(o.work_item_cost_tokens >= 0.0 && o.min_chunk_tokens >= 0,
        "DecodePlanOptions: work_item_cost_tokens and min_chunk_tokens must be >= 0 (0: default)");

  kv_lens.resize(b.batch_size);
  for (int i = 0; i < b.batch_size; ++i)
    kv_lens[i] = paged_kv_len(b.kv_indptr, b.kv_last_page_len, b.page_size, i);
  min_kv_len = b.batch_size > 0 ? *std::min_element(kv_lens.begin(), kv_lens.end()) : 0;
  max_kv_len = b.batch_size > 0 ? *std::max_element(kv_lens.begin(), kv_lens.end()) : 0;

  // A host copy of the page ids: checked here (>= 0, and < num_pages when given); run() compares
  // the largest with the cache's page count before it launches (plan_checks.h).
  check(o.num_pages >= 0,
        "DecodePlanOptions.num_pages: expected >= 0 (0: the cache's, at run()), got ", o.num_pages);
  page_ids =
      o.kv_indices_host != nullptr
          ? check_page_ids(o.kv_indices_host, b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0,
                           o.num_pages, o.names.kv_indices)
          : PageIdMax{};
}

// plan() step 2: the kernel (tensor cores where they take the shape and fit) and its grid shape.
DecodeKernelChoice BatchDecode::Impl::choose_kernel(const AttentionShape& sh,
                                                    const DecodePlanOptions& o,
                                                    bool widen_kv) const {
  const int group = sh.num_qo_heads / sh.num_kv_heads;
  // The kernel's shape: CTAs per SM and warps per CTA (ops/decode/decode_shape_choice.cpp says
  // why).
  ops::DecodeShapeInputs in;
  in.config_ctas_per_sm = cfg.ctas_per_sm;
  in.sms = ws.sms();
  in.head_dim = sh.head_dim;
  in.group = group;
  in.num_kv_heads = sh.num_kv_heads;
  in.max_smem_bytes = max_smem;
  in.kv_lens = kv_lens;
  in.enable_cuda_graph = o.enable_cuda_graph;
  in.fixed_split_size = o.fixed_split_size;
  in.tc_stages = o.tc_stages;
  in.tc_warps = o.tc_warps;
  in.kv_bytes = widen_kv ? 2 : static_cast<int>(dtype_size(sh.kv_dtype));
  const ops::DecodeShapeChoice shape = ops::choose_decode_shape(in);
  const bool tc_ok = decode_tc_supported(sh.head_dim, group);
  check(o.backend != DecodeBackend::kTensorCores || tc_ok,
        "DecodePlanOptions.backend: the tensor-core ", "decode kernel does not support head_dim ",
        sh.head_dim, " with a GQA group of ", group);
  // The tensor-core kernel needs ~68 KB of shared memory at head_dim 128: more than some GPUs
  // allow per block; auto falls back to CUDA cores there.
  DecodeKernelKey tc_key;
  tc_key.kv = sh.kv_dtype;
  tc_key.head_dim = sh.head_dim;
  tc_key.group = group;
  tc_key.tensor_cores = true;
  tc_key.tuning = shape.tuning;
  tc_key.widen_kv = widen_kv;
  const unsigned tc_smem = tc_key.geometry().smem;
  const bool tc_fits = tc_smem <= static_cast<unsigned>(max_smem);
  check(o.backend != DecodeBackend::kTensorCores || tc_fits, "DecodePlanOptions.backend: the ",
        "tensor-core decode kernel needs more shared memory than this GPU allows per block");
  check((o.tc_stages == 0 && o.tc_warps == 0) || tc_fits,
        "DecodePlanOptions.tc_stages / tc_warps: ", tc_smem,
        " bytes of shared memory per block; this GPU allows ", max_smem);
  DecodeKernelChoice k;
  k.tensor_cores = o.backend == DecodeBackend::kTensorCores ||
                   (o.backend == DecodeBackend::kAuto && tc_ok && tc_fits);
  k.ctas_per_sm = shape.ctas_per_sm;
  k.tuning = shape.tuning;
  if (!k.tensor_cores) {
    k.tuning = {};
    // The CUDA-core kernel's default grid.
    if (cfg.ctas_per_sm == 0) k.ctas_per_sm = tuning::Policy::kDecodeCudaCoreCtasPerSm;
  }
  return k;
}

// plan() step 3: the schedule, written into the plan's pinned image (once the copy that last read
// it is done). A plan that fails from here on leaves the image unused.
void BatchDecode::Impl::schedule_work(const DecodeBatch& b, const AttentionShape& sh,
                                      const DecodePlanOptions& o, const DecodeKernelChoice& k,
                                      Stream stream) {
  const int group = sh.num_qo_heads / sh.num_kv_heads;
  scheduler::DecodeScheduleOptions so;
  so.num_ctas = ws.sms() * k.ctas_per_sm;
  so.num_kv_heads = sh.num_kv_heads;
  so.fixed_split_size = o.fixed_split_size;
  so.disable_split_kv = o.disable_split_kv;
  if (o.work_item_cost_tokens > 0.0) so.cost.alpha = o.work_item_cost_tokens;
  if (o.min_chunk_tokens > 0) so.min_chunk_tokens = o.min_chunk_tokens;
  so.balance_chunk_bound = o.balance_chunk_bound;
  so.balance_tail = o.balance_tail;
  so.max_slots = ws.slot_capacity(group, sh.head_dim);
  so.max_work_items = ws.max_work_items();
  // A sliding window (built-in window_left) hides every key before kv_len - 1 - window_left from
  // the one query row: schedule only the keys it can see, so a long context costs its window.
  const int window_left = o.variant.is_builtin() ? o.variant.builtin_description().window_left : -1;
  if (window_left >= 0) {
    window_lens.resize(b.batch_size);
    for (int i = 0; i < b.batch_size; ++i)
      window_lens[i] = std::min<int64_t>(kv_lens[i], int64_t{window_left} + 1);
    so.full_kv_lens = kv_lens;
  }
  const std::span<const int64_t> lens =
      window_left >= 0 ? std::span<const int64_t>(window_lens) : std::span<const int64_t>(kv_lens);
  if (o.fixed_split_size > 0) {
    check_fixed_split_fits(lens, o.fixed_split_size, sh.num_kv_heads, group, so.max_slots, cfg,
                           ws.bytes_used());
  }
  // The op's part of each work item (where its pages start, the request's length), written by
  // the scheduler in the pass that places the items.
  so.page_base = std::span<const int32_t>(b.kv_indptr, static_cast<size_t>(b.batch_size));
  std::byte* const image = life.begin_upload(stream);
  so.work_out = reinterpret_cast<DecodeWorkItem*>(image + ws.plan_layout().work);
  const auto t_schedule = std::chrono::steady_clock::now();
  scheduler::plan_decode(lens, so, &schedule);
  info.schedule_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t_schedule)
          .count();
  info.slot_capacity = so.max_slots;
}

// plan() step 4: a captured graph keeps its q/out/lse/indices pointers, kernel, sm_scale, variant
// arguments and work-unit shape: refuse a plan it cannot run.
void BatchDecode::Impl::check_captured_graph_fits(const DecodeBatch& b, const AttentionShape& sh,
                                                  int64_t nnz, float scale,
                                                  const VariantArgsBlock& args) const {
  const Captured& c = captured;
  if (!c.any) return;
  c.check_rows(b.batch_size, "batch_size: " + std::to_string(b.batch_size), "max_batch-row views");
  check(c.step_rows < 0 || b.batch_size <= c.step_rows, "batch_size: ", b.batch_size,
        " exceeds the ", c.step_rows, " rows of new_k / new_v / pos_ids a captured run_step ",
        "graph holds; capture run_step with max_batch-row views");
  check(nnz <= c.kv_capacity, "kv_indptr[batch_size] = ", nnz, " exceeds the ", c.kv_capacity,
        " kv_indices entries a captured CUDA graph holds; capture with the full indices buffer");
  const std::string& id = kernel.kernel().id;
  check(id == c.kernel_id && scale == c.sm_scale, "plan: a captured CUDA graph runs kernel ",
        c.kernel_id, " with sm_scale ", c.sm_scale, "; this plan needs ", id, " with sm_scale ",
        scale, ". Capture a new graph for a new configuration.");
  c.check_variant_args(args);
  // Block mode (num_kv_heads dividing the CTA count) runs each unit's items on ctas_per_unit
  // CTAs, a kernel parameter the graph holds.
  check(schedule.ctas_per_unit == c.ctas_per_unit,
        "plan: a captured CUDA graph runs its work items ", "in units of ", c.ctas_per_unit,
        " CTA(s); this plan (num_kv_heads = ", sh.num_kv_heads, ", ", schedule.num_ctas,
        " CTAs) needs units of ", schedule.ctas_per_unit,
        ". Capture a new graph for a new configuration.");
}

void BatchDecode::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                      const TensorView& lse, Stream stream) {
  impl_->life.require_planned("run");
  impl_->launch(q, kv, out, lse, DecodeStepParams{}, impl_->variant_args, stream);
}

void BatchDecode::run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                      const TensorView& lse, const VariantArgs& variant_args, Stream stream) {
  impl_->life.require_planned("run");
  check(impl_->opts.variant.is_user(),
        "BatchDecode::run: variant_args given, but the plan's variant is not a user variant");
  Impl& m = *impl_;
  const VariantArgsBlock args = ops::pack_variant_args(
      m.opts.variant.with_args(variant_args),  // a user variant: compiled as given
      {"BatchDecode::run", Device::cuda(m.cfg.device), m.batch, m.batch, m.shape.num_qo_heads,
       m.shape.head_dim, m.batch == 1 ? m.kv_lens[0] : -1});
  m.launch(q, kv, out, lse, DecodeStepParams{}, args, stream);
}

void BatchDecode::run_step(const TensorView& q, const TensorView& new_k, const TensorView& new_v,
                           const PagedKVCache& kv, const TensorView& out, const TensorView& lse,
                           const DecodeStepOptions& step, Stream stream) {
  Impl& m = *impl_;
  m.life.require_planned("run_step");
  ops::DecodeStepShape shape;
  shape.batch = m.batch;
  shape.num_qo_heads = m.shape.num_qo_heads;
  shape.num_kv_heads = m.shape.num_kv_heads;
  shape.head_dim = m.shape.head_dim;
  shape.device = m.cfg.device;
  shape.kv_dtype = m.shape.kv_dtype;
  shape.q_dtype = m.shape.q_dtype;
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

void BatchDecode::Impl::launch(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                               const TensorView& lse, const DecodeStepParams& step,
                               const VariantArgsBlock& variant_args, Stream stream) {
  Impl& m = *this;
  const Device dev = Device::cuda(m.cfg.device);
  // Under CUDA graphs, q/out/lse may hold more rows than this plan's batch (capture them at
  // max_batch so later, larger plans still fit); eagerly they must match the plan exactly.
  const bool graph = m.opts.enable_cuda_graph;
  ops::PlannedQueries queries;
  queries.device = dev;
  queries.q_dtype = m.shape.q_dtype;
  queries.o_dtype = m.shape.o_dtype;
  queries.num_qo_heads = m.shape.num_qo_heads;
  queries.head_dim = m.shape.head_dim;
  queries.rows = m.batch;
  queries.rows_of = "the plan's batch";
  queries.graph = graph;
  queries.softmax = m.variant_jit.use_softmax;
  ops::check_planned_queries(q, out, lse, queries);
  ops::PlannedPagedKV pages;
  pages.device = dev;
  pages.kv_dtype = m.shape.kv_dtype;
  pages.page_size = m.page_size;
  pages.num_kv_heads = m.shape.num_kv_heads;
  pages.head_dim = m.shape.head_dim;
  pages.batch = m.batch;
  pages.nnz_pages = m.nnz_pages;
  pages.page_ids = m.page_ids;
  pages.kv_indices_name = m.kv_indices_name.c_str();
  pages.graph = graph;
  ops::check_planned_paged_kv(kv, pages);
  check_aligned(kv.k, "paged_kv.k", 16);
  check_aligned(kv.v, "paged_kv.v", 16);
  for (int64_t s : {kv.page_stride(), kv.token_stride(), kv.head_stride()}) {
    check(s * static_cast<int64_t>(dtype_size(m.shape.kv_dtype)) % 16 == 0,
          "paged_kv: strides must be multiples of 16 bytes for vector loads");
    check(s >= 0, "paged_kv: expected non-negative strides, got ", s);
  }
  // The kernels address an element as page * page_stride + (its offset in the page), each part
  // in 32 bits (kernels/attention/decode/decode_common.cuh: the address arithmetic is most of what
  // a decode CTA issues).
  const int64_t elem = static_cast<int64_t>(dtype_size(m.shape.kv_dtype));
  const int64_t in_page = ((m.page_size - 1) * kv.token_stride() +
                           (m.shape.num_kv_heads - 1) * kv.head_stride() + m.shape.head_dim) *
                          elem;
  check(kv.page_stride() * elem <= int64_t{UINT32_MAX} && in_page <= int64_t{UINT32_MAX},
        "paged_kv: the page stride (", kv.page_stride() * elem, " bytes) and the offsets within a ",
        "page (up to ", in_page, " bytes) must be below 2^32 bytes");
  runtime::ensure_context(m.cfg.device);
  const bool capturing = m.life.begin_run(m.opts.enable_cuda_graph, "DecodePlanOptions", stream);

  DecodeParams p{};
  ops::set_query_params(p, q, out, lse);
  p.k = kv.k.data();
  p.v = kv.v.data();
  p.kv_indices = kv.indices.data_as<const int>();
  p.page_stride = kv.page_stride();
  p.token_stride = kv.token_stride();
  p.head_stride = kv.head_stride();
  p.num_pages = kv.num_pages();
  p.error = m.error_record;
  p.sm_scale_log2 = static_cast<float>(m.sm_scale * kLog2e);
  p.plan = m.ws.plan_ptrs();
  p.plan.ctas_per_unit = m.ctas_per_unit;
  p.scale = ops::kv_scale_params(kv.scale);  // checked by check_planned_paged_kv
  p.step = step;
  p.variant = variant_args;
  void* args[] = {&p};
  const ops::LoadedKernel& kernel = m.kernel.kernel();
  if (m.grid > 0) {
    runtime::LaunchConfig lc{m.grid, 1, 1, kernel.geometry.threads, 1, 1, kernel.geometry.smem};
    lc.pdl = m.opts.enable_pdl && runtime::device_supports_pdl(m.cfg.device);
    runtime::launch(kernel.functions[0], lc, stream, args, kernel.id);
  }
  if (capturing) {
    m.captured.record(q, out, lse, kv.indices.size(0), kernel.id, m.sm_scale, variant_args);
    m.captured.ctas_per_unit = m.ctas_per_unit;
    m.captured.step_rows = -1;  // run_step sets its rows after this
  }
  m.life.end_run(capturing, stream);
  runtime::check_device_errors_if_debug(m.cfg.device, stream);
}

}  // namespace flashkv
