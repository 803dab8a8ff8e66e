// Element types and conversions for NVRTC-compiled kernels. Includes nothing: NVRTC compiles this
// as it is (no cuda_fp16.h needed), and the conversions are single PTX instructions.
#pragma once

namespace flashkv {

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;
typedef long long i64;

struct half_t {
  u16 bits;
};  // IEEE binary16
struct bf16_t {
  u16 bits;
};  // bfloat16
// fp8 (OCP FP8, the formats of __nv_fp8_e4m3 / __nv_fp8_e5m2): KV-cache elements only. Kernels
// widen them to 16 bits in registers (fp8x2_to_16x2) and compute in the query's dtype.
struct e4m3_t {
  unsigned char bits;
};
struct e5m2_t {
  unsigned char bits;
};
// Whether T is an fp8 type (a function: a constexpr variable would be a device global of every
// module under NVRTC's -default-device).
template <class T>
constexpr bool is_fp8() {
  return false;
}
template <>
constexpr bool is_fp8<e4m3_t>() {
  return true;
}
template <>
constexpr bool is_fp8<e5m2_t>() {
  return true;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(half_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ float to_float(bf16_t h) { return __uint_as_float(((u32)h.bits) << 16); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ half_t from_float<half_t>(float x) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
  return h;
}
template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float x) {
  bf16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
  return h;
}

// Two 16-bit values packed in one 32-bit word (low half = element 0) to two floats.
template <class T>
__device__ __forceinline__ void unpack2(u32 w, float& a, float& b);
template <>
__device__ __forceinline__ void unpack2<half_t>(u32 w, float& a, float& b) {
  u16 lo, hi;
  asm("mov.b32 {%0, %1}, %2;" : "=h"(lo), "=h"(hi) : "r"(w));
  asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"(lo));
  asm("cvt.f32.f16 %0, %1;" : "=f"(b) : "h"(hi));
}
template <>
__device__ __forceinline__ void unpack2<bf16_t>(u32 w, float& a, float& b) {
  a = __uint_as_float(w << 16);
  b = __uint_as_float(w & 0xffff0000u);
}

// Two floats to one packed word (element 0 in the low half), round to nearest even.
template <class T>
__device__ __forceinline__ u32 pack2(float a, float b);
template <>
__device__ __forceinline__ u32 pack2<half_t>(float a, float b) {
  u32 w;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(b), "f"(a));
  return w;
}
template <>
__device__ __forceinline__ u32 pack2<bf16_t>(float a, float b) {
  u32 w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(b), "f"(a));
  return w;
}

// Two fp8 values (the low 16 bits of `x`, element 0 in the low byte) to two f16 in one word
// (element 0 in the low half): one cvt on sm_89+. Exact: every e4m3 and e5m2 value is an f16.
template <class F>
__device__ __forceinline__ u32 fp8x2_to_f16x2(u32 x);
template <>
__device__ __forceinline__ u32 fp8x2_to_f16x2<e4m3_t>(u32 x) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((u16)x));
  return r;
}
template <>
__device__ __forceinline__ u32 fp8x2_to_f16x2<e5m2_t>(u32 x) {
  u32 r;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"((u16)x));
  return r;
}
// Two fp8 values to two elements of the 16-bit type T (half_t or bf16_t), packed as pack2 packs
// them: the tensor-core kernels' operand conversion. Exact for both (an fp8 value has at most 3
// significant bits and an exponent within f16's range, so it is a bf16 value too).
template <class T>
__device__ __forceinline__ u32 f16x2_to(u32 h);
template <>
__device__ __forceinline__ u32 f16x2_to<half_t>(u32 h) {
  return h;
}
template <>
__device__ __forceinline__ u32 f16x2_to<bf16_t>(u32 h) {
  float a, b;
  unpack2<half_t>(h, a, b);
  return pack2<bf16_t>(a, b);
}
template <class T, class F>
__device__ __forceinline__ u32 fp8x2_to_16x2(u32 x) {
  return f16x2_to<T>(fp8x2_to_f16x2<F>(x));
}

// Two floats to two fp8 values in the low 16 bits (element 0 in the low byte): round to nearest
// even, saturating to the largest finite value (e4m3: 448, e5m2: 57344; e5m2's infinities too);
// NaN stays NaN. The conversion the host's float_to_e4m3 / float_to_e5m2 (saturate) make.
template <class F>
__device__ __forceinline__ u32 pack_fp8x2(float a, float b);
template <>
__device__ __forceinline__ u32 pack_fp8x2<e4m3_t>(float a, float b) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
}
template <>
__device__ __forceinline__ u32 pack_fp8x2<e5m2_t>(float a, float b) {
  u16 r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
}

// pack_fp8x2 with a NaN stored as the positive canonical NaN, 0x7f, whatever sign or payload the
// conversion keeps: the bits the host's float_to_e4m3 / float_to_e5m2 store (the quantizing
// append and the fused step are bitwise equal to them).
template <class F>
__device__ __forceinline__ u32 quantize_fp8x2(float a, float b) {
  u32 r = pack_fp8x2<F>(a, b);
  if (a != a) r = (r & 0xff00u) | 0x7fu;
  if (b != b) r = (r & 0x00ffu) | 0x7f00u;
  return r;
}

template <>
__device__ __forceinline__ e4m3_t from_float<e4m3_t>(float x) {
  return e4m3_t{(unsigned char)pack_fp8x2<e4m3_t>(x, 0.f)};
}
template <>
__device__ __forceinline__ e5m2_t from_float<e5m2_t>(float x) {
  return e5m2_t{(unsigned char)pack_fp8x2<e5m2_t>(x, 0.f)};
}

// 16 bytes (a uint4) as N = 16 / sizeof(T) elements, converted to/from floats.
template <class T>
struct Vec16 {
  static constexpr int N = 16 / sizeof(T);
  __device__ __forceinline__ static void to_floats(const uint4& v, float* f) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) unpack2<T>(w[i], f[2 * i], f[2 * i + 1]);
  }
  __device__ __forceinline__ static uint4 from_floats(const float* f) {
    return make_uint4(pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]), pack2<T>(f[4], f[5]),
                      pack2<T>(f[6], f[7]));
  }
};
template <>
struct Vec16<float> {
  static constexpr int N = 4;
  __device__ __forceinline__ static void to_floats(const uint4& v, float* f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
  __device__ __forceinline__ static uint4 from_floats(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
  }
};

// 16 fp8 values, widened exactly.
template <class F>
struct Vec16Fp8 {
  static constexpr int N = 16;
  __device__ __forceinline__ static void to_floats(const uint4& v, float* f) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      unpack2<half_t>(fp8x2_to_f16x2<F>(w[i]), f[4 * i], f[4 * i + 1]);
      unpack2<half_t>(fp8x2_to_f16x2<F>(w[i] >> 16), f[4 * i + 2], f[4 * i + 3]);
    }
  }
};
template <>
struct Vec16<e4m3_t> : Vec16Fp8<e4m3_t> {};
template <>
struct Vec16<e5m2_t> : Vec16Fp8<e5m2_t> {};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashkv
