// The public runtime surface (include/flashkv/runtime.h) on top of the dlopen'ed driver.
#include <mutex>
#include <unordered_map>
#include <utility>

#include "flashkv/error.h"
#include "flashkv/runtime.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"
#include "runtime/nvrtc_compiler.h"
#include "runtime/nvrtc_library.h"

namespace flashkv {
using runtime::check_cu;
using runtime::driver;

bool cuda_available() { return runtime::driver_available(); }
std::string cuda_unavailable_reason() { return runtime::driver_unavailable_reason(); }

int cuda_device_count() {
  if (!cuda_available()) return 0;
  int n = 0;
  check_cu(driver().cuDeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

DeviceInfo device_info(int device) {
  const auto& d = driver();
  runtime::ensure_context(device);
  CUdevice dev;
  check_cu(d.cuDeviceGet(&dev, device), "cuDeviceGet");
  DeviceInfo info;
  info.index = device;
  char name[256] = {};
  check_cu(d.cuDeviceGetName(name, sizeof(name), dev), "cuDeviceGetName");
  info.name = name;
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    check_cu(d.cuDeviceGetAttribute(&v, a, dev), "cuDeviceGetAttribute");
    return v;
  };
  info.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  info.max_smem_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  info.arch = runtime::device_arch(device);
  check_cu(d.cuDeviceTotalMem(&info.total_memory, dev), "cuDeviceTotalMem");
  check_cu(d.cuDriverGetVersion(&info.driver_version), "cuDriverGetVersion");
  return info;
}

std::string nvrtc_version() { return runtime::nvrtc_version_string(); }
void add_nvrtc_search_dir(const std::string& dir) { runtime::add_nvrtc_search_dir(dir); }
std::string nvrtc_soname() { return runtime::nvrtc_soname(); }
std::string nvrtc_library() { return runtime::nvrtc().path; }
std::string kernel_cache_dir() { return runtime::KernelCache::instance().directory(); }

JitCounters jit_counters() {
  const runtime::JitStats s = runtime::KernelCache::instance().stats();
  return {s.compiles, s.compile_ms, s.disk_hits, s.memory_hits, s.corrupt_entries};
}

// --- DeviceBuffer ---
DeviceBuffer::DeviceBuffer(size_t bytes, int device) : bytes_(bytes), device_(device) {
  runtime::ensure_context(device);
  CUdeviceptr p = 0;
  if (bytes > 0)
    check_cu(driver().cuMemAlloc(&p, bytes), "cuMemAlloc(" + std::to_string(bytes) + " bytes)");
  ptr_ = reinterpret_cast<void*>(p);
}
DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  try {  // a destructor must not throw (e.g. at process exit, with the driver shutting down)
    runtime::ensure_context(device_);
    driver().cuMemFree(reinterpret_cast<CUdeviceptr>(ptr_));
  } catch (...) {
  }
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      device_(o.device_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    this->~DeviceBuffer();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
  }
  return *this;
}
void DeviceBuffer::copy_from_host(const void* src, size_t bytes, size_t offset) {
  check(offset + bytes <= bytes_, "DeviceBuffer::copy_from_host: ", bytes, " bytes at offset ",
        offset, " exceed the buffer size ", bytes_);
  if (bytes == 0) return;
  runtime::ensure_context(device_);
  check_cu(driver().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(ptr_) + offset, src, bytes),
           "cuMemcpyHtoD");
  // From pageable memory cuMemcpyHtoD returns once the bytes are staged, before the DMA into
  // device memory lands (CUDA's "API synchronization behavior"); it is ordered only in the
  // legacy stream, so a kernel on a non-blocking stream could read the old bytes. Seen on the
  // H200: a RoPE test read stale cos/sin rows under 12 concurrent test processes.
  check_cu(driver().cuStreamSynchronize(CU_STREAM_LEGACY), "cuStreamSynchronize");
}
void DeviceBuffer::copy_to_host(void* dst, size_t bytes, size_t offset) const {
  check(offset + bytes <= bytes_, "DeviceBuffer::copy_to_host: ", bytes, " bytes at offset ",
        offset, " exceed the buffer size ", bytes_);
  if (bytes == 0) return;
  runtime::ensure_context(device_);
  check_cu(driver().cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(ptr_) + offset, bytes),
           "cuMemcpyDtoH");
}
void DeviceBuffer::fill_bytes(uint8_t value) {
  if (bytes_ == 0) return;
  runtime::ensure_context(device_);
  check_cu(driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(ptr_), value, bytes_, nullptr),
           "cuMemsetD8");
  check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

// --- PinnedBuffer ---
PinnedBuffer::PinnedBuffer(size_t bytes, int device) : bytes_(bytes) {
  runtime::ensure_context(device);
  if (bytes > 0) check_cu(driver().cuMemAllocHost(&ptr_, bytes), "cuMemAllocHost");
}
PinnedBuffer::~PinnedBuffer() {
  if (!ptr_) return;
  try {
    driver().cuMemFreeHost(ptr_);
  } catch (...) {
  }
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    this->~PinnedBuffer();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// --- streams and events ---
Stream create_stream(int device) {
  runtime::ensure_context(device);
  CUstream s;
  check_cu(driver().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return s;
}
void destroy_stream(Stream s) {
  if (s) check_cu(driver().cuStreamDestroy(s), "cuStreamDestroy");
}
void synchronize(Stream s) { check_cu(driver().cuStreamSynchronize(s), "cuStreamSynchronize"); }
void device_synchronize(int device) {
  runtime::ensure_context(device);
  check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

EventTimer::EventTimer(int device) {
  runtime::ensure_context(device);
  CUevent a, b;
  check_cu(driver().cuEventCreate(&a, CU_EVENT_DEFAULT), "cuEventCreate");
  check_cu(driver().cuEventCreate(&b, CU_EVENT_DEFAULT), "cuEventCreate");
  start_ = a;
  stop_ = b;
}
EventTimer::~EventTimer() {
  try {
    driver().cuEventDestroy(static_cast<CUevent>(start_));
    driver().cuEventDestroy(static_cast<CUevent>(stop_));
  } catch (...) {
  }
}
void EventTimer::start(Stream s) {
  check_cu(driver().cuEventRecord(static_cast<CUevent>(start_), s), "cuEventRecord");
}
void EventTimer::stop(Stream s) {
  check_cu(driver().cuEventRecord(static_cast<CUevent>(stop_), s), "cuEventRecord");
}
float EventTimer::elapsed_ms() {
  check_cu(driver().cuEventSynchronize(static_cast<CUevent>(stop_)), "cuEventSynchronize");
  float ms = 0;
  check_cu(
      driver().cuEventElapsedTime(&ms, static_cast<CUevent>(start_), static_cast<CUevent>(stop_)),
      "cuEventElapsedTime");
  return ms;
}

namespace runtime {
namespace {
// Dynamic shared memory a launch may use without opting in: 48 KiB minus what kernels declare
// statically (a few hundred bytes; the limit counts both).
constexpr unsigned kDefaultDynamicSmem = 46 * 1024;
}  // namespace

namespace {
// Raises f's dynamic shared memory limit to `bytes` once, not at every launch: a driver call per
// run() is launch latency. (Functions live as long as their modules: the process, here.)
void raise_smem_limit(CUfunction f, unsigned bytes, const std::string& what) {
  static std::mutex mu;
  // Leaked on purpose, like the contexts (driver.cpp): used until the process exits.
  static auto& raised = *new std::unordered_map<CUfunction, unsigned>;
  std::lock_guard<std::mutex> lock(mu);
  unsigned& limit = raised[f];
  if (limit >= bytes) return;
  check_cu(
      driver().cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
      "cuFuncSetAttribute(" + what + ", " + std::to_string(bytes) + " bytes of shared memory)");
  limit = bytes;
}
}  // namespace

void launch(CUfunction f, const LaunchConfig& c, Stream stream, void** args,
            const std::string& what) {
  if (c.smem_bytes > kDefaultDynamicSmem) raise_smem_limit(f, c.smem_bytes, what);
  if (c.pdl) {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig lc{};
    lc.gridDimX = c.grid_x;
    lc.gridDimY = c.grid_y;
    lc.gridDimZ = c.grid_z;
    lc.blockDimX = c.block_x;
    lc.blockDimY = c.block_y;
    lc.blockDimZ = c.block_z;
    lc.sharedMemBytes = c.smem_bytes;
    lc.hStream = stream;
    lc.attrs = &attr;
    lc.numAttrs = 1;
    check_cu(driver().cuLaunchKernelEx(&lc, f, args, nullptr), "launch (PDL) of " + what);
    return;
  }
  check_cu(driver().cuLaunchKernel(f, c.grid_x, c.grid_y, c.grid_z, c.block_x, c.block_y, c.block_z,
                                   c.smem_bytes, stream, args, nullptr),
           "launch of " + what);
}

int max_active_ctas_per_sm(CUfunction f, unsigned block_x, unsigned smem_bytes,
                           const std::string& what) {
  const Driver& d = driver();
  if (smem_bytes > kDefaultDynamicSmem) raise_smem_limit(f, smem_bytes, what);
  int n = 0;
  check_cu(
      d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, static_cast<int>(block_x), smem_bytes),
      "cuOccupancyMaxActiveBlocksPerMultiprocessor(" + what + ")");
  return n;
}

bool device_supports_pdl(int device) {
  static std::mutex mu;
  static auto& known = *new std::unordered_map<int, bool>;  // leaked, as the contexts
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(device);
  if (it != known.end()) return it->second;
  CUdevice dev = 0;
  check_cu(driver().cuDeviceGet(&dev, device), "cuDeviceGet");
  int major = 0;
  check_cu(driver().cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
           "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
  return known[device] = major >= 9;
}

bool stream_is_capturing(Stream stream) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  check_cu(driver().cuStreamIsCapturing(stream, &st), "cuStreamIsCapturing");
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int pointer_device(const void* p, const char* name) {
  int ordinal = -1;
  CUresult r = driver().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                              reinterpret_cast<CUdeviceptr>(p));
  check(r == CUDA_SUCCESS, name, ": expected a CUDA device pointer, got ", p,
        " (not device memory)");
  return ordinal;
}

}  // namespace runtime
}  // namespace flashkv
