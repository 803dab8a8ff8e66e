// Batch decode on tensor cores: the query rows of a GQA group (padded to 16) are the A operand
// of mma.sync m16n8k16, so S = Q·Kᵀ and O += P·V each cost a few MMAs per 16 KV tokens instead
// of ~30 CUDA-core instructions per (token, head) and lane. Same plan, work items, pipeline and
// epilogue as the CUDA-core kernel (decode.cuh); measured on the H200, the CUDA-core kernel was
// issue-bound at 46-50% (GQA-4) and 73-89% (MHA) of the read ceiling.
//
// CTA: kWarps warps. A KV tile of kTile = 16 * kWarps tokens per pipeline stage; warp w takes
// tokens [16w, 16w + 16) of every tile and keeps its own online-softmax state for all query rows;
// the warps' states are merged (⊕) through shared memory at the end of the work item.
// Shared memory rows are 16-byte chunks XOR-swizzled by row (swizzled_offset), so cp.async
// writes and ldmatrix reads are bank-conflict free.
#pragma once

#include "attention/decode/decode_common.cuh"
#include "attention/decode/decode_prologue.cuh"
#include "attention/decode/decode_shape.cuh"
#include "attention/decode/decode_step.cuh"
#include "attention/fp8_fragments.cuh"
#include "attention/state.cuh"
#include "attention/work_loop.cuh"
#include "attention/work_timeline.cuh"
#include "primitives/cp_async.cuh"
#include "primitives/mma.cuh"
#include "primitives/types.cuh"
#include "variants/variant_smem.cuh"

namespace flashkv {

// STAGES, WARPS: the pipeline depth and warps per CTA; CTAS: the CTAs per SM the grid is sized
// for (0: the defaults; decode_shape.cuh).
// WIDEN_KV: an fp8 cache staged widened to QT (for variants that rewrite the staged keys or
// values: kv/kv_chunk_copy.cuh); kv_t is the staged element type, kv_mem_t the cache's.
template <class QT, class KVT, int HEAD_DIM, int GROUP, int PAGE_SIZE, int STAGES = 0,
          int WARPS = 0, int CTAS = 0, bool WIDEN_KV = false>
struct DecodeTCConfig {
  using q_t = QT;
  using kv_t = typename StagedKV<QT, KVT, WIDEN_KV>::type;
  using kv_mem_t = KVT;
  using o_t = QT;
  static constexpr DecodeTCShape kShape =
      decode_tc_shape(HEAD_DIM, GROUP, STAGES, WARPS, CTAS, (int)sizeof(kv_t));
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kGroup = GROUP;
  static constexpr int kPageSize = PAGE_SIZE;
  static constexpr int kRowTiles = kShape.row_tiles;  // 16-row MMA tiles of query rows
  static constexpr int kWarps = kShape.warps;
  static constexpr int kThreads = kShape.threads;
  static constexpr int kTile = kShape.tile;  // KV tokens per stage
  static constexpr int kStages = kShape.stages;
  static constexpr int kMinCtas = kShape.min_ctas;
  static constexpr int kChunks = HEAD_DIM * (int)sizeof(kv_t) / 16;  // 16-byte chunks per KV row
  static constexpr int kQChunks = HEAD_DIM / 8;                      // and per (16-bit) Q row
  static constexpr int kStageElems = kTile * HEAD_DIM;
  static constexpr int kStageBytes = kStageElems * (int)sizeof(kv_t);
  static constexpr int kLoads = kTile * kChunks / kThreads;  // 16-byte loads per thread per stage
  static constexpr int kQElems = kRowTiles * 16 * HEAD_DIM;
  static constexpr int kSmemBytes = kShape.smem_bytes;  // Q, then kStages of K and of V
  static constexpr int kDTiles = HEAD_DIM / 8;          // n-tiles of the output
  // Stage layout: rows XOR-swizzled by 16-byte chunk, so ldmatrix reads are bank-conflict free.
  __device__ __forceinline__ static u32 chunk_offset(int row, int chunk) {
    return swizzled_offset<kChunks>(row, chunk);
  }

