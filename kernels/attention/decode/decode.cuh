// Batch decode over a paged KV cache on CUDA cores (query tile 1), persistent over the plan.
//
// One CTA runs the work items the scheduler gave it (DecodePlanPtrs). A work item is one request,
// one KV head, a range of KV tokens; GQA head-group fusion: the CTA serves all `kGroup` query
// heads of that KV head, so each KV byte is read from memory once. KV tiles of kTile tokens are
// gathered page by page into shared memory with a kStages-deep cp.async pipeline; scores and the
// online softmax stay in registers. Thread layout (kThreads = 128):
//   tx (fastest, kBdx lanes): 8 consecutive elements (16 bytes) of the head dimension
//   ty (kBdy):                head slice: thread ty serves heads ty, ty + kBdy, ... of the group
//                             (kHeadsPerThread <= 4 of them, so each K/V element a thread loads
//                             from shared memory and converts is used for up to 4 heads)
//   tz (kBdz):                token lane: lane tz handles tokens tz, tz + kBdz, ... of a tile
// The kBdz partial softmax states of each head are merged (⊕) through shared memory at the end.
#pragma once

#include "attention/decode/decode_common.cuh"
#include "attention/decode/decode_prologue.cuh"
#include "attention/decode/decode_cuda_core_shape.cuh"
#include "attention/decode/decode_step.cuh"
#include "attention/state.cuh"
#include "attention/work_loop.cuh"
#include "attention/work_timeline.cuh"
#include "primitives/cp_async.cuh"
#include "primitives/types.cuh"
#include "variants/variant_smem.cuh"

namespace flashkv {

constexpr int pow2_floor(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}
constexpr int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}
constexpr int cmin(int a, int b) { return a < b ? a : b; }

// WIDEN_KV: an fp8 cache staged widened to QT (for variants that rewrite the staged keys or
// values: kv/kv_chunk_copy.cuh); kv_t is the staged element type, kv_mem_t the cache's.
template <class QT, class KVT, class OT, int HEAD_DIM, int GROUP, int PAGE_SIZE,
          bool WIDEN_KV = false>
struct DecodeConfig {
  using q_t = QT;
  using kv_t = typename StagedKV<QT, KVT, WIDEN_KV>::type;
  using kv_mem_t = KVT;
  using o_t = OT;
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kGroup = GROUP;
  static constexpr int kPageSize = PAGE_SIZE;
  // (The shape's fields are read one by one: a constexpr struct member would be emitted as a device
  // variable under NVRTC's -default-device and change the kernel's constant bank.)
  static constexpr int kVec = 16 / sizeof(kv_t);  // elements per 16-byte load
  static constexpr int kBdx = HEAD_DIM / kVec;    // lanes across the head dimension
  static constexpr int kThreads = decode_cuda_core_shape(HEAD_DIM, (int)sizeof(kv_t)).threads;
  static constexpr int kRows = kThreads / kBdx;
  // Up to 4 heads per thread: registers for q and o grow with it (8 floats each per head), and 4
  // already amortizes the shared-memory load and conversion of K/V over the GQA-4 group. (One
  // head per thread ran GQA-4 decode at 46-50% of the read ceiling on the H200: issue-bound.)
  static constexpr int kMaxHeadsPerThread = 4;
  static constexpr int kBdy =
      cmin(pow2_ceil((GROUP + kMaxHeadsPerThread - 1) / kMaxHeadsPerThread), kRows);
  static constexpr int kHeadsPerThread = (GROUP + kBdy - 1) / kBdy;
  static constexpr int kBdz = kRows / kBdy;
  static constexpr int kTile = decode_cuda_core_shape(HEAD_DIM, (int)sizeof(kv_t)).tile;
  static constexpr int kTokensPerLane = kTile / kBdz;
  static constexpr int kInner = cmin(kTokensPerLane, 4);  // tokens scored per softmax update
  static constexpr int kLoads = kTile * kBdx / kThreads;  // 16-byte loads per thread per stage
  static constexpr int kChunks = kBdx;                    // 16-byte chunks per K/V row
  // Stage layout: plain rows (threads of one token row read consecutive 16-byte chunks).
  __device__ __forceinline__ static u32 chunk_offset(int row, int chunk) {
    return (u32)((row * kChunks + chunk) * 16);
  }
  static constexpr int kStages = decode_cuda_core_shape(HEAD_DIM, (int)sizeof(kv_t)).stages;
  static constexpr int kStageElems = kTile * HEAD_DIM;  // of K (and of V)
  static constexpr int kSmemBytes = decode_cuda_core_shape(HEAD_DIM, (int)sizeof(kv_t)).smem_bytes;

