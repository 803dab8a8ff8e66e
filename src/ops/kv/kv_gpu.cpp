#include "ops/kv/kv_gpu.h"

#include "flashkv/error.h"
#include "flashkv/runtime.h"

namespace flashkv::ops {

void require_cuda(const char* op, Device dev) {
  check(cuda_available(), op, ": tensors on ", dev.str(), " but no usable GPU (",
        cuda_unavailable_reason(), "); pass host tensors to run the CPU reference");
}

void check_gpu_index(const TensorView& t, const char* name) {
  check(t.size(0) <= 1 || t.stride(0) == 1, name,
        ": the GPU kernels read index arrays flat: expected a contiguous array, got stride ",
        t.stride(0));
  check_aligned(t, name, 4);
}

int vector_width(DType dt, std::initializer_list<const TensorView*> tensors,
                 std::initializer_list<int64_t> multiples) {
  const int vec = 16 / static_cast<int>(dtype_size(dt));
  for (const TensorView* t : tensors) {
    if (reinterpret_cast<uintptr_t>(t->data()) % 16 != 0) return 1;
  }
  for (int64_t m : multiples) {
    if (m % vec != 0) return 1;
  }
  return vec;
}

}  // namespace flashkv::ops
