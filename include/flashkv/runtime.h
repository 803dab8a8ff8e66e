// Devices, streams, memory and JIT statistics: the small runtime surface a user of flashkv sees.
//
// flashkv loads the CUDA driver at first use (dlopen), so every function here is safe to call on
// a machine without a GPU: cuda_available() then returns false and device work throws
// flashkv::Error with the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

struct CUstream_st;  // the driver's stream type (cudaStream_t and CUstream both point to it)

namespace flashkv {

// Compatible with both cudaStream_t and CUstream. nullptr is the legacy default stream.
using Stream = CUstream_st*;

bool cuda_available();
// Why cuda_available() is false, or "".
std::string cuda_unavailable_reason();
int cuda_device_count();

struct DeviceInfo {
  std::string name;
  int index = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  std::string arch;         // NVRTC target, e.g. "sm_90a"
  size_t total_memory = 0;  // bytes
  int l2_bytes = 0;
  int max_smem_per_block = 0;  // opt-in maximum, bytes
  int driver_version = 0;      // e.g. 13000
};
DeviceInfo device_info(int device = 0);

std::string nvrtc_version();
// NVRTC is loaded at the first compile (dlopen): from the directories added here, then the
// dynamic loader's search (LD_LIBRARY_PATH, ld.so.cache), then $CUDA_HOME, $CUDA_PATH and
// /usr/local/cuda. The Python package adds the nvidia-cuda-nvrtc wheel's directory. A directory
// added after the first compile is not used.
void add_nvrtc_search_dir(const std::string& dir);
// The file name it looks for, e.g. "libnvrtc.so.13" (the CUDA major this build is for).
std::string nvrtc_soname();
// The NVRTC file loaded (loading it if needed); throws flashkv::Error naming where it looked.
std::string nvrtc_library();
std::string kernel_cache_dir();  // "" when the disk cache is disabled

struct JitCounters {
  int64_t compiles = 0;
  double compile_ms = 0.0;
  int64_t disk_hits = 0;
  int64_t memory_hits = 0;
  int64_t corrupt_entries = 0;
};
JitCounters jit_counters();

// Device memory owned by flashkv (tests, CLI, workspaces for users who have no allocator).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, int device = 0);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  int device() const { return device_; }
  void copy_from_host(const void* src, size_t bytes, size_t offset = 0);  // synchronous
  void copy_to_host(void* dst, size_t bytes, size_t offset = 0) const;    // synchronous
  void fill_bytes(uint8_t value);                                         // synchronous

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

// Pinned host memory (for asynchronous copies).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes, int device = 0);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

Stream create_stream(int device = 0);
void destroy_stream(Stream s);
void synchronize(Stream s = nullptr);
void device_synchronize(int device = 0);

// Elapsed milliseconds between two points on a stream, measured with CUDA events.
class EventTimer {
 public:
  explicit EventTimer(int device = 0);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(Stream s);
  void stop(Stream s);
  float elapsed_ms();  // synchronizes on the stop event

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace flashkv
