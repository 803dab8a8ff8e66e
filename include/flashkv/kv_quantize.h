// Host quantizers and dequantizers of the quantized KV formats (kv_quant.h): the reference of what
// a quantizing append kernel must write, and exact dequantization.
//
// Each (row, group) of x is quantized on its own, in f32 arithmetic (the order a kernel can
// reproduce bitwise), with g = `tensor_scale` the per-tensor factor the cache's KVScale carries:
//   per-token-head fp8: s = absmax / (qmax * g) (qmax 448 e4m3, 57344 e5m2), stored in the scale
//                       dtype (f32 / bf16, round to nearest even); v = fp8(x / fl32(g * s)),
//                       saturating (as today's fp8 append);
//   INT4:               s = (max - min) / (15 * g), z = min / g, stored in the scale dtype;
//                       code = clamp(rne((x - fl32(g * z)) / fl32(g * s)), 0, 15);
//   NVFP4:              s = e4m3(absmax / (6 * g)) (round to nearest even, saturating);
//                       code = e2m1(x / fl32(g * s)) (round to nearest even, saturating to 6).
// A group whose effective scale fl32(g * s) is 0 (all zeros; INT4: all equal) stores code 0, so
// it dequantizes to 0 (INT4: to its offset). The scales and offsets are rounded before the codes
// are computed, so the codes are the best ones for the scales actually stored.
#pragma once

#include "flashkv/kv_quant.h"
#include "flashkv/tensor.h"

namespace flashkv {

// x [..., D] (f32, f16 or bf16, host; any leading dims, each index of them one (token, head) row;
// last dim contiguous) -> values [..., D] (e4m3 / e5m2: per-token-head fp8) or u8 [..., D / 2]
// (INT4, NVFP4), scales [..., G] (the format's scale dtype), zeros [..., G] (INT4, the scales'
// dtype; undefined otherwise). Leading dims of the outputs equal x's. Every x must be finite
// (the formats have no NaN / inf code): a non-finite element is refused, naming it, before
// anything is written. tensor_scale: finite, > 0 (NVFP4: nvfp4_tensor_scale(x); others: 1).
void quantize_kv(const TensorView& x, const KVQuantFormat& format, float tensor_scale,
                 const TensorView& values, const TensorView& scales, const TensorView& zeros);

// The exact inverse map: out [..., D] (f32 or f64-free: f32, f16, bf16; computed in double and
// rounded once) from values, scales, zeros (as quantize_kv writes them) and tensor_scale.
void dequantize_kv(const TensorView& values, const TensorView& scales, const TensorView& zeros,
                   const KVQuantFormat& format, float tensor_scale, const TensorView& out);

// NVFP4's per-tensor f32 scale of x: absmax(x) / (6 * 448), so that the largest block scale is
// e4m3's largest (1 for an all-zero x).
float nvfp4_tensor_scale(const TensorView& x);

}  // namespace flashkv