  static_assert(HEAD_DIM % kVec == 0 && kBdx <= 32 && 32 % kBdx == 0,
                "head_dim must be 64, 128 or 256");
  static_assert(sizeof(QT) == 2 && (sizeof(KVT) == 2 || is_fp8<KVT>()),
                "16-bit q with 16-bit or fp8 KV");
  static_assert(GROUP >= 1 && GROUP <= 64, "GQA group size must be in [1, 64]");
  static_assert(kTile % kBdz == 0 && kTokensPerLane % kInner == 0,
                "tile must split over token lanes");
  static_assert((kTile * kBdx) % kThreads == 0, "a stage must split evenly over the threads");
  static_assert(kBdz == 1 || kBdz * GROUP * HEAD_DIM * 4 + 2 * kBdz * GROUP * 4 <= kSmemBytes,
                "the final cross-lane merge must fit in the pipeline's shared memory");
};

// decode_store_row over a thread's V = 8 (16-bit KV) or 16 (fp8) columns [col, col + V).
template <class C, int V>
__device__ __forceinline__ void decode_store_cols(const DecodeParams& p, const DecodeWorkItem& w,
                                                  int g, int col, const float (&o)[V], float lse2,
                                                  bool write_lse) {
  if constexpr (V == 8) {
    decode_store_row<C>(p, w, g, col, o, lse2, write_lse);
  } else {
#pragma unroll
    for (int c = 0; c < V; c += 8) {
      float part[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) part[e] = o[c + e];
      decode_store_row<C>(p, w, g, col + c, part, lse2, write_lse && c == 0);
    }
  }
}

// Runs one work item: attention of the group's query heads over the item's KV range.
// C: a DecodeWithVariant<DecodeConfig, V> (decode_common.cuh). timeline: the item's first event
// in a profiling build (work_timeline.cuh), else unused.
template <class C>
__device__ __forceinline__ void decode_work_item(const DecodeParams& p, const DecodeWorkItem& w,
                                                 typename C::kv_t* k_smem, typename C::kv_t* v_smem,
                                                 int timeline = -1) {
  typedef typename C::kv_t kv_t;
  typedef typename C::Variant Var;
  typedef typename C::Traits Tr;
  const typename Var::Args& va = variant_args<Var>(p.variant);
  constexpr int H = C::kHeadsPerThread;
  constexpr int V = C::kVec;
  const int tx = threadIdx.x % C::kBdx;
  const int row = threadIdx.x / C::kBdx;
  const int ty = row % C::kBdy;
  const int tz = row / C::kBdy;

  // Fused step: the new token's k/v go into the cache before the load of its tile is issued.
  const long long step_pos = decode_step_position(p, w);
  const int append_tile = decode_step_append_tile<C>(p, w, step_pos);

  // Fused step with RoPE: cos/sin of this thread's columns, once for all its heads (8 columns
  // per StepRot8: V is 8 for 16-bit KV, 16 for fp8).
  constexpr int kQ8 = V / 8;
  StepRot8 rot[kQ8];
#pragma unroll
  for (int c = 0; c < kQ8; ++c) {
    rot[c] = StepRot8{};
    if (step_pos >= 0 && tx * V + 8 * c < p.step.spec.rotary_dim)
      rot[c] = decode_step_rot8(p.step.spec, tx * V + 8 * c, step_pos);
  }
  // Query heads of this thread, pre-scaled so logits come out in base 2.
  float q[H][V];
  bool head_ok[H];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    const int g = ty + h * C::kBdy;
    head_ok[h] = g < C::kGroup;
    const int qo_head = w.kv_head * C::kGroup + (head_ok[h] ? g : 0);
#pragma unroll
    for (int c = 0; c < kQ8; ++c) {
      Vec16<typename C::q_t>::to_floats(
          decode_step_load_q8<typename C::q_t>(p, w, qo_head, tx * V + 8 * c, step_pos, rot[c]),
          q[h] + 8 * c);
    }
    if constexpr (Tr::kQueryTransform) {
      // Pair i = (i, i + D/2): the partner elements sit kBdx/2 lanes away, same slot.
      const VariantRow vr = decode_variant_row<C>(w, head_ok[h] ? g : 0);
      const bool low = tx < C::kBdx / 2;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float other = __shfl_xor_sync(0xffffffffu, q[h][i], C::kBdx / 2);
        float x1 = low ? q[h][i] : other, x2 = low ? other : q[h][i];
        const int pair = (low ? tx : tx - C::kBdx / 2) * V + i;
        Var::query_transform(va, vr, pair, x1, x2);
        q[h][i] = to_float(from_float<typename C::q_t>(low ? x1 : x2));  // q stays 16-bit
      }
    }
    float dot_scale = Tr::dot_scale(p.sm_scale_log2);
    // An fp8 cache's keys are dequantized through the logits: q·(k * s) = (q * s)·k.
    if constexpr (is_fp8<typename C::kv_mem_t>()) dot_scale *= kv_scale_k(p.scale, w.kv_head);
