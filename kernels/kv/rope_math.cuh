// RoPE math shared by the RoPE kernels (kv/rope.cuh) and the fused decode step
// (attention/decode/decode_step.cuh): both rotate through these functions, so a key rotated by the
// fused step is bitwise the key apply_rope writes. Shared with the host (the RopeSpec layout);
// includes nothing.
//
// Precision: the angle p * freq[i] is formed and reduced modulo 2π in double (positions reach
// 10^5-10^6 and a float product would be off by ~0.01 rad there), then sin/cos of the reduced
// angle (|a| <= π) in float; the rotation is two explicitly rounded float operations, so no
// compiler contraction choice can make two kernels differ.
#pragma once

namespace flashkv {

constexpr int kRopeMaxPairs = 128;  // rotary_dim <= 256

// How one launch rotates: frequencies (rope.h's rope_frequencies, computed on the host in double)
// or a precomputed cos/sin cache (the vLLM / SGLang convention). Passed by value in kernel params.
struct RopeSpec {
  const float* cos_sin_cache;  // [max_position, rotary_dim] (cos | sin halves) or nullptr
  long long max_position;      // rows of cos_sin_cache (positions must be below it)
  int rotary_dim;              // even, 2..head_dim: the first rotary_dim dims rotate
  int interleave;              // 1: pairs (2i, 2i+1) (GPT-J); 0: (i, i + rotary_dim/2) (NeoX)
  double freq[kRopeMaxPairs];  // radians per position, pair i (unused with cos_sin_cache)
};

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
// cos and sin of pos * freq radians: the product and its reduction modulo 2π in double, then
// sin/cos of the reduced angle (|a| <= π) in float. Every RoPE in the library goes through this.
__device__ __forceinline__ void rope_angle_cos_sin(double freq, long long pos, float& c, float& s) {
  double a = (double)pos * freq;
  a -= 6.283185307179586476925 * rint(a * 0.15915494309189533577);
  sincosf((float)a, &s, &c);
}

// cos and sin of pair i's angle at position pos (pos is in range: the caller checked it).
__device__ __forceinline__ void rope_cos_sin(const RopeSpec& r, long long pos, int i, float& c,
                                             float& s) {
  if (r.cos_sin_cache != nullptr) {
    const float* row = r.cos_sin_cache + pos * r.rotary_dim;
    c = row[i];
    s = row[r.rotary_dim / 2 + i];
    return;
  }
  rope_angle_cos_sin(r.freq[i], pos, c, s);
}

// Element indices of pair i within the head.
__device__ __forceinline__ int rope_first(const RopeSpec& r, int i) {
  return r.interleave ? 2 * i : i;
}
__device__ __forceinline__ int rope_second(const RopeSpec& r, int i) {
  return r.interleave ? 2 * i + 1 : i + r.rotary_dim / 2;
}

// (x1, x2) turned by the angle whose cos/sin are c/s.
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, float& y1,
                                            float& y2) {
  y1 = __fmaf_rn(x1, c, -__fmul_rn(x2, s));
  y2 = __fmaf_rn(x2, c, __fmul_rn(x1, s));
}
#endif

}  // namespace flashkv
