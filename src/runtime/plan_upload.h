// The host-to-device upload of a plan, shared by the ops that plan on the CPU (decode, prefill,
// cascade): the plan is written into pinned memory and copied into the workspace asynchronously,
// in stream order after the last run() that reads the workspace.
//
// Two pinned buffers, used in turn: plan() writes into one while the copy of the previous plan
// may still be reading the other, so back-to-back plans never wait on the host for a copy (with
// one buffer every plan() waited for the last one's copy: tens of microseconds when plans follow
// each other). The buffer is reused two plans later, after its copy (long done in practice).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "flashkv/runtime.h"

namespace flashkv::runtime {

class PlanUpload {
 public:
  PlanUpload() = default;
  PlanUpload(size_t bytes, int device);
  ~PlanUpload();
  PlanUpload(PlanUpload&& o) noexcept;
  PlanUpload& operator=(PlanUpload&& o) noexcept;
  PlanUpload(const PlanUpload&) = delete;
  PlanUpload& operator=(const PlanUpload&) = delete;

  // Starts a plan on `stream`: returns the pinned buffer (bytes long) to write it into, once the
  // copy that last read that buffer is done, and orders `stream` after the last eager run() and
  // the previous plan's copies (which may have been on another stream).
  std::byte* begin(CUstream stream);
  // Copies buffer bytes [offset, offset + n) of the current plan to `dst` on `stream`.
  void copy(CUdeviceptr dst, size_t offset, size_t n, CUstream stream);
  // Ends the plan begun on `stream`: its copies are recorded, so a later plan knows when they end.
  void end(CUstream stream);
  // After an eager run() on `stream`: the next plan's copies wait for it.
  void record_run(CUstream stream);

 private:
  void release() noexcept;
  int device_ = 0;
  PinnedBuffer buffers_[2];
  CUevent copied_[2] = {nullptr, nullptr};  // the last copies out of each buffer
  CUevent run_done_ = nullptr;
  int current_ = 1;  // the buffer of the last plan
};

}  // namespace flashkv::runtime