#pragma unroll
    for (int i = 0; i < V; ++i) q[h][i] *= dot_scale;
  }

  SoftmaxState<V> st[H];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    st[h].init();
    if constexpr (!Tr::kUseSoftmax) st[h].m = 0.f;  // plain sums (SoftmaxState::accumulate_weight)
  }

  const int len = w.kv_end - w.kv_start;
  const int num_tiles = (len + C::kTile - 1) / C::kTile;
  auto stage_bytes = [](kv_t* base, int stage) {
    return reinterpret_cast<unsigned char*>(base + stage * C::kStageElems);
  };
  DecodeTilePages<C> pages;  // of the next tile to issue
  unsigned bad_pages = 0;    // a page id outside the cache was seen (decode_check_pages)
  decode_prologue<C>(
      p, w, num_tiles, append_tile, step_pos,
      [&](int s, bool is_v) { return stage_bytes(is_v ? v_smem : k_smem, s); }, pages, bad_pages);
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int next = tile + C::kStages - 1;
    if (next < num_tiles) {
      const int ns = next % C::kStages;
      decode_issue_tile<C>(p, w, next, pages, stage_bytes(k_smem, ns), stage_bytes(v_smem, ns),
                           bad_pages);
    }
    cp_async_commit();
    if (next + 1 < num_tiles) decode_tile_pages<C>(p, w, next + 1, pages);
    cp_async_wait<C::kStages - 1>();
    __syncthreads();
    if (tile == 0 && timeline >= 0) work_timeline_stamp(timeline + 1);
    if constexpr (Tr::kKVTransform) {
      const VariantKey key{w.request, 0, w.kv_len, w.kv_head};
      variant_transform_kv_rows<Var, kv_t, C::kHeadDim, C::kThreads>(
          va, key, w.kv_start + tile * C::kTile, min(C::kTile, len - tile * C::kTile),
          stage_bytes(k_smem, tile % C::kStages), stage_bytes(v_smem, tile % C::kStages),
          [](int r, int c) { return C::chunk_offset(r, c); });
      __syncthreads();
    }
    const kv_t* ks = k_smem + (tile % C::kStages) * C::kStageElems;
    const kv_t* vs = v_smem + (tile % C::kStages) * C::kStageElems;
