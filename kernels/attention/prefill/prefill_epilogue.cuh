// The prefill kernel's epilogue: normalize each row's state and write it to the output (tile not
// split) or to the work item's partial-state slot; merge the warps of a CTA that split a KV tile
// between them; and the fused ⊕ merge of split tiles, run by the CTA that writes a tile's last
// partial state (no CTA ever waits for another, counters self-reset so graph replays work).
// The variant's sink, output transform and no-softmax sums (prefill_variant.cuh) act here. C is a
// PrefillWithVariant config.
//
// Without softmax (sigmoid) rows are plain sums: outputs are written unnormalized and a partial
// state carries lse 0, so ⊕ of a tile's n partial states averages them and the merge multiplies
// by n = 2^lse2 to recover the sum (as decode_merge_tile does).
#pragma once

#include "attention/prefill/prefill_mainloop.cuh"
#include "attention/prefill/prefill_params.cuh"
#include "attention/prefill/prefill_variant.cuh"
#include "attention/merge/split_merge.cuh"
#include "primitives/named_barrier.cuh"

namespace flashkv {

// Where tile row `row` of work item w goes: the output row (token q_start + row / group, head
// kv_head * group + row % group) when the tile is not split, else the item's partial slot. Found
// once per row (an integer division by the group), then used for every column.
template <class C>
struct PrefillRowDst {
  typename C::o_t* out;  // the output row, or nullptr (split tile)
  float* partial;        // the partial-state row, or nullptr
  float* lse;            // the row's lse (natural log for out, base 2 for partial), or nullptr
};

template <class C>
__device__ __forceinline__ PrefillRowDst<C> prefill_row_dst(const PrefillParams& p,
                                                            const PrefillWorkItem& w, int row) {
  PrefillRowDst<C> d;
  if (w.slot < 0) {
    const long long tok = w.q_base + w.q_start + row / p.group;
    const int head = w.kv_head * p.group + row % p.group;
    d.out =
        static_cast<typename C::o_t*>(p.out) + tok * p.o_stride_n + (long long)head * p.o_stride_h;
    d.partial = nullptr;
    d.lse = p.lse != nullptr ? p.lse + tok * p.lse_stride_n + head : nullptr;
  } else {
    const long long r = (long long)w.slot * C::kRows + row;
    d.out = nullptr;
    d.partial = p.plan.partial_o + r * C::kHeadDim;
    d.lse = p.plan.partial_lse + r;
  }
  return d;
}

// Writes N (2, 4 or 8) normalized elements [col, col + N) of a row, and (write_lse) its base-2
// LSE, converted to natural log for the output.
template <class C, int N>
__device__ __forceinline__ void prefill_store(const PrefillRowDst<C>& d, int col,
                                              const float (&v)[N], float lse2, bool write_lse) {
  if (d.out != nullptr) {
    u32 packed[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) packed[i] = pack2<typename C::o_t>(v[2 * i], v[2 * i + 1]);
    if constexpr (N == 8) {
      *reinterpret_cast<uint4*>(d.out + col) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
    } else if constexpr (N == 4) {
      *reinterpret_cast<uint2*>(d.out + col) = make_uint2(packed[0], packed[1]);
    } else {
      *reinterpret_cast<u32*>(d.out + col) = packed[0];
    }
    if (C::Traits::kUseSoftmax && d.lse != nullptr && write_lse) *d.lse = lse2 * kLn2;
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      *reinterpret_cast<float2*>(d.partial + col + 2 * i) = make_float2(v[2 * i], v[2 * i + 1]);
    if (write_lse) *d.lse = lse2;
  }
}

// One warp owns its rows' whole KV tile (kWarpsKV == 1): write straight from the fragments.
template <class C>
__device__ __forceinline__ void prefill_write_warp(const PrefillParams& p, const PrefillWorkItem& w,
                                                   const PrefillWarpState<C>& st, int wq,
                                                   int valid_rows) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < C::kRowTiles; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float d = softmax_quad_sum(st.d[r][h]);
      const int row = wq * C::kWarpRows + r * 16 + lane / 4 + 8 * h;
      if (row >= valid_rows) continue;
      float inv = 1.f, lse2 = 0.f;  // no softmax: unnormalized sums, partial lse 0
      if constexpr (C::Traits::kUseSoftmax) {
        float m = st.m[r][h];
        const float f = prefill_fold_sink<C>(p, w, row, m, d);
        // softmax_inv(d, f) and softmax_lse2(m, d) (attention/state.cuh), written out: as calls
        // they change the machine code of the kernels with sinks.
        inv = d > 0.f ? f / d : 0.f;
        lse2 = d > 0.f ? m + log2f(d) : neg_inf();
      }
      const PrefillRowDst<C> dst = prefill_row_dst<C>(p, w, row);
      // fp8 values are dequantized here: o times the value scale.
      if constexpr (is_fp8<typename C::kv_mem_t>()) inv *= kv_scale_v(p.scale, w.kv_head);
      if constexpr (is_fp8<typename C::kv_t>()) {
        // fp8 fragments (the mma.sync kernel): n-tiles 2ch / 2ch + 1 hold chunk ch's even / odd
        // columns, so this thread's are 16ch + 4(lane%4) + {0, 1, 2, 3}.
#pragma unroll
        for (int ch = 0; ch < C::kDTiles / 2; ++ch) {
          const int col = ch * 16 + 4 * (lane % 4);
          float v[4] = {st.o[r][2 * ch][2 * h] * inv, st.o[r][2 * ch + 1][2 * h] * inv,
                        st.o[r][2 * ch][2 * h + 1] * inv, st.o[r][2 * ch + 1][2 * h + 1] * inv};
          prefill_output_transform<C, 4>(p, w, row, col, dst.out != nullptr, v);
          prefill_store<C, 4>(dst, col, v, lse2, ch == 0 && lane % 4 == 0);
        }
        continue;
      } else {
#pragma unroll
        for (int n = 0; n < C::kDTiles; ++n) {
          const int col = n * 8 + 2 * (lane % 4);
          float v[2] = {st.o[r][n][2 * h] * inv, st.o[r][n][2 * h + 1] * inv};
          prefill_output_transform<C, 2>(p, w, row, col, dst.out != nullptr, v);
          prefill_store<C, 2>(dst, col, v, lse2, n == 0 && lane % 4 == 0);
        }
      }
    }
}

