// Host helpers the GPU paths of the KV-cache ops and RoPE share: the device check, the checks of
// device-resident index arrays, and the choice of vector width.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "flashkv/tensor.h"

namespace flashkv::ops {

// Throws flashkv::Error naming `op` when CUDA tensors were passed but no GPU is usable.
void require_cuda(const char* op, Device dev);

// A device-resident i32 index array the kernels read flat: contiguous, 4-byte aligned.
void check_gpu_index(const TensorView& t, const char* name);

// Elements per vector access for element type `dt`: 16 bytes' worth when every tensor's data is
// 16-byte aligned and every element count in `multiples` (strides, dims) is a multiple of it;
// else 1 (scalar accesses: any layout works, just slower).
int vector_width(DType dt, std::initializer_list<const TensorView*> tensors,
                 std::initializer_list<int64_t> multiples);

}  // namespace flashkv::ops
