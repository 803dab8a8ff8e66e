// NVRTC, loaded with dlopen at first use (like the driver, runtime/driver.h).
//
// Why dlopen: a wheel user has no CUDA toolkit. NVRTC then comes from the PyPI wheel
// nvidia-cuda-nvrtc (site-packages/nvidia/cu13/lib), a place no RPATH fixed at build time can
// name; the Python package finds it and registers its directory (add_nvrtc_search_dir). Linked
// at build time, the library would also fail to load on a machine without NVRTC, where the CPU
// reference needs none.
#pragma once

#include <nvrtc.h>

#include <string>

namespace flashkv::runtime {

// The NVRTC entry points flashkv uses: X(name) for each.
// clang-format off
#define FLASHKV_NVRTC_FUNCTIONS(X) \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram) \
  X(nvrtcAddNameExpression) X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) \
  X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcGetLoweredName)
// clang-format on

struct Nvrtc {
#define FLASHKV_DECLARE_PTR(name) decltype(&::name) name = nullptr;
  FLASHKV_NVRTC_FUNCTIONS(FLASHKV_DECLARE_PTR)
#undef FLASHKV_DECLARE_PTR
  std::string path;  // the file loaded, e.g. ".../nvidia/cu13/lib/libnvrtc.so.13"
};

// The loaded NVRTC; throws flashkv::Error naming every place it looked when none loads.
const Nvrtc& nvrtc();

// "libnvrtc.so.13": the NVRTC this build's nvrtc.h declares (its ABI is stable within a major).
std::string nvrtc_soname();

// Looks for NVRTC in `dir` before the loader's own search and the toolkit's places. Takes effect
// only before the first nvrtc() call.
void add_nvrtc_search_dir(const std::string& dir);

}  // namespace flashkv::runtime