// The kWarpsKV warps of a row tile split each KV tile: ⊕ their states through shared memory
// (`scratch`, the KV stages, free by now), then write rows < valid_rows with 16-byte stores.
template <class C>
__device__ __forceinline__ void prefill_merge_warps(const PrefillParams& p,
                                                    const PrefillWorkItem& w,
                                                    const PrefillWarpState<C>& st, int valid_rows,
                                                    unsigned char* scratch) {
  static_assert(C::kRowTiles == 1, "warps that split KV tiles own one row tile");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* o_sm = reinterpret_cast<float*>(scratch);     // [kWarps][16][kHeadDim]
  float* md_sm = o_sm + C::kWarps * 16 * C::kHeadDim;  // [kWarps][16][2]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane / 4 + 8 * h;
    const float d = softmax_quad_sum(st.d[0][h]);
    if (lane % 4 == 0) {
      md_sm[(warp * 16 + r) * 2] = st.m[0][h];
      md_sm[(warp * 16 + r) * 2 + 1] = d;
    }
    if constexpr (is_fp8<typename C::kv_t>()) {  // columns in order (prefill_write_warp)
#pragma unroll
      for (int ch = 0; ch < C::kDTiles / 2; ++ch) {
        float* dst = o_sm + (warp * 16 + r) * C::kHeadDim + ch * 16 + 4 * (lane % 4);
        *reinterpret_cast<float4*>(dst) =
            make_float4(st.o[0][2 * ch][2 * h], st.o[0][2 * ch + 1][2 * h],
                        st.o[0][2 * ch][2 * h + 1], st.o[0][2 * ch + 1][2 * h + 1]);
      }
    } else {
#pragma unroll
      for (int n = 0; n < C::kDTiles; ++n) {
        float* dst = o_sm + (warp * 16 + r) * C::kHeadDim + n * 8 + 2 * (lane % 4);
        *reinterpret_cast<float2*>(dst) = make_float2(st.o[0][n][2 * h], st.o[0][n][2 * h + 1]);
      }
    }
  }
  __syncthreads();
  constexpr int kRowVecs = C::kHeadDim / 8;
  for (int idx = threadIdx.x; idx < valid_rows * kRowVecs; idx += C::kThreads) {
    const int row = idx / kRowVecs, col = (idx % kRowVecs) * 8;
    const int wq = row / 16, r = row % 16;
    float mm = neg_inf();
#pragma unroll
    for (int wk = 0; wk < C::kWarpsKV; ++wk)
      mm = fmaxf(mm, md_sm[((wq * C::kWarpsKV + wk) * 16 + r) * 2]);
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float dd = 0.f;
    const PrefillRowDst<C> dst = prefill_row_dst<C>(p, w, row);
    if constexpr (!C::Traits::kUseSoftmax) {  // plain sums over the warps; partial lse 0
#pragma unroll
      for (int wk = 0; wk < C::kWarpsKV; ++wk) {
        const float* src = o_sm + ((wq * C::kWarpsKV + wk) * 16 + r) * C::kHeadDim + col;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += src[e];
      }
      if constexpr (is_fp8<typename C::kv_mem_t>()) {  // the values' dequantization
        const float vs = kv_scale_v(p.scale, w.kv_head);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] *= vs;
      }
      prefill_output_transform<C, 8>(p, w, row, col, dst.out != nullptr, acc);
      prefill_store<C, 8>(dst, col, acc, 0.f, col == 0);
      continue;
    }
    if (mm != neg_inf()) {
#pragma unroll
      for (int wk = 0; wk < C::kWarpsKV; ++wk) {
        const int wi = (wq * C::kWarpsKV + wk) * 16 + r;
        const float sc = softmax_merge_scale(md_sm[wi * 2], mm);
        dd += sc * md_sm[wi * 2 + 1];
        const float* src = o_sm + wi * C::kHeadDim + col;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += sc * src[e];
      }
    }
    const float f = prefill_fold_sink<C>(p, w, row, mm, dd);  // once, after the warps' ⊕
    float inv = softmax_inv(dd, f);
    if constexpr (is_fp8<typename C::kv_mem_t>()) inv *= kv_scale_v(p.scale, w.kv_head);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= inv;
    prefill_output_transform<C, 8>(p, w, row, col, dst.out != nullptr, acc);
    prefill_store<C, 8>(dst, col, acc, softmax_lse2(mm, dd), col == 0);
  }
}

