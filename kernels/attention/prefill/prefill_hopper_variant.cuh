// Attention variants on the Hopper prefill kernel (prefill_hopper_ws.cuh): the per-warp parts the
// consumer warpgroups run on top of the plain kernel. The logits hooks run in the softmax step on
// wgmma's accumulator (the mma.sync C-fragment layout, so prefill_softmax_variant applies as it
// is); the sink and the output transform in the shared epilogue; the query transform on the
// staged query tile, each warpgroup on its own 64 rows; a first_visible_key bound (sliding window)
// makes producer and consumers skip the item's KV tiles left of every row's window, so a window
// costs the keys it sees. Key / value transforms (fused RoPE on K) rewrite every KV stage that
// both warpgroups read and stay on the mma.sync kernel (kPrefillHopperRuns).
#pragma once

#include "attention/prefill/prefill_params.cuh"
#include "attention/prefill/prefill_hopper.cuh"
#include "attention/prefill/prefill_variant.cuh"
#include "primitives/named_barrier.cuh"
#include "primitives/wgmma.cuh"
#include "variants/builtin.cuh"

namespace flashkv {

// The variants the Hopper kernel runs: all but those that rewrite staged keys or values.
template <class Tr>
constexpr bool kPrefillHopperRuns = !Tr::kKVTransform;

// The flags of a built-in variant (builtin.cuh); -1 for any other type.
template <class V>
struct BuiltinFlagsOf {
  static constexpr int value = -1;
};
template <int F>
struct BuiltinFlagsOf<BuiltinVariant<F>> {
  static constexpr int value = F;
};

// A built-in whose mask is the sliding window alone: per row a key range [q_pos - window_left,
// q_pos + window_right], which the kernel applies as it applies the causal limit (two compares on
// the tiles a range cuts, nothing on the tiles inside every row's range) instead of calling the
// mask hook per logit (ALiBi-like cost, 1.2x, on every tile).
template <class V>
constexpr bool kWindowIsKeyRange = BuiltinFlagsOf<V>::value >= 0 &&
                                   (BuiltinFlagsOf<V>::value & kVariantWindow) != 0 &&
                                   (BuiltinFlagsOf<V>::value & kVariantCustomMask) == 0;

// Whether the Hopper kernel runs a variant's per-logit hooks in its softmax: a logits transform,
// or a mask that is not a key range. (With a transform the window stays in the hook.)
template <class C>
constexpr bool kPrefillHopperPerLogit = C::Traits::kLogitsTransform ||
                                        (C::Traits::kLogitsMask &&
                                         !kWindowIsKeyRange<typename C::Variant>);

// Folds a window-only built-in's key range into the rows (kWindowIsKeyRange, no logits
// transform): lim[h] down to q_pos + window_right, lo[h] up to q_pos - window_left, and the warp's
// extremes over its real rows.
template <class C>
__device__ __forceinline__ void prefill_hopper_window_rows(const PrefillParams& p,
                                                           const PrefillWorkItem& w,
                                                           PrefillHopperRows& r) {
  if constexpr (kWindowIsKeyRange<typename C::Variant> && !kPrefillHopperPerLogit<C>) {
    const BuiltinVariantArgs& a = variant_args<typename C::Variant>(p.variant);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int lo_max = 0, hi_min = 0x7fffffff;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + lane / 4 + 8 * h;
      if (row >= r.valid_rows) continue;                     // lim -1: no key either way
      const int q_pos = w.diag + w.q_start + row / p.group;  // kv_len - qo_len + qo_idx
      if (a.window_right >= 0) r.lim[0][h] = min(r.lim[0][h], q_pos + a.window_right);
      if (a.window_left >= 0) r.lo[0][h] = max(0, q_pos - a.window_left);
      lo_max = max(lo_max, r.lo[0][h]);
      hi_min = min(hi_min, r.lim[0][h]);
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) {
      lo_max = max(lo_max, __shfl_xor_sync(0xffffffffu, lo_max, off));
      hi_min = min(hi_min, __shfl_xor_sync(0xffffffffu, hi_min, off));
    }
    r.warp_lo_max = lo_max;
    r.warp_min = min(r.warp_min, hi_min);
  }
}

// The per-logit hooks' view of this thread's two rows (warp w owns rows [16 w, 16 w + 16) of the
// 128-row tile). Padding rows (>= valid_rows) score as the last real row, so no hook sees a query
// outside the request; they are never written.
template <class C>
__device__ __forceinline__ PrefillRowPos<C> prefill_hopper_row_pos(const PrefillParams& p,
                                                                   const PrefillWorkItem& w) {
  PrefillRowPos<C> rp{};
  if constexpr (kPrefillHopperPerLogit<C>) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int valid_rows = (w.q_end - w.q_start) * p.group;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(warp * 16 + lane / 4 + 8 * h, max(valid_rows - 1, 0));
      const VariantRow vr = prefill_variant_row(p, w, row);
      rp.qo_idx[0][h] = vr.qo_idx;
      rp.qo_head[0][h] = vr.qo_head;
    }
  }
  return rp;
}

// The first of the item's `tiles` KV tiles that any of its rows may see, by the variant's
// first_visible_key (0 without one). A whole warp calls it; every lane gets the same value, and
// the producer and the consumers compute it alike, so they agree on the tiles they hand over.
template <class C>
__device__ __forceinline__ int prefill_hopper_first_tile(const PrefillParams& p,
                                                         const PrefillWorkItem& w, int tiles) {
  if constexpr (!C::Traits::kFirstVisibleKey) {
    return 0;
  } else {
    typedef typename C::Variant Var;
    const int valid_rows = (w.q_end - w.q_start) * p.group;
    int lo = 0x7fffffff;
    for (int row = threadIdx.x % 32; row < valid_rows; row += 32)
      lo = min(
          lo, Var::first_visible_key(variant_args<Var>(p.variant), prefill_variant_row(p, w, row)));
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, off));
    if (lo == 0x7fffffff || lo <= w.kv_start) return 0;
    return min(tiles, (lo - w.kv_start) / C::kTile);
  }
}

// Named barriers 4 and 5: warpgroup w's 128 threads after its query transform (0: __syncthreads,
// 1: prefill_arrive, 2 and 3: the ping-pong).
constexpr int kQueryTransformBarrier = 4;

// The variant's query transform on warpgroup wg's rows of the staged query tile (q_buf, landed),
// in place, then made visible to the warpgroup's wgmma (generic writes, async-proxy reads).
template <class C>
__device__ __forceinline__ void prefill_hopper_transform_q(const PrefillParams& p,
                                                           const PrefillWorkItem& w, u32 q_buf,
                                                           int wg) {
  if constexpr (C::Traits::kQueryTransform) {
    typedef typename C::Variant Var;
    typedef typename C::q_t T;
    constexpr int kHalf = C::kHeadDim / 2;
    const int valid_rows = (w.q_end - w.q_start) * p.group;
    const int rows = min(64, valid_rows - 64 * wg);  // this warpgroup's real rows
    unsigned char* base = static_cast<unsigned char*>(__cvta_shared_to_generic(q_buf));
    const auto& va = variant_args<Var>(p.variant);
    for (int idx = threadIdx.x % 128; idx < rows * kHalf; idx += 128) {
      const int r = 64 * wg + idx / kHalf, i = idx % kHalf;
      T* p1 = reinterpret_cast<T*>(base + C::template smem_offset<C::kRows>(r, i / 8)) + i % 8;
      T* p2 = reinterpret_cast<T*>(base + C::template smem_offset<C::kRows>(r, (i + kHalf) / 8)) +
              (i + kHalf) % 8;
      float x1 = to_float(*p1), x2 = to_float(*p2);
      Var::query_transform(va, prefill_variant_row(p, w, r), i, x1, x2);
      *p1 = from_float<T>(x1);
      *p2 = from_float<T>(x2);
    }
    fence_proxy_async_shared();
    named_barrier(kQueryTransformBarrier + wg, 128);
  }
}

}  // namespace flashkv
