// Attention variants as functors (docs/design.md "Kernel families"): the interface every attention
// kernel (decode on CUDA cores and tensor cores, prefill) calls, and the defaults of hooks a
// variant leaves out.
//
// A variant is a struct with static hooks, each optional (detected at compile time; a hook that
// is not defined costs nothing):
//
//   using Args = ...;                  the parameter block run() receives (a plain struct)
//   static constexpr bool kUseSoftmax  default true; false: weights are not normalized (sigmoid)
//   float logits_transform(const Args&, const VariantPosition&, float s)
//       s = sm_scale * q·k (natural-log units). Returns the logit (softmax) or the weight
//       (kUseSoftmax false). Default: s (softmax) / s (as a weight: define it for non-softmax).
//   bool logits_mask(const Args&, const VariantPosition&)      false drops the key. Default: keep.
//   int first_visible_key(const Args&, const VariantRow&)
//       a bound the mask guarantees: no key before it is kept for this row (a sliding window's
//       left edge). Lets the prefill kernel skip whole KV slices; the mask still decides.
//   void query_transform(const Args&, const VariantRow&, int i, float& x1, float& x2)
//   void key_transform(const Args&, const VariantKey&, int i, float& x1, float& x2)
//       dimension pair i < D/2 of a query row / key: elements (i, i + D/2), the rotate-half
//       layout of RoPE (an element-wise transform is the special case that ignores the partner).
//       The result is rounded to the input dtype (the kernels keep q and k in 16 bits).
//   float value_transform(const Args&, const VariantKey&, int dim, float v)    (rounded as k)
//   double rope_freq(const Args&, int i)  and  long long key_rope_pos(const Args&, const
//   VariantKey&)
//       RoPE on the keys, the form kernels run fast: pair i of a key at position p turns by
//       p * rope_freq(i) radians (rotate-half pairs). key_rope_pos must be kv_idx plus a
//       per-request offset: the kernels rotate consecutive keys by a step rotation instead of a
//       sin/cos per element (one precise sin/cos per thread and tile). Used instead of
//       key_transform when both are defined.
//   float sink(const Args&, int qo_head)
//       a logit (natural-log units) that joins each softmax denominator of that head once, with
//       a zero value (gpt-oss attention sinks): out = Σ e^s v / (Σ e^s + e^sink).
//   float output_transform(const Args&, const VariantRow&, int dim, float o)
//       on each element of the final output (after normalization and any split-KV merge).
//
// Positions: a query row i of a request with qo_len queries and kv_len keys sits at
// q_pos = kv_len - qo_len + i (the causal diagonal, attention.h); key j at j. Decode has qo_len 1.
// Split-KV: hooks see whole-request positions, so chunks of a split request compute the same
// logits as the whole; the sink enters exactly one chunk of a row (decode: the request's last,
// prefill: the one that starts at key 0), by fold_sink2 (attention/state.cuh).
#pragma once

#include "primitives/types.cuh"

