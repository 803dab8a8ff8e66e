#include "runtime/plan_upload.h"

#include <utility>

#include "runtime/driver.h"

namespace flashkv::runtime {

PlanUpload::PlanUpload(size_t bytes, int device) : device_(device) {
  buffers_[0] = PinnedBuffer(bytes, device);
  buffers_[1] = PinnedBuffer(bytes, device);
  const Driver& d = driver();
  try {
    for (CUevent* e : {&run_done_, &copied_[0], &copied_[1]}) {
      check_cu(d.cuEventCreate(e, CU_EVENT_DISABLE_TIMING), "cuEventCreate(plan upload)");
    }
  } catch (...) {  // no destructor runs for a constructor that throws
    for (CUevent e : {run_done_, copied_[0], copied_[1]}) {
      if (e) d.cuEventDestroy(e);
    }
    throw;
  }
  // (Waiting on an event never recorded returns at once, as the first plans need.)
}

void PlanUpload::release() noexcept {
  if (!run_done_) return;
  try {  // never throw from a destructor
    ensure_context(device_);
    const Driver& d = driver();
    for (CUevent e : copied_) {
      d.cuEventSynchronize(e);  // the pinned buffers are freed next
      d.cuEventDestroy(e);
    }
    d.cuEventDestroy(run_done_);
  } catch (...) {
  }
  run_done_ = copied_[0] = copied_[1] = nullptr;
}

PlanUpload::~PlanUpload() { release(); }

PlanUpload::PlanUpload(PlanUpload&& o) noexcept { *this = std::move(o); }

PlanUpload& PlanUpload::operator=(PlanUpload&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    for (int i = 0; i < 2; ++i) {
      buffers_[i] = std::move(o.buffers_[i]);
      copied_[i] = std::exchange(o.copied_[i], nullptr);
    }
    run_done_ = std::exchange(o.run_done_, nullptr);
    current_ = o.current_;
  }
  return *this;
}

std::byte* PlanUpload::begin(CUstream stream) {
  const Driver& d = driver();
  const int previous = current_;
  current_ ^= 1;
  check_cu(d.cuEventSynchronize(copied_[current_]), "cuEventSynchronize(plan copy)");
  check_cu(d.cuStreamWaitEvent(stream, run_done_, 0), "cuStreamWaitEvent(last run)");
  check_cu(d.cuStreamWaitEvent(stream, copied_[previous], 0), "cuStreamWaitEvent(last plan copy)");
  return static_cast<std::byte*>(buffers_[current_].data());
}

void PlanUpload::copy(CUdeviceptr dst, size_t offset, size_t n, CUstream stream) {
  if (n == 0) return;
  check_cu(driver().cuMemcpyHtoDAsync(
               dst, static_cast<std::byte*>(buffers_[current_].data()) + offset, n, stream),
           "cuMemcpyHtoDAsync(plan)");
}

void PlanUpload::end(CUstream stream) {
  check_cu(driver().cuEventRecord(copied_[current_], stream), "cuEventRecord(plan copy)");
}

void PlanUpload::record_run(CUstream stream) {
  check_cu(driver().cuEventRecord(run_done_, stream), "cuEventRecord(run)");
}

}  // namespace flashkv::runtime
