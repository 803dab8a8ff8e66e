// The CUDA driver API, loaded with dlopen at first use.
//
// Why dlopen: the library and the CLI must start (and run the CPU reference) on machines without
// a GPU or driver, where linking libcuda.so.1 would fail at load time. The entry points are the
// versioned symbols that cuda.h's macros name (cuMemAlloc -> cuMemAlloc_v2), resolved with dlsym.
#pragma once

#include <cuda.h>

#include <string>

namespace flashkv::runtime {

// The list of driver entry points flashkv uses: X(name) for each.
// clang-format off
#define FLASHKV_DRIVER_FUNCTIONS(X) \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) \
  X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) \
  X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuGetErrorName) X(cuGetErrorString) \
  X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleGetGlobal) X(cuFuncSetAttribute) X(cuFuncGetAttribute) \
  X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuMemAlloc) X(cuMemFree) X(cuMemAllocHost) X(cuMemFreeHost) X(cuMemcpyHtoD) \
  X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) \
  X(cuMemsetD32Async) X(cuMemsetD32) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) \
  X(cuStreamIsCapturing) X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamWaitEvent) \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy) X(cuEventCreate) \
  X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuPointerGetAttribute) \
  X(cuMemGetInfo) X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuTensorMapEncodeTiled)
// clang-format on

struct Driver {
#define FLASHKV_DECLARE_PTR(name) decltype(&::name) name = nullptr;
  FLASHKV_DRIVER_FUNCTIONS(FLASHKV_DECLARE_PTR)
#undef FLASHKV_DECLARE_PTR
};

// True when libcuda loads, cuInit succeeds and at least one device is present. Never throws.
bool driver_available();
// Why driver_available() is false ("libcuda.so.1 not found", "cuInit: ..."), or "".
std::string driver_unavailable_reason();
// The loaded driver; throws flashkv::Error (with the reason) when unavailable.
const Driver& driver();

// Throws flashkv::Error "<what>: <CUDA error name>: <description>" when r != CUDA_SUCCESS.
void check_cu(CUresult r, const std::string& what);

// Makes the primary context of `device` current on this thread (retaining it once per process).
void ensure_context(int device);

}  // namespace flashkv::runtime
