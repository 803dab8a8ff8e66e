// The variant's parameter block as the kernels receive it: raw bytes inside the kernel's
// parameters (so a CUDA graph keeps them by value), read as the variant's Args struct. Shared with
// the host (src/ops/jit/variant_jit.cpp packs it); includes nothing.
#pragma once

namespace flashkv {

constexpr int kVariantArgsBytes = 2048;

struct VariantArgsBlock {
  alignas(16) unsigned char bytes[kVariantArgsBytes];
};

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
// The block as V's Args. The kernels take their parameters as __grid_constant__, so this reads
// parameter memory in place (no local copy).
template <class V>
__device__ __forceinline__ const typename V::Args& variant_args(const VariantArgsBlock& b) {
  static_assert(sizeof(typename V::Args) <= kVariantArgsBytes,
                "a variant's Args exceed 2048 bytes");
  return *reinterpret_cast<const typename V::Args*>(b.bytes);
}
#endif

}  // namespace flashkv
