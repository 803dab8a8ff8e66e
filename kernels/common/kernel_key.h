// What every kernel family's key type shares (attention/decode/decode_key.h,
// attention/prefill/prefill_key.h). Host code only: these headers sit beside the kernels' Configs
// so that the one type that names an instantiation is read next to the template it names, but
// they are not embedded and NVRTC never sees them (only *.cuh files are).
//
// A key is the whole identity of one compiled kernel: it produces the NVRTC name expression(s)
// (the template arguments in the Config's order), the kernel-cache id, the header to compile, and
// the launch geometry (from the constexpr shape function the Config itself reads). Nothing else
// builds these strings, so the host and the kernel cannot disagree about them.
#pragma once

#include <string>

#include "flashkv/dtype.h"
#include "flashkv/error.h"

namespace flashkv {

// Threads per CTA and dynamic shared memory bytes of a launch.
struct LaunchGeometry {
  unsigned threads = 0, smem = 0;
  bool operator==(const LaunchGeometry&) const = default;
};

// The attention variant a kernel is compiled with (src/ops/jit/variant_jit.h builds it).
struct KernelVariant {
  std::string type = "flashkv::DefaultVariant";  // the kernels' template argument
  std::string id;      // "" (plain), "b<flags>" (built-in), "u<hash>" (user): part of kernel ids
  std::string source;  // appended after the kernel header: defines `type` (user variants)
  bool operator==(const KernelVariant& o) const { return id == o.id && type == o.type; }
};

// The device-side element type of a dtype; throws naming `arg` for dtypes kernels do not take.
inline const char* device_type_name(DType t, const char* arg) {
  switch (t) {
    case DType::f16:
      return "flashkv::half_t";
    case DType::bf16:
      return "flashkv::bf16_t";
    case DType::f32:
      return "float";
    case DType::e4m3:
      return "flashkv::e4m3_t";
    case DType::e5m2:
      return "flashkv::e5m2_t";
    default:
      fail(arg, ": dtype ", dtype_name(t),
           " is not supported here (expected f16, bf16, f32, e4m3 or e5m2)");
  }
}

}  // namespace flashkv