  static_assert(sizeof(QT) == 2 && (sizeof(KVT) == 2 || is_fp8<KVT>()),
                "tensor-core decode takes 16-bit q and 16-bit or fp8 kv");
  static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "head_dim must be 64, 128 or 256");
  static_assert(decode_tc_shape_valid(STAGES, WARPS), "2-8 stages, 2, 4 or 8 warps");
  static_assert(kSmemBytes >= kQElems * 2 + 2 * kStages * kStageBytes, "shape and layout agree");
  // 64 f32 accumulators per thread: more spills to local memory (seen with ptxas: head_dim 256
  // used 255 registers and a 360-byte stack), so larger shapes use the CUDA-core kernel.
  static_assert(decode_tc_supported(HEAD_DIM, GROUP) && kRowTiles * kDTiles * 4 <= 64,
                "output accumulators would not fit in registers");
  static_assert(kWarps * 16 * kRowTiles * (HEAD_DIM + 4 + 2) * 4 <= kSmemBytes - kQElems * 2,
                "the cross-warp merge must fit in the shared memory after Q");
};

// RoPE on the staged query rows (swizzled 16-bit rows in shared memory), pair by pair with the
// cos/sin table of the item's position: the same rope_rotate and one rounding as apply_rope's
// kernel, so the fused step stays bitwise equal to the unfused ops.
template <class C>
__device__ __forceinline__ void decode_tc_rotate_q(const RopeSpec& spec, unsigned char* q_smem,
                                                   const float2* table) {
  typedef typename C::q_t q_t;
  const int half = spec.rotary_dim / 2;
  for (int idx = threadIdx.x; idx < C::kGroup * half; idx += C::kThreads) {
    const int row = idx / half, i = idx % half;
    const int e1 = rope_first(spec, i), e2 = rope_second(spec, i);
    q_t* a = reinterpret_cast<q_t*>(q_smem + swizzled_offset<C::kQChunks>(row, e1 / 8)) + e1 % 8;
    q_t* b = reinterpret_cast<q_t*>(q_smem + swizzled_offset<C::kQChunks>(row, e2 / 8)) + e2 % 8;
    float y1, y2;
    rope_rotate(to_float(*a), to_float(*b), table[i].x, table[i].y, y1, y2);
    *a = from_float<q_t>(y1);
    *b = from_float<q_t>(y2);
  }
}

// fp8 KV: fragments widened in registers, in the column orders of attention/fp8_fragments.cuh.

// S (this warp's 16 tokens) = Q·Kᵀ from fp8 K rows (Q permuted: fp8_permute_q_rows).
template <class C>
__device__ __forceinline__ void decode_tc_scores_fp8(float (&s)[C::kRowTiles][2][4], u32 q_base,
                                                     u32 k_base, int warp, int lane) {
  typedef typename C::q_t mma_t;
  typedef typename C::kv_t kv_t;
  // Matrices: tokens 0-7 / 8-15 of KV chunk 2kp, then of chunk 2kp + 1.
  const int k_row = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
  for (int kp = 0; kp < C::kHeadDim / 32; ++kp) {
    u32 kb[4];
    ldmatrix_x4(kb, k_base + swizzled_offset<C::kChunks>(k_row, 2 * kp + lane / 16));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int ks = 2 * kp + half;  // 16 columns
      u32 b0[2], b1[2];
      fp8_k_fragments<mma_t, kv_t>(kb, half, b0, b1);
#pragma unroll
      for (int r = 0; r < C::kRowTiles; ++r) {
        u32 qa[4];
        const int q_row = r * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        ldmatrix_x4(qa, q_base + swizzled_offset<C::kQChunks>(q_row, 2 * ks + lane / 16));
        mma_m16n8k16<mma_t>(s[r][0], qa, b0);
        mma_m16n8k16<mma_t>(s[r][1], qa, b1);
      }
    }
  }
}