// The merge stage of one split query tile: ⊕ of its partial states in KV order, to the output.
template <class C>
__device__ __forceinline__ void prefill_merge_tile(const PrefillParams& p,
                                                   const PrefillMergeItem& item) {
  constexpr int kRowVecs = C::kHeadDim / 4;
  const int rows = (item.q_end - item.q_start) * p.group;
  // Written as an unsplit item of the same tile would be.
  PrefillWorkItem out_item{};
  out_item.request = item.request;
  out_item.kv_head = item.kv_head;
  out_item.q_start = item.q_start;
  out_item.q_base = item.q_base;
  out_item.qo_len = item.qo_len;
  out_item.kv_len = item.kv_len;
  out_item.slot = -1;
  for (int v = threadIdx.x; v < rows * kRowVecs; v += C::kThreads) {
    const int row = v / kRowVecs, col = (v % kRowVecs) * 4;
    float acc[4];
    const float lse2 = merge_split_slots4(
        p.plan.partial_o + (long long)row * C::kHeadDim + col, (long long)C::kRows * C::kHeadDim,
        p.plan.partial_lse + row, C::kRows, item.slot_begin, item.slot_end, acc);
    if constexpr (!C::Traits::kUseSoftmax) {  // ⊕ averaged the sums (all lse 0): times 2^lse2 = n
      const float n = lse2 == neg_inf() ? 0.f : exp2f(lse2);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] *= n;
    }
    prefill_output_transform<C, 4>(p, out_item, row, col, true, acc);
    prefill_store<C, 4>(prefill_row_dst<C>(p, out_item, row), col, acc, lse2, col == 0);
  }
}

// After a CTA wrote a partial state of a split tile: count it; the last one merges the tile.
// Every one of the kernel's C::kThreads compute threads (a warp-specialized kernel's producer
// warps take no part: barrier 1 of C::kThreads, not __syncthreads).
template <class C>
__device__ __forceinline__ void prefill_arrive(const PrefillParams& p, const PrefillWorkItem& w) {
  __shared__ int is_last;
  __threadfence();  // this CTA's partial-state writes are visible GPU-wide before it is counted
  named_barrier(1, C::kThreads);
  if (threadIdx.x == 0) {
    const PrefillMergeItem item = prefill_merge_items(p.plan)[w.merge];
    const int arrived = atomicAdd(p.plan.merge_arrivals + w.merge, 1) + 1;
    is_last = arrived == item.slot_end - item.slot_begin;
  }
  named_barrier(1, C::kThreads);
  if (is_last) {
    __threadfence();  // acquire: see the other CTAs' partial states
    const PrefillMergeItem item = prefill_merge_items(p.plan)[w.merge];
    prefill_merge_tile<C>(p, item);
    if (threadIdx.x == 0) p.plan.merge_arrivals[w.merge] = 0;  // ready for the next run / replay
  }
  named_barrier(1, C::kThreads);  // is_last is rewritten by the next arrival
}

}  // namespace flashkv
