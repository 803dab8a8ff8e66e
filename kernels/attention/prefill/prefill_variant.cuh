// The prefill kernel's attention-variant hooks (kernels/variants/variant.cuh): the kernel config
// with its variant, the variant's view of a query-tile row, and the score/softmax step that runs
// when a variant transforms or masks logits. Without such hooks the kernel keeps the plain
// prefill_softmax of prefill_mainloop.cuh (the scale folded into one FFMA per logit), so plain
// attention pays nothing for variants.
#pragma once

#include "attention/prefill/prefill_mainloop.cuh"
#include "attention/prefill/prefill_params.cuh"
#include "attention/state.cuh"
#include "variants/variant_smem.cuh"

namespace flashkv {

// A kernel config C (PrefillConfig, prefill.cuh) with the attention variant V the kernel runs.
template <class C, class V>
struct PrefillWithVariant : C {
  using Variant = V;
  using Traits = VariantTraits<V>;
};

// The variant's view of row `row` of work item w's query tile: token q_start + row / group,
// query head kv_head * group + row % group.
__device__ __forceinline__ VariantRow prefill_variant_row(const PrefillParams& p,
                                                          const PrefillWorkItem& w, int row) {
  const int qo_idx = w.q_start + row / p.group;
  return VariantRow{w.request, w.q_base + qo_idx, qo_idx,
                    w.qo_len,  w.kv_len,          w.kv_head * p.group + row % p.group,
                    w.kv_head};
}

// Applies the variant's output transform (when it has one) to N elements [col, col + N) of a row
// bound for the final output; partial states of a split tile are transformed after their merge.
template <class C, int N>
__device__ __forceinline__ void prefill_output_transform(const PrefillParams& p,
                                                         const PrefillWorkItem& w, int row, int col,
                                                         bool final_output, float (&v)[N]) {
  if constexpr (C::Traits::kOutputTransform) {
    if (!final_output) return;
    const VariantRow vr = prefill_variant_row(p, w, row);
    const auto& va = variant_args<typename C::Variant>(p.variant);
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = C::Variant::output_transform(va, vr, col + e, v[e]);
  }
}

// The (query token, query head) of each of this thread's rows, for the per-logit hooks.
template <class C>
struct PrefillRowPos {
  int qo_idx[C::kRowTiles][2];
  int qo_head[C::kRowTiles][2];
};

// The online-softmax step of prefill_softmax (prefill_mainloop.cuh) for a variant with logits
// hooks: each logit becomes Tr::score() of its position (already base 2 with softmax, or the
// weight without), so the update runs on scores with no scale. Without softmax P is the weights
// themselves: no running max, no rescale. pos0, lim, kMask, pa, kRescaleO and rescale as in
// prefill_softmax.
template <class C, bool kMask, bool kRescaleO = true>
__device__ __forceinline__ void prefill_softmax_variant(
    const PrefillParams& p, const PrefillWorkItem& w, PrefillWarpState<C>& st,
    float (&s)[C::kRowTiles][C::kNT][4], int pos0, const int (&lim)[C::kRowTiles][2],
    const PrefillRowPos<C>& rp, u32 (&pa)[C::kRowTiles][C::kNT / 2][4], float sm_scale_log2,
    float (*rescale)[2] = nullptr) {
  typedef typename C::Traits Tr;
  const auto& va = variant_args<typename C::Variant>(p.variant);
  const float dot_scale = Tr::dot_scale(sm_scale_log2);
#pragma unroll
  for (int r = 0; r < C::kRowTiles; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = neg_inf();
#pragma unroll
      for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int kv_idx = pos0 + nt * 8 + e;
          const VariantPosition pos{w.request, rp.qo_idx[r][h],  kv_idx,   w.qo_len,
                                    w.kv_len,  rp.qo_head[r][h], w.kv_head};
          float& x = s[r][nt][h * 2 + e];
          x = Tr::score(va, pos, x * dot_scale, !kMask || kv_idx <= lim[r][h]);
          mx = fmaxf(mx, x);
        }
      float f = 1.f;
      if constexpr (Tr::kUseSoftmax)
        f = prefill_online_update<C, kRescaleO>(st, s, r, h, mx, 1.f);  // scores: base 2
      // Without softmax the scores are the weights: no m, no d, plain sums.
      if constexpr (!kRescaleO) rescale[r][h] = f;
    }
    prefill_pack_p<C>(s, r, pa);
  }
}

// A row's final state (m, d quad-reduced; o this thread's part) -> the factor o is multiplied by
// before normalizing: the sink joins the denominator of its tile's first chunk, once (an unsplit
// tile's only chunk; of a split tile the one in the merge item's first slot: with a sliding window
// the first chunk need not start at key 0). Updates m and d; 1 when the variant has no sinks or
// the chunk is not the first.
template <class C>
__device__ __forceinline__ float prefill_fold_sink(const PrefillParams& p, const PrefillWorkItem& w,
                                                   int row, float& m, float& d) {
  if constexpr (C::Traits::kSink) {
    if (w.slot < 0 || prefill_merge_items(p.plan)[w.merge].slot_begin == w.slot) {
      const auto& va = variant_args<typename C::Variant>(p.variant);
      return fold_sink2(C::Traits::sink2(va, w.kv_head * p.group + row % p.group), m, d);
    }
  }
  return 1.f;
}

}  // namespace flashkv