// O += P·V from fp8 V rows (fp8_v_fragments): o's n-tile 2ch holds chunk ch's even columns, 2ch + 1
// its odd ones.
template <class C>
__device__ __forceinline__ void decode_tc_pv_fp8(float (&o)[C::kRowTiles][C::kDTiles][4],
                                                 const u32 (&pa)[C::kRowTiles][4], u32 v_base,
                                                 int warp, int lane) {
  typedef typename C::q_t mma_t;
  typedef typename C::kv_t kv_t;
  const int v_row = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
  for (int jp = 0; jp < C::kHeadDim / 32; ++jp) {
    u32 vb[4];  // tokens 0-7 / 8-15 of chunk 2jp, then of chunk 2jp + 1
    ldmatrix_x4_trans(vb, v_base + swizzled_offset<C::kChunks>(v_row, 2 * jp + lane / 16));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int ch = 2 * jp + half;
      u32 even[2], odd[2];
      fp8_v_fragments<mma_t, kv_t>(vb, half, even, odd);
#pragma unroll
      for (int r = 0; r < C::kRowTiles; ++r) {
        mma_m16n8k16<mma_t>(o[r][2 * ch], pa[r], even);
        mma_m16n8k16<mma_t>(o[r][2 * ch + 1], pa[r], odd);
      }
    }
  }
}

