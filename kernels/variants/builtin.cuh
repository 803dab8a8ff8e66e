// The built-in attention variants (include/flashkv/variants.h has their exact math), written as
// one variant functor whose template flags select the parts: sliding window, logits soft-cap,
// ALiBi, attention sinks, sigmoid attention, a packed custom mask, fused RoPE on q and k. A
// combination (window + soft-cap + sinks, as Gemma and gpt-oss use) is one set of flags, so a
// kernel pays only for what is on. Causal masking is not a hook: the kernels skip whole tiles for
// it (a kernel parameter).
//
// BuiltinVariantArgs is shared with the host (src/ops/jit/variant_jit.cpp fills it).
#pragma once

#include "kv/rope_math.cuh"

namespace flashkv {

enum BuiltinVariantFlag : int {
  kVariantWindow = 1,
  kVariantSoftCap = 2,
  kVariantAlibi = 4,
  kVariantSinks = 8,
  kVariantSigmoid = 16,
  kVariantCustomMask = 32,
  kVariantRope = 64,
};

struct BuiltinVariantArgs {
  const float* alibi_slopes;         // [H_qo]
  const float* sinks;                // [H_qo], natural-log logits
  const unsigned char* custom_mask;  // FlashInfer's packed_custom_mask (bitorder little)
  const int* mask_indptr;            // [batch + 1] byte offset of each request, or nullptr (0)
  const int* q_rope_offset;          // [q rows of the call] RoPE position of each row, or nullptr
  const int* k_rope_offset;          // [batch] RoPE position of each request's key 0, or nullptr
  int window_left;                   // -1: no bound
  int window_right;                  // -1: no bound
  float soft_cap;
  float inv_soft_cap;
  float sigmoid_bias;
  int rope_pairs;                   // head_dim / 2
  double rope_freq[kRopeMaxPairs];  // radians per position of pair i (rope_frequencies)
};

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
}  // namespace flashkv

#include "variants/variant.cuh"

namespace flashkv {
namespace builtin_detail {
// (x1, x2) rotated by pos * freq (rope_angle_cos_sin: the angle reduced in double).
__device__ __forceinline__ void rotate(double freq, long long pos, float& x1, float& x2) {
  float s, c;
  rope_angle_cos_sin(freq, pos, c, s);
  const float y1 = x1 * c - x2 * s;
  const float y2 = x2 * c + x1 * s;
  x1 = y1;
  x2 = y2;
}
}  // namespace builtin_detail

template <int FLAGS>
struct BuiltinVariant;

// Only the hooks whose flags are on exist (the kernels detect hooks by presence), via partial
// bases: the logits transform, the mask, RoPE and sinks each come from their own base.
namespace builtin_detail {
__host__ __device__ constexpr bool on(int flags, int f) { return (flags & f) != 0; }

template <int FLAGS, bool kAny = on(FLAGS, kVariantSoftCap | kVariantAlibi | kVariantSigmoid)>
struct LogitsPart {};
template <int FLAGS>
struct LogitsPart<FLAGS, true> {
  __device__ __forceinline__ static float logits_transform(const BuiltinVariantArgs& a,
                                                           const VariantPosition& pos, float s) {
    if constexpr (on(FLAGS, kVariantAlibi))
      s += a.alibi_slopes[pos.qo_head] * (float)(pos.kv_idx - pos.q_pos());
    // tanh(x) = 1 - 2 / (e^2x + 1): ~1e-7 absolute error (what the softmax sees of a logit), a
    // few instructions where tanhf costs ~20; saturates correctly (e^2x -> inf or 0).
    if constexpr (on(FLAGS, kVariantSoftCap))
      s = a.soft_cap * (1.f - __fdividef(2.f, __expf(2.f * s * a.inv_soft_cap) + 1.f));
    if constexpr (on(FLAGS, kVariantSigmoid)) s = 1.f / (1.f + __expf(-(s + a.sigmoid_bias)));
    return s;
  }
};

template <int FLAGS, bool kAny = on(FLAGS, kVariantWindow | kVariantCustomMask)>
struct MaskPart {};
template <int FLAGS>
struct MaskPart<FLAGS, true> {
  __device__ __forceinline__ static bool logits_mask(const BuiltinVariantArgs& a,
                                                     const VariantPosition& pos) {
    bool keep = true;
    if constexpr (on(FLAGS, kVariantWindow)) {
      const int q = pos.q_pos();
      keep = (a.window_left < 0 || pos.kv_idx >= q - a.window_left) &&
             (a.window_right < 0 || pos.kv_idx <= q + a.window_right);
    }
    if constexpr (on(FLAGS, kVariantCustomMask)) {
      const long long n = (long long)pos.qo_idx * pos.kv_len + pos.kv_idx;
      const unsigned char* bytes = a.custom_mask + (a.mask_indptr ? a.mask_indptr[pos.batch] : 0);
      keep = keep && ((__ldg(bytes + (n >> 3)) >> (n & 7)) & 1);
    }
    return keep;
  }
  // The window's left edge: the prefill kernel skips KV slices left of every row's.
  __device__ __forceinline__ static int first_visible_key(const BuiltinVariantArgs& a,
                                                          const VariantRow& row) {
    if constexpr (on(FLAGS, kVariantWindow))
      return a.window_left >= 0 ? row.q_pos() - a.window_left : 0;
    return 0;
  }
};

template <int FLAGS, bool kOn = on(FLAGS, kVariantRope)>
struct RopePart {};
template <int FLAGS>
struct RopePart<FLAGS, true> {
  __device__ __forceinline__ static void query_transform(const BuiltinVariantArgs& a,
                                                         const VariantRow& row, int i, float& x1,
                                                         float& x2) {
    const long long pos = a.q_rope_offset ? a.q_rope_offset[row.q_row] : row.q_pos();
    rotate(a.rope_freq[i], pos, x1, x2);
  }
  // Keys: the kernels' fast RoPE form (variant.cuh), positions k_rope_offset[b] + kv_idx.
  __device__ __forceinline__ static double rope_freq(const BuiltinVariantArgs& a, int i) {
    return a.rope_freq[i];
  }
  __device__ __forceinline__ static long long key_rope_pos(const BuiltinVariantArgs& a,
                                                           const VariantKey& key) {
    return (a.k_rope_offset ? a.k_rope_offset[key.batch] : 0) + key.kv_idx;
  }
};

template <int FLAGS, bool kOn = on(FLAGS, kVariantSinks)>
struct SinkPart {};
template <int FLAGS>
struct SinkPart<FLAGS, true> {
  __device__ __forceinline__ static float sink(const BuiltinVariantArgs& a, int qo_head) {
    return a.sinks[qo_head];
  }
};
}  // namespace builtin_detail

template <int FLAGS>
struct BuiltinVariant : builtin_detail::LogitsPart<FLAGS>,
                        builtin_detail::MaskPart<FLAGS>,
                        builtin_detail::RopePart<FLAGS>,
                        builtin_detail::SinkPart<FLAGS> {
  using Args = BuiltinVariantArgs;
  static constexpr bool kUseSoftmax = (FLAGS & kVariantSigmoid) == 0;
};

#endif

}  // namespace flashkv
