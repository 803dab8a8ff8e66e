// The plan/run lifecycle every planned op shares (BatchDecode, BatchPrefillPaged/Ragged through
// PrefillCore, MultiLevelCascade):
//   plan():  refused while the stream is being captured (it runs on the CPU and copies from pinned
//            memory); the object is unplanned from its first check until commit(), so a plan()
//            that throws leaves it unplanned, never half-planned; the plan is written into a
//            pinned image and copied into the workspace in stream order after the last run();
//   run():   refused before a successful plan(), and refused under capture when the plan was made
//            without enable_cuda_graph (its grid depends on the batch); an eager run is recorded so
//            the next plan's copies wait for it (an event recorded inside a capture could not be
//            waited on outside it);
//   graphs:  what a captured run holds fixed (CapturedRun) is recorded at capture, and later plans
//            that it could not run are refused before anything in the workspace changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flashkv/runtime.h"
#include "flashkv/tensor.h"
#include "runtime/plan_upload.h"
#include "variants/variant_args.cuh"

namespace flashkv::ops {

// What a CUDA graph captured by run() holds fixed: its tensors' rows, the kernel, sm_scale and the
// variant's arguments (by value in the graph). An op records what else its graphs fix beside it.
struct CapturedRun {
  bool any = false;
  int64_t q_rows = 0, out_rows = 0, lse_rows = -1;  // lse_rows -1: captured without lse
  int64_t kv_capacity = 0;  // kv_indices entries (paged) or KV rows (ragged) of its tensors
  std::string kernel_id;
  float sm_scale = 0.f;
  VariantArgsBlock variant_args{};

  // Records a capture of run(q, ..., out, lse) with a KV side of kv_capacity entries.
  void record(const TensorView& q, const TensorView& out, const TensorView& lse,
              int64_t kv_capacity, const std::string& kernel_id, float sm_scale,
              const VariantArgsBlock& variant_args);
  // Refuses a plan of `rows` query rows: `rows_name` names them ("batch_size: 9"), `capture_at`
  // says which views to capture instead ("max_batch-row views").
  void check_rows(int64_t rows, const std::string& rows_name, const char* capture_at) const;
  // Refuses a plan whose KV side needs `kv` entries: `kv_name` names the count
  // ("kv_indptr[batch_size] = 70"), `kv_what` the entries (" kv_indices entries").
  void check_kv(int64_t kv, const std::string& kv_name, const char* kv_what) const;
  // Refuses a plan whose variant arguments differ from the captured ones.
  void check_variant_args(const VariantArgsBlock& args) const;
};

class PlanLifecycle {
 public:
  PlanLifecycle() = default;
  // `op` names the object in messages ("BatchDecode"); `plan_bytes` is the pinned image's size.
  PlanLifecycle(std::string op, size_t plan_bytes, int device);

  // The first step of plan(): no capture on `stream`; unplanned until commit().
  void begin_plan(Stream stream);
  // The pinned image the plan is written into (once the copy that last read it is done).
  std::byte* begin_upload(Stream stream) { return upload_.begin(stream); }
  // Copies image bytes [offset, offset + bytes) to `dst` on `stream`.
  void upload(CUdeviceptr dst, size_t offset, size_t bytes, Stream stream) {
    upload_.copy(dst, offset, bytes, stream);
  }
  void end_upload(Stream stream) { upload_.end(stream); }
  // The last step of plan(): the plan is in force.
  void commit() { planned_ = true; }

  bool planned() const { return planned_; }
  // Refuses `fn` ("run", "run_step") before a successful plan().
  void require_planned(const char* fn) const;
  // The first step of a launch: whether `stream` is being captured; refuses a capture of a plan
  // made without enable_cuda_graph (`options` names the plan options type).
  bool begin_run(bool graph_plan, const char* options, Stream stream) const;
  // The last step of a launch: an eager run is recorded (the next plan's copies wait for it).
  void end_run(bool capturing, Stream stream) {
    if (!capturing) upload_.record_run(stream);
  }

  const std::string& op() const { return op_; }

 private:
  std::string op_;
  runtime::PlanUpload upload_;
  bool planned_ = false;
};

}  // namespace flashkv::ops
