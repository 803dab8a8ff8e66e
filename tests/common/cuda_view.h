// A view of a host tensor that claims to live on cuda:0, for tests of the device routing and of
// "GPU kernel not available" errors on machines without a GPU. Nothing may dereference it.
#pragma once

#include <cstdint>
#include <vector>

#include "flashkv/tensor.h"

namespace flashkv::test {

inline TensorView as_cuda_view(const TensorView& v) {
  std::vector<int64_t> shape(v.ndim()), strides(v.ndim());
  for (int d = 0; d < v.ndim(); ++d) {
    shape[d] = v.size(d);
    strides[d] = v.stride(d);
  }
  return TensorView(v.data(), v.dtype(), v.ndim(), shape.data(), strides.data(), Device::cuda(0));
}

}  // namespace flashkv::test