#pragma unroll
    for (int i0 = 0; i0 < C::kTokensPerLane; i0 += C::kInner) {
      float s[H][C::kInner];
      float kf[C::kInner][V];
#pragma unroll
      for (int i = 0; i < C::kInner; ++i) {
        const int t_local = (i0 + i) * C::kBdz + tz;
        Vec16<kv_t>::to_floats(*reinterpret_cast<const uint4*>(ks + t_local * C::kHeadDim + tx * V),
                               kf[i]);
      }
#pragma unroll
      for (int h = 0; h < H; ++h) {
#pragma unroll
        for (int i = 0; i < C::kInner; ++i) {
          float acc = 0.f;
#pragma unroll
          for (int e = 0; e < V; ++e) acc = fmaf(q[h][e], kf[i][e], acc);
#pragma unroll
          for (int off = C::kBdx / 2; off >= 1; off /= 2)
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
          const int t = tile * C::kTile + (i0 + i) * C::kBdz + tz;
          const int g = head_ok[h] ? ty + h * C::kBdy : 0;
          const VariantPosition pos{
              w.request, 0, w.kv_start + t, 1, w.kv_len, w.kv_head * C::kGroup + g, w.kv_head};
          s[h][i] = Tr::score(va, pos, acc, t < len);
        }
      }
#pragma unroll
      for (int i = 0; i < C::kInner; ++i) {
        const int t_local = (i0 + i) * C::kBdz + tz;
        float vf[V];
        Vec16<kv_t>::to_floats(*reinterpret_cast<const uint4*>(vs + t_local * C::kHeadDim + tx * V),
                               vf);
        if constexpr (Tr::kUseSoftmax) {
          if (i == 0) {
#pragma unroll
            for (int h = 0; h < H; ++h) st[h].rescale_for(s[h], C::kInner);
          }
#pragma unroll
          for (int h = 0; h < H; ++h) st[h].accumulate(s[h][i], vf);
        } else {
#pragma unroll
          for (int h = 0; h < H; ++h) st[h].accumulate_weight(s[h][i], vf);
        }
      }
    }
    __syncthreads();
  }
  decode_check_pages<C>(p, w, bad_pages);
  if (timeline >= 0) work_timeline_stamp(timeline + 2);

  // Merge the kBdz token lanes of each head through shared memory (the pipeline is drained).
  float* o_sm = reinterpret_cast<float*>(k_smem);           // [kBdz][kGroup][kHeadDim]
  float* md_sm = o_sm + C::kBdz * C::kGroup * C::kHeadDim;  // [kBdz][kGroup][2]
  if (C::kBdz > 1) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const int g = ty + h * C::kBdy;
      if (!head_ok[h]) continue;
#pragma unroll
      for (int e = 0; e < V; ++e)
        o_sm[(tz * C::kGroup + g) * C::kHeadDim + tx * V + e] = st[h].o[e];
      if (tx == 0) {
        md_sm[(tz * C::kGroup + g) * 2] = st[h].m;
        md_sm[(tz * C::kGroup + g) * 2 + 1] = st[h].d;
      }
    }
    __syncthreads();
    if (tz == 0) {
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const int g = ty + h * C::kBdy;
        if (!head_ok[h]) continue;
        for (int z = 1; z < C::kBdz; ++z) {
          SoftmaxState<V> other;
          other.m = md_sm[(z * C::kGroup + g) * 2];
          other.d = md_sm[(z * C::kGroup + g) * 2 + 1];
#pragma unroll
          for (int e = 0; e < V; ++e)
            other.o[e] = o_sm[(z * C::kGroup + g) * C::kHeadDim + tx * V + e];
          st[h].merge(other);
        }
      }
    }
  }
  if (tz == 0) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const int g = ty + h * C::kBdy;
      if (!head_ok[h]) continue;
      float o[V];
      if constexpr (!Tr::kUseSoftmax) {  // unnormalized sums; partial states carry lse 0
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] = st[h].o[e];
        decode_store_cols<C>(p, w, g, tx * V, o, 0.f, tx == 0);
        continue;
      }
      if constexpr (Tr::kSink) {  // the sink joins the request's last chunk, once
        if (w.kv_end == w.kv_len) st[h].add_sink2(Tr::sink2(va, w.kv_head * C::kGroup + g));
      }
      st[h].normalized(o);
      const float lse2 = st[h].lse2();
      decode_store_cols<C>(p, w, g, tx * V, o, lse2, tx == 0);
    }
  }
  __syncthreads();  // the shared memory is reused by the next work item
}

template <class Config, class Var = DefaultVariant>
__global__ void __launch_bounds__(Config::kThreads)
    batch_decode_kernel(const __grid_constant__ DecodeParams p) {
  typedef DecodeWithVariant<Config, Var> C;
  extern __shared__ __align__(16) unsigned char smem[];
  typename C::kv_t* k_smem = reinterpret_cast<typename C::kv_t*>(smem);
  typename C::kv_t* v_smem = k_smem + C::kStages * C::kStageElems;
  work_loop(
      DecodeWorkList{p.plan},
      [&](const DecodeWorkItem& w, int timeline) {
        decode_work_item<C>(p, w, k_smem, v_smem, timeline);
      },
      [&](const DecodeWorkItem& w, int timeline) { decode_arrive<C>(p, w, smem, timeline); });
}

}  // namespace flashkv
