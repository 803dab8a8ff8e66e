// The tensor map a TMA load reads, as the kernels' parameters carry it (shared with the host).
#pragma once

namespace flashkv {

// A CUtensorMap (cuda.h), opaque to the kernels: 128 bytes, 64-byte aligned, encoded on the host
// (cuTensorMapEncodeTiled) and passed in the kernel's __grid_constant__ parameters.
struct alignas(64) TmaDesc {
  unsigned long long word[16];
};

}  // namespace flashkv
