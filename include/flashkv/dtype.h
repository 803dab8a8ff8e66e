// Element types and host-side conversions.
//
// The conversions are bit-exact IEEE round-to-nearest-even implementations so the CPU reference
// sees exactly the values the GPU kernels see. fp8 follows the OCP FP8 spec (the formats of
// `__nv_fp8_e4m3` / `__nv_fp8_e5m2`): e4m3 has no infinity and saturates to ±448 on overflow when
// `saturate` is set (the CUDA `__NV_SATFINITE` behaviour); otherwise overflow becomes NaN.
// e5m2 has infinities like fp16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace flashkv {

// u8: raw bytes, the packed 4-bit pairs of an INT4 or NVFP4 KV cache (kv_quant.h): never an
// attention input of its own, always read through a quantized format's descriptor.
enum class DType : uint8_t { f32, f16, bf16, e4m3, e5m2, i32, u8 };

// Bytes per element.
size_t dtype_size(DType t);
// Short lower-case name: "f32", "f16", "bf16", "e4m3", "e5m2", "i32", "u8".
const char* dtype_name(DType t);
// Inverse of dtype_name; also accepts "float16", "half", "bfloat16", "float32", "int32",
// "fp8_e4m3", "fp8_e5m2", "uint8". Throws flashkv::Error naming the accepted spellings otherwise.
DType parse_dtype(std::string_view name);
// True for the floating-point element types (not i32, not u8).
bool is_floating(DType t);
// True for e4m3 and e5m2.
inline bool is_fp8_dtype(DType t) { return t == DType::e4m3 || t == DType::e5m2; }

// fp16 (IEEE binary16) <-> float.
uint16_t float_to_f16(float x);
float f16_to_float(uint16_t bits);
// bfloat16 <-> float (round to nearest even; NaN stays NaN).
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t bits);
// fp8 e4m3 (bias 7, no inf, NaN = 0x7f/0xff, max 448) <-> float.
uint8_t float_to_e4m3(float x, bool saturate = true);
float e4m3_to_float(uint8_t bits);
// fp8 e5m2 (bias 15, inf and NaN like fp16, max 57344) <-> float. With `saturate`, finite
// overflow AND ±inf become ±57344 (as CUDA's __NV_SATFINITE / cvt.rn.satfinite do); without it,
// overflow becomes ±inf. NaN inputs become 0x7f in both fp8 formats, 0x7fff in f16/bf16.
uint8_t float_to_e5m2(float x, bool saturate = true);
float e5m2_to_float(uint8_t bits);

// fp4 e2m1 (NVFP4's element: 1 sign, 2 exponent, 1 mantissa bit; values 0, 0.5, 1, 1.5, 2, 3,
// 4, 6; no inf or NaN) <-> float, as the low 4 bits of a byte. Round to nearest even, saturating
// to ±6; NaN has no encoding and is the caller's to refuse (kv_quantize.h does).
uint8_t float_to_e2m1(float x);
float e2m1_to_float(uint8_t nibble);

// Reads element `i` of a buffer of type `t` as a double (f32/f16/bf16/fp8/i32; u8: the byte).
double load_as_double(const void* data, DType t, int64_t i);
// Writes `x` (rounded to nearest even) as element `i` of a buffer of type `t`.
void store_from_double(void* data, DType t, int64_t i, double x);

}  // namespace flashkv
