// One (token, head) row of a quantized KV format (kv_quant.h), quantized or dequantized: the
// single copy of the formats' arithmetic, used by the host quantizers (kv_quantize.h), the CPU
// reference's gather and its quantizing append. Not a public header.
#pragma once

#include <cstdint>

#include "flashkv/kv_quant.h"

namespace flashkv::detail {

// A row's group entries in a scale or zero-point pool: `data` points at group 0's element,
// `stride` is the element distance between groups.
struct GroupEntries {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t stride = 1;
};

// x[0 .. dim) (f32, finite) -> the row's stored bytes at `values` (fp8: dim bytes; packed: dim / 2)
// and its group entries (kv_quantize.h has the arithmetic). `g`: the per-tensor factor.
void quantize_row(const KVQuantFormat& f, DType value_dtype, const float* x, int dim, float g,
                  void* values, const GroupEntries& scales, const GroupEntries& zeros);

// The row's real values, exactly: out[d] = fl32(g * s) * v (+ fl32(g * z) for INT4) in double.
void dequantize_row(const KVQuantFormat& f, DType value_dtype, const void* values, int dim, float g,
                    const GroupEntries& scales, const GroupEntries& zeros, double* out);

}  // namespace flashkv::detail