namespace flashkv {

struct VariantRow {
  int batch;   // request index
  int q_row;   // the query's row in the call's q tensor (decode: batch; prefill: qo_indptr + i)
  int qo_idx;  // query row within the request (decode: 0)
  int qo_len;
  int kv_len;
  int qo_head;
  int kv_head;
  __device__ __forceinline__ int q_pos() const { return kv_len - qo_len + qo_idx; }
};

struct VariantKey {
  int batch;
  int kv_idx;  // position of the key within the request
  int kv_len;
  int kv_head;
};

struct VariantPosition {
  int batch;
  int qo_idx;
  int kv_idx;
  int qo_len;
  int kv_len;
  int qo_head;
  int kv_head;
  __device__ __forceinline__ int q_pos() const { return kv_len - qo_len + qo_idx; }
};

// Every hook left out; the plain attention the kernels run without a variant.
struct DefaultVariant {
  struct Args {};
};

// ---- compile-time detection of the optional hooks (C++17 SFINAE: NVRTC compiles -std=c++17) ----
namespace variant_detail {
template <class...>
using void_t = void;
template <class T>
__device__ T&& fake();  // never defined: only in unevaluated contexts

template <class V, class = void>
struct has_logits_transform {
  static constexpr bool value = false;
};
template <class V>
struct has_logits_transform<
    V, void_t<decltype(V::logits_transform(fake<const typename V::Args&>(),
                                           fake<const VariantPosition&>(), 0.f))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct has_logits_mask {
  static constexpr bool value = false;
};
template <class V>
struct has_logits_mask<V, void_t<decltype(V::logits_mask(fake<const typename V::Args&>(),
                                                         fake<const VariantPosition&>()))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct has_first_visible_key {
  static constexpr bool value = false;
};
template <class V>
struct has_first_visible_key<V, void_t<decltype(V::first_visible_key(
                                    fake<const typename V::Args&>(), fake<const VariantRow&>()))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct has_query_transform {
  static constexpr bool value = false;
};
template <class V>
struct has_query_transform<V, void_t<decltype(V::query_transform(
                                  fake<const typename V::Args&>(), fake<const VariantRow&>(), 0,
                                  fake<float&>(), fake<float&>()))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct has_key_transform {
  static constexpr bool value = false;
};
template <class V>
struct has_key_transform<
    V, void_t<decltype(V::key_transform(fake<const typename V::Args&>(), fake<const VariantKey&>(),
                                        0, fake<float&>(), fake<float&>()))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct has_key_rope {
  static constexpr bool value = false;
};
template <class V>
struct has_key_rope<V, void_t<decltype(V::rope_freq(fake<const typename V::Args&>(), 0)),
                              decltype(V::key_rope_pos(fake<const typename V::Args&>(),
                                                       fake<const VariantKey&>()))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct has_value_transform {
  static constexpr bool value = false;
};
template <class V>
struct has_value_transform<
    V, void_t<decltype(V::value_transform(fake<const typename V::Args&>(),
                                          fake<const VariantKey&>(), 0, 0.f))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct has_sink {
  static constexpr bool value = false;
};
template <class V>
struct has_sink<V, void_t<decltype(V::sink(fake<const typename V::Args&>(), 0))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct has_output_transform {
  static constexpr bool value = false;
};
template <class V>
struct has_output_transform<
    V, void_t<decltype(V::output_transform(fake<const typename V::Args&>(),
                                           fake<const VariantRow&>(), 0, 0.f))>> {
  static constexpr bool value = true;
};
template <class V, class = void>
struct use_softmax {
  static constexpr bool value = true;
};
template <class V>
struct use_softmax<V, void_t<decltype(V::kUseSoftmax)>> {
  static constexpr bool value = V::kUseSoftmax;
};
}  // namespace variant_detail

// What a kernel asks of a variant type V.
template <class V>
struct VariantTraits {
  using Args = typename V::Args;
  static constexpr bool kUseSoftmax = variant_detail::use_softmax<V>::value;
  static constexpr bool kLogitsTransform = variant_detail::has_logits_transform<V>::value;
  static constexpr bool kLogitsMask = variant_detail::has_logits_mask<V>::value;
  static constexpr bool kFirstVisibleKey = variant_detail::has_first_visible_key<V>::value;
  static constexpr bool kQueryTransform = variant_detail::has_query_transform<V>::value;
  static constexpr bool kKeyRope = variant_detail::has_key_rope<V>::value;
  static constexpr bool kKeyTransform = variant_detail::has_key_transform<V>::value && !kKeyRope;
  static constexpr bool kValueTransform = variant_detail::has_value_transform<V>::value;
  static constexpr bool kKVTransform = kKeyRope || kKeyTransform || kValueTransform;
  static constexpr bool kSink = variant_detail::has_sink<V>::value;
  static constexpr bool kOutputTransform = variant_detail::has_output_transform<V>::value;
  // Whether the kernel needs the positions of each logit at all.
  static constexpr bool kPerLogit = kLogitsTransform || kLogitsMask;
  static_assert(kUseSoftmax || kLogitsTransform,
                "a variant without softmax (kUseSoftmax = false) must define logits_transform: "
                "it returns each key's weight");
  static_assert(kUseSoftmax || !kSink,
                "sinks join a softmax denominator: kUseSoftmax must be true");

  // What the kernel multiplies q·k by before variant_score(): with no logits transform the
  // base-2 conversion folds into the scale (one multiply per logit, as without variants).
  __device__ __forceinline__ static float dot_scale(float sm_scale_log2) {
    return kLogitsTransform ? sm_scale_log2 * (1.f / kLog2e) : sm_scale_log2;
  }

  // A key's score from `scaled_dot` = q·k * dot_scale(): the base-2 logit (softmax; -inf when
  // dropped) or the weight (no softmax; 0 when dropped). `valid`: the key exists (inside the
  // work item's chunk); a key outside it is dropped without calling any hook.
  __device__ __forceinline__ static float score(const Args& a, const VariantPosition& pos,
                                                float scaled_dot, bool valid) {
    bool keep = valid;
    if constexpr (kLogitsMask) keep = keep && V::logits_mask(a, pos);
    float x = scaled_dot;
    if constexpr (kLogitsTransform) {
      // Only for kept keys: a variant may index per-key arrays by pos.kv_idx, and the kernels'
      // tiles run past a chunk's last key.
      x = keep ? V::logits_transform(a, pos, scaled_dot) : 0.f;
      if constexpr (kUseSoftmax) x *= kLog2e;
    }
    if constexpr (kUseSoftmax) return keep ? x : neg_inf();
    return keep ? x : 0.f;
  }

  // The sink of head `qo_head` in base 2 (softmax only; -inf without sinks).
  __device__ __forceinline__ static float sink2(const Args& a, int qo_head) {
    if constexpr (kSink) return V::sink(a, qo_head) * kLog2e;
    return neg_inf();
  }
};

}  // namespace flashkv
