// Conventions shared by every attention op.
//
// LSE: flashkv's log-sum-exp outputs are NATURAL logarithms of the softmax denominator of the
//   scaled logits: lse = log(sum_j exp(sm_scale * q·k_j)). (FlashInfer returns base-2; convert
//   with lse2 = lse * log2(e).) Kernels work in base 2 internally and convert at this edge.
// Empty rows: a query row that sees no key (kv_len 0, or every key masked) produces out = 0 and
//   lse = -inf. Such a state is the identity of the merge operator ⊕, so merging it with
//   anything returns the other state unchanged.
// Causal masks are aligned to the END of the KV: query i of a request with qo_len rows and kv_len
//   keys sees keys j <= kv_len - qo_len + i. (With qo_len > kv_len the first rows see nothing.)
#pragma once

#include <cmath>
#include <limits>

#include "flashkv/dtype.h"
#include "flashkv/kv_quant.h"
#include "flashkv/tensor.h"

namespace flashkv {

inline constexpr double kLog2e = 1.4426950408889634;  // log2(e)
inline constexpr double kLn2 = 0.6931471805599453;    // ln(2)

// The heads and dtypes a plan() is made for (the batch ops' plan argument beside the batch).
struct AttentionShape {
  int num_qo_heads = 32;
  int num_kv_heads = 8;  // divides num_qo_heads (the GQA group is their ratio)
  int head_dim = 128;
  DType q_dtype = DType::f16, kv_dtype = DType::f16, o_dtype = DType::f16;
  // A quantized cache's format beyond per-tensor / per-head fp8 (kv_quant.h; kv_dtype is its
  // element dtype: e4m3 / e5m2, or u8 for INT4 / NVFP4). No GPU kernel reads one yet: the GPU
  // plans refuse it (NotImplementedError), the host path runs it on the CPU reference.
  KVQuantFormat kv_format = {};
};

// The dequantization scales of a quantized (fp8) KV cache, FlashInfer's k_scale / v_scale: the
// real key is the stored value times the key scale, the real value the stored value times the
// value scale. Each scale is the host float times, when given, an f32 tensor of 1 element (per
// tensor) or num_kv_heads elements (per KV head, as calibrated checkpoints ship them) on the
// cache's device. Kernels read the tensors at run time, so a CUDA graph replays with their current
// contents: scales may change without a new capture. The product is formed in f32 (float * float)
// and is what append_paged_kv_cache divides by when it quantizes. The GPU kernels take scales for
// fp8 caches only (a 16-bit cache with a scale other than 1 is an error); the CPU reference takes
// them for any dtype.
//
// Finer scales (kv_quant.h) extend the same struct: `format` says what the stored bytes are, and
// the group-scale (and INT4's zero-point) pools, indexed by the cache's page ids, multiply with
// the factor above. Only a PagedKVCache takes them (the pools share its page table), and only the
// CPU reference reads them so far.
struct KVScale {
  float k = 1.0f, v = 1.0f;
  TensorView k_tensor, v_tensor;  // optional: f32 [1] or [num_kv_heads]
  KVQuantFormat format = {};      // kNone: the factor above is all there is
  // [num_pages, page_size, H_kv, G] (NHD) / [num_pages, H_kv, page_size, G] (HND), kv_quant.h.
  TensorView k_group_scale = {}, v_group_scale = {};  // kFp8PerTokenHead, kInt4, kNvfp4
  TensorView k_zero = {}, v_zero = {};  // kInt4 only: same shape and dtype as the scales
  bool is_identity() const {
    return k == 1.0f && v == 1.0f && !k_tensor.defined() && !v_tensor.defined() &&
           !has_group_scales();
  }
  bool has_group_scales() const {
    return !format.is_none() || k_group_scale.defined() || v_group_scale.defined() ||
           k_zero.defined() || v_zero.defined();
  }
  // The per-tensor / per-head part alone (the floats and their tensors).
  KVScale base() const {
    KVScale b;
    b.k = k;
    b.v = v;
    b.k_tensor = k_tensor;
    b.v_tensor = v_tensor;
    return b;
  }
};

// Checks `s` for a cache of `kv_dtype` with `num_kv_heads` heads on `device` (each tensor: f32,
// one dimension of 1 or num_kv_heads, contiguous, on `device`; the floats finite and > 0).
// `name` prefixes the messages ("paged_kv.scale"). gpu: also refuses scales on 16-bit caches.
// Group scales (a format other than kNone) are refused here: contiguous-KV ops do not take them,
// and PagedKVCache::validate_shapes checks them with check_kv_group_scales (paged_kv.h).
void check_kv_scale(const KVScale& s, DType kv_dtype, int num_kv_heads, Device device, bool gpu,
                    const char* name);

struct AttentionOptions {
  float sm_scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  bool causal = false;
  KVScale kv_scale;  // ops over contiguous k, v (paged ops take PagedKVCache::scale)
};

inline float resolve_sm_scale(float sm_scale, int head_dim) {
  return sm_scale > 0.0f ? sm_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace flashkv
