#include "ops/common/plan_lifecycle.h"

#include <algorithm>

#include "flashkv/error.h"
#include "ops/jit/variant_jit.h"
#include "runtime/launch.h"

namespace flashkv::ops {

void CapturedRun::record(const TensorView& q, const TensorView& out, const TensorView& lse,
                         int64_t kv, const std::string& kernel, float scale,
                         const VariantArgsBlock& args) {
  any = true;
  q_rows = q.size(0);
  out_rows = out.size(0);
  lse_rows = lse.defined() ? lse.size(0) : -1;
  kv_capacity = kv;
  kernel_id = kernel;
  sm_scale = scale;
  variant_args = args;
}

void CapturedRun::check_rows(int64_t rows, const std::string& rows_name,
                             const char* capture_at) const {
  check(rows <= q_rows && rows <= out_rows && (lse_rows < 0 || rows <= lse_rows), rows_name,
        " exceeds the ", std::min(q_rows, out_rows),
        " rows of q/out a captured CUDA graph holds; capture run() with ", capture_at);
}

void CapturedRun::check_kv(int64_t kv, const std::string& kv_name, const char* kv_what) const {
  check(kv <= kv_capacity, kv_name, " exceeds the ", kv_capacity, kv_what,
        " a captured CUDA graph holds; capture with the full buffers");
}

void CapturedRun::check_variant_args(const VariantArgsBlock& args) const {
  check(same_variant_args(args, variant_args),
        "plan: a captured CUDA graph holds the variant arguments of its capture (values and "
        "tensor pointers); this plan's differ. Capture a new graph for new variant arguments.");
}

PlanLifecycle::PlanLifecycle(std::string op, size_t plan_bytes, int device)
    : op_(std::move(op)), upload_(plan_bytes, device) {}

void PlanLifecycle::begin_plan(Stream stream) {
  check(!runtime::stream_is_capturing(stream), op_,
        "::plan: the stream is being captured into a CUDA graph; plan() runs on the CPU and "
        "copies the schedule from pinned memory, so call it before each replay, outside the "
        "capture, and capture only run()");
  planned_ = false;
}

void PlanLifecycle::require_planned(const char* fn) const {
  check(planned_, op_, "::", fn, ": called before a successful plan()");
}

bool PlanLifecycle::begin_run(bool graph_plan, const char* options, Stream stream) const {
  const bool capturing = runtime::stream_is_capturing(stream);
  check(graph_plan || !capturing, op_,
        "::run: the stream is being captured into a CUDA graph, but plan() was called without "
        "enable_cuda_graph; its grid depends on the batch, so a replay after another plan() would "
        "be wrong. Plan with ",
        options, ".enable_cuda_graph = true.");
  return capturing;
}

}  // namespace flashkv::ops
