#include "runtime/driver.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "flashkv/error.h"

namespace flashkv::runtime {
namespace {

// Stringify after macro expansion, so cuMemAlloc becomes "cuMemAlloc_v2" as cuda.h maps it.
#define FLASHKV_STR2(x) #x
#define FLASHKV_STR(x) FLASHKV_STR2(x)

struct DriverState {
  Driver fns;
  bool ok = false;
  std::string reason;
};

DriverState load_driver() {
  DriverState s;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    s.reason = "no CUDA driver: libcuda.so.1 could not be loaded";
    return s;
  }
#define FLASHKV_LOAD_PTR(name)                                                               \
  s.fns.name = reinterpret_cast<decltype(s.fns.name)>(dlsym(lib, FLASHKV_STR(name)));        \
  if (!s.fns.name) {                                                                         \
    s.reason = std::string("CUDA driver lacks ") + FLASHKV_STR(name) + " (driver too old?)"; \
    return s;                                                                                \
  }
  FLASHKV_DRIVER_FUNCTIONS(FLASHKV_LOAD_PTR)
#undef FLASHKV_LOAD_PTR
  CUresult r = s.fns.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = "?";
    s.fns.cuGetErrorName(r, &name);
    s.reason = std::string("cuInit failed: ") + name;
    return s;
  }
  int count = 0;
  s.fns.cuDeviceGetCount(&count);
  if (count <= 0) {
    s.reason = "the CUDA driver reports no devices";
    return s;
  }
  s.ok = true;
  return s;
}

const DriverState& state() {
  static const DriverState s = load_driver();
  return s;
}

}  // namespace

bool driver_available() { return state().ok; }
std::string driver_unavailable_reason() { return state().ok ? "" : state().reason; }

const Driver& driver() {
  const DriverState& s = state();
  check(s.ok, s.reason);
  return s.fns;
}

void check_cu(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* desc = "";
  if (state().ok) {
    state().fns.cuGetErrorName(r, &name);
    state().fns.cuGetErrorString(r, &desc);
  }
  fail(what, ": ", name, ": ", desc);
}

void ensure_context(int device) {
  const Driver& d = driver();
  static std::mutex mu;
  // Leaked on purpose: destructors of objects with static storage may still call this at exit.
  static std::vector<CUcontext>& contexts = *new std::vector<CUcontext>;
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    // The device count is read once: this runs on every run() (a driver call there costs
    // launch latency).
    if (contexts.empty()) {
      int count = 0;
      check_cu(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
      contexts.resize(count, nullptr);
    }
    const int count = static_cast<int>(contexts.size());
    check(device >= 0 && device < count, "device: expected 0 <= device < ", count, ", got ",
          device);
    if (!contexts[device]) {
      CUdevice dev;
      check_cu(d.cuDeviceGet(&dev, device), "cuDeviceGet");
      check_cu(d.cuDevicePrimaryCtxRetain(&contexts[device], dev), "cuDevicePrimaryCtxRetain");
    }
    ctx = contexts[device];
  }
  CUcontext current = nullptr;
  d.cuCtxGetCurrent(&current);
  if (current != ctx) check_cu(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

}  // namespace flashkv::runtime