// C: a DecodeWithVariant<DecodeTCConfig, V> (decode_common.cuh).
template <class C>
// timeline: the item's first event in a profiling build (work_timeline.cuh), else unused.
__device__ __forceinline__ void decode_tc_work_item(const DecodeParams& p, const DecodeWorkItem& w,
                                                    unsigned char* smem, int timeline = -1) {
  typedef typename C::kv_t kv_t;
  typedef typename C::q_t mma_t;  // the MMAs' input type (fp8 KV is widened to it)
  typedef typename C::Variant V;
  typedef typename C::Traits Tr;
  const typename V::Args& va = variant_args<V>(p.variant);
  const auto stage_offset = [](int row, int chunk) {
    return swizzled_offset<C::kChunks>(row, chunk);
  };
  const auto q_offset = [](int row, int chunk) { return swizzled_offset<C::kQChunks>(row, chunk); };
  constexpr int R = C::kRowTiles;
  constexpr int DT = C::kDTiles;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  unsigned char* q_smem = smem;
  unsigned char* k_smem = smem + C::kQElems * 2;
  unsigned char* v_smem = k_smem + C::kStages * C::kStageBytes;

  // Per thread: rows lane/4 and lane/4 + 8 of each row tile, the layout of SoftmaxFragState
  // (attention/state.cuh) in plain arrays: in the struct ptxas allocated registers differently.
  float o[R][DT][4];
  float m[R][2], d[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m[r][i] = neg_inf();
      d[r][i] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < DT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[r][n][e] = 0.f;
  }

  // Fused step: the new token's k/v go into the cache before the load of its tile is issued.
  const long long step_pos = decode_step_position(p, w);
  const int append_tile = decode_step_append_tile<C>(p, w, step_pos);

  const int len = w.kv_end - w.kv_start;
  const int num_tiles = (len + C::kTile - 1) / C::kTile;
  DecodeTilePages<C> pages;  // of the next tile to issue
  unsigned bad_pages = 0;    // a page id outside the cache was seen (decode_check_pages)
  decode_prologue<C>(
      p, w, num_tiles, append_tile, step_pos,
      [&](int s, bool is_v) { return (is_v ? v_smem : k_smem) + s * C::kStageBytes; }, pages,
      bad_pages);
  // Fused step with RoPE: cos/sin of the item's position, once per pair, into the last V stage
  // (not loaded before the main loop's first issue, which the barrier below precedes).
  // The main loop fills stage kStages - 1 first, after the barrier that ends the rotation below.
  static_assert(kRopeMaxPairs * sizeof(float2) <= C::kStageBytes, "cos/sin table fits a stage");
  float2* rope_table = reinterpret_cast<float2*>(v_smem + (C::kStages - 1) * C::kStageBytes);
  if (step_pos >= 0) {
    for (int i = threadIdx.x; i < p.step.spec.rotary_dim / 2; i += C::kThreads) {
      rope_cos_sin(p.step.spec, step_pos, i, rope_table[i].x, rope_table[i].y);
    }
  }
  // Stage Q (after the first KV loads are in flight): row r = query head r of the group (rows >=
  // kGroup are zero and never written out).
  for (int ci = threadIdx.x; ci < R * 16 * C::kQChunks; ci += C::kThreads) {
    const int row = ci / C::kQChunks, chunk = ci % C::kQChunks;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < C::kGroup) {
      const int qo_head = w.kv_head * C::kGroup + row;
      val = *reinterpret_cast<const uint4*>(static_cast<const typename C::q_t*>(p.q) +
                                            (long long)w.request * p.q_stride_n +
                                            (long long)qo_head * p.q_stride_h + chunk * 8);
    }
    *reinterpret_cast<uint4*>(q_smem + swizzled_offset<C::kQChunks>(row, chunk)) = val;
  }
  if (step_pos >= 0) {  // rotate the staged rows in place: one thread per (row, pair)
    __syncthreads();
    decode_tc_rotate_q<C>(p.step.spec, q_smem, rope_table);
    __syncthreads();
  }
  if constexpr (Tr::kQueryTransform) {
    __syncthreads();
    variant_transform_q_rows<V, typename C::q_t, C::kHeadDim, C::kThreads>(
        va, q_smem, q_offset, C::kGroup, [&](int r) { return decode_variant_row<C>(w, r); });
    __syncthreads();
  }
  if constexpr (is_fp8<kv_t>()) {  // Q's columns in the order the fp8 K fragments come in
    __syncthreads();
    fp8_permute_q_rows<C::kQChunks, C::kThreads>(q_smem, C::kRowTiles * 16);
    __syncthreads();
  }
  float dot_scale = Tr::dot_scale(p.sm_scale_log2);
  // An fp8 cache's keys are dequantized through the logits: q·(k * s) = (q·k) * s.
  if constexpr (is_fp8<typename C::kv_mem_t>()) dot_scale *= kv_scale_k(p.scale, w.kv_head);

  const u32 q_base = smem_addr(q_smem);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int next = tile + C::kStages - 1;
    const int ns = next % C::kStages;
    if (next < num_tiles) {
      decode_issue_tile<C>(p, w, next, pages, k_smem + ns * C::kStageBytes,
                           v_smem + ns * C::kStageBytes, bad_pages);
    }
    cp_async_commit();
    if (next + 1 < num_tiles) decode_tile_pages<C>(p, w, next + 1, pages);
    cp_async_wait<C::kStages - 1>();
    __syncthreads();
    if (tile == 0 && timeline >= 0) work_timeline_stamp(timeline + 1);
    const int st = tile % C::kStages;
    if constexpr (Tr::kKVTransform) {
      const VariantKey key{w.request, 0, w.kv_len, w.kv_head};
      variant_transform_kv_rows<V, kv_t, C::kHeadDim, C::kThreads>(
          va, key, w.kv_start + tile * C::kTile, min(C::kTile, len - tile * C::kTile),
          k_smem + st * C::kStageBytes, v_smem + st * C::kStageBytes, stage_offset);
      __syncthreads();
    }
    const u32 k_base = smem_addr(k_smem + st * C::kStageBytes);
    const u32 v_base = smem_addr(v_smem + st * C::kStageBytes);

    // S = Q·Kᵀ over this warp's 16 tokens: per row tile, two n-tiles of 8 tokens.
    float s[R][2][4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[r][nt][e] = 0.f;
    if constexpr (is_fp8<kv_t>()) {
      decode_tc_scores_fp8<C>(s, q_base, k_base, warp, lane);
    } else {
#pragma unroll
      for (int ks = 0; ks < C::kHeadDim / 16; ++ks) {
        u32 kb[4];  // (tokens 0-7, k lo), (tokens 0-7, k hi), (tokens 8-15, k lo), (tokens 8-15, k
                    // hi)
        const int k_row = warp * 16 + (lane % 8) + 8 * (lane / 16);
        ldmatrix_x4(kb, k_base + swizzled_offset<C::kChunks>(k_row, 2 * ks + (lane / 8) % 2));
        const u32 b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
#pragma unroll
        for (int r = 0; r < R; ++r) {
          u32 qa[4];
          const int q_row = r * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
          ldmatrix_x4(qa, q_base + swizzled_offset<C::kQChunks>(q_row, 2 * ks + lane / 16));
          mma_m16n8k16<kv_t>(s[r][0], qa, b0);
          mma_m16n8k16<kv_t>(s[r][1], qa, b1);
        }
      }
    }

    // Online softmax (base 2) per row; masked tokens (past the chunk end) get -inf.
    const int t0 = tile * C::kTile + warp * 16 + 2 * (lane % 4);
    u32 pa[R][4];  // P as the A operand of P·V (C-fragment layout of S = A-fragment layout)
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {         // h = 0: row lane/4, h = 1: row lane/4 + 8
        if (r * 16 + 8 * h >= C::kGroup) {  // 8 padding rows (compile time): P = 0, no softmax work
          pa[r][h] = 0u;
          pa[r][h + 2] = 0u;
          continue;
        }
        float x[4];
        // Padding rows (>= kGroup) score as head kGroup - 1; they are never written out.
        const int qo_head = w.kv_head * C::kGroup + min(r * 16 + lane / 4 + 8 * h, C::kGroup - 1);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int t = t0 + nt * 8 + e;
            const VariantPosition pos{w.request, 0,       w.kv_start + t, 1,
                                      w.kv_len,  qo_head, w.kv_head};
            x[nt * 2 + e] = Tr::score(va, pos, s[r][nt][h * 2 + e] * dot_scale, t < len);
          }
        if constexpr (!Tr::kUseSoftmax) {  // x are the weights: no running max, no rescale
          pa[r][h] = pack2<mma_t>(x[0], x[1]);
          pa[r][h + 2] = pack2<mma_t>(x[2], x[3]);
          continue;
        }
        const float mx = softmax_quad_max(fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3])));
        const SoftmaxStep step = softmax_step(m[r][h], mx);
        m[r][h] = step.m;
        float pr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) pr[i] = softmax_p(x[i], step.m_exp);
        // quad-partial sum
        d[r][h] = softmax_d(d[r][h], step.scale, pr[0] + pr[1] + pr[2] + pr[3]);
        softmax_rescale_rows(o[r], h, step.scale);
        pa[r][h] = pack2<mma_t>(pr[0], pr[1]);      // k = tokens 2(lane%4) + {0,1}
        pa[r][h + 2] = pack2<mma_t>(pr[2], pr[3]);  // k = tokens 8 + 2(lane%4) + {0,1}
      }
    }

    // O += P·V: V rows are tokens, so ldmatrix.trans yields the B fragments.
    if constexpr (is_fp8<kv_t>()) {
      decode_tc_pv_fp8<C>(o, pa, v_base, warp, lane);
    } else {
#pragma unroll
      for (int j = 0; j < C::kHeadDim / 16; ++j) {
        u32 vb[4];  // (tok 0-7, dims lo), (tok 8-15, dims lo), (tok 0-7, dims hi), (tok 8-15, dims
                    // hi)
        const int v_row = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        ldmatrix_x4_trans(vb, v_base + swizzled_offset<C::kChunks>(v_row, 2 * j + lane / 16));
        const u32 b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
#pragma unroll
        for (int r = 0; r < R; ++r) {
          mma_m16n8k16<kv_t>(o[r][2 * j], pa[r], b0);
          mma_m16n8k16<kv_t>(o[r][2 * j + 1], pa[r], b1);
        }
      }
    }
    __syncthreads();  // this stage is refilled by a later iteration
  }
  decode_check_pages<C>(p, w, bad_pages);
  if (timeline >= 0) work_timeline_stamp(timeline + 2);

  // Merge the warps' states (⊕) through shared memory, then write rows < kGroup. Only real rows
  // (< kGroup) are staged: padding rows are zeros no one reads, and staging them was most of the
  // epilogue's shared-memory traffic (16 rows per warp for GQA-4's 4, MHA's 1).
  // Rows padded by 4 floats: the 8 rows a warp's float2 stores hit per column pair fall on
  // distinct banks (a row stride of kHeadDim floats put them all on one).
  constexpr int kOStride = C::kHeadDim + 4;
  float* o_sm = reinterpret_cast<float*>(k_smem);       // [kWarps][R*16][kOStride]
  float* md_sm = o_sm + C::kWarps * R * 16 * kOStride;  // [kWarps][R*16][2]
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (r * 16 + 8 * h >= C::kGroup) continue;  // 8 padding rows (compile time)
      const int row = r * 16 + lane / 4 + 8 * h;
      const float dsum = softmax_quad_sum(d[r][h]);
      if (row >= C::kGroup) continue;  // the quad's row is padding (no shuffles below)
      if (lane % 4 == 0) {
        md_sm[(warp * R * 16 + row) * 2] = m[r][h];
        md_sm[(warp * R * 16 + row) * 2 + 1] = dsum;
      }
      if constexpr (is_fp8<kv_t>()) {
        // n-tiles 2ch (even) and 2ch + 1 (odd columns) of chunk ch: this thread's columns
        // 16ch + 4(lane%4) + {0, 1, 2, 3} (decode_tc_pv_fp8).
#pragma unroll
        for (int ch = 0; ch < DT / 2; ++ch) {
          float* dst = o_sm + (warp * R * 16 + row) * kOStride + ch * 16 + 4 * (lane % 4);
          *reinterpret_cast<float4*>(dst) =
              make_float4(o[r][2 * ch][h * 2], o[r][2 * ch + 1][h * 2], o[r][2 * ch][h * 2 + 1],
                          o[r][2 * ch + 1][h * 2 + 1]);
        }
      } else {
#pragma unroll
        for (int n = 0; n < DT; ++n) {
          float* dst = o_sm + (warp * R * 16 + row) * kOStride + n * 8 + 2 * (lane % 4);
          *reinterpret_cast<float2*>(dst) = make_float2(o[r][n][h * 2], o[r][n][h * 2 + 1]);
        }
      }
    }
  }
  __syncthreads();
  constexpr int kRowVecs = C::kHeadDim / 8;
  for (int idx = threadIdx.x; idx < C::kGroup * kRowVecs; idx += C::kThreads) {
    const int row = idx / kRowVecs, col = (idx % kRowVecs) * 8;
    float mm = neg_inf();
#pragma unroll
    for (int wv = 0; wv < C::kWarps; ++wv) mm = fmaxf(mm, md_sm[(wv * R * 16 + row) * 2]);
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float dd = 0.f;
    if constexpr (!Tr::kUseSoftmax) {  // unnormalized sums; partial states carry lse 0
#pragma unroll
      for (int wv = 0; wv < C::kWarps; ++wv) {
        const float* src = o_sm + (wv * R * 16 + row) * kOStride + col;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += src[e];
      }
      decode_store_row<C>(p, w, row, col, acc, 0.f, col == 0);
      continue;
    }
    if (mm != neg_inf()) {
#pragma unroll
      for (int wv = 0; wv < C::kWarps; ++wv) {
        const float sc = softmax_merge_scale(md_sm[(wv * R * 16 + row) * 2], mm);
        dd += sc * md_sm[(wv * R * 16 + row) * 2 + 1];
        const float* src = o_sm + (wv * R * 16 + row) * kOStride + col;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += sc * src[e];
      }
    }
    if constexpr (Tr::kSink) {  // the sink joins the request's last chunk, once
      if (w.kv_end == w.kv_len) {
        const float f = fold_sink2(Tr::sink2(va, w.kv_head * C::kGroup + row), mm, dd);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] *= f;
      }
    }
    const float inv = softmax_inv(dd);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= inv;
    decode_store_row<C>(p, w, row, col, acc, softmax_lse2(mm, dd), col == 0);
  }
  __syncthreads();  // the shared memory is reused by the next work item
}

template <class Config, class V = DefaultVariant>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinCtas)
    batch_decode_tc_kernel(const __grid_constant__ DecodeParams p) {
  typedef DecodeWithVariant<Config, V> C;
  extern __shared__ __align__(128) unsigned char smem[];
  work_loop(
      DecodeWorkList{p.plan},
      [&](const DecodeWorkItem& w, int timeline) { decode_tc_work_item<C>(p, w, smem, timeline); },
      [&](const DecodeWorkItem& w, int timeline) { decode_arrive<C>(p, w, smem, timeline); });
}

}  // namespace flashkv
