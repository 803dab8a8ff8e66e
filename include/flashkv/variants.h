// The built-in attention variants a caller can request, and their exact math.
//
// An AttentionVariant is a plain description: which built-ins are on and their parameters. Each
// built-in is one or more of the hooks of the device variants (kernels/variants/variant.cuh;
// docs/design.md "Kernel families"), applied per (request, query head) in
// this order for query row i (qo_len rows) and key j (kv_len keys) of a request:
//
//   positions  q_pos = kv_len - qo_len + i          (the causal diagonal; attention.h)
//              kv_pos = j
//   QueryTransform  q' = rope(q, q_rope_pos)         (RoPE only; identity otherwise)
//   KeyTransform    k' = rope(k, k_rope_pos)         (RoPE only)
//   ValueTransform  v' = v                           (no built-in changes V)
//   LogitsMask      keep(i, j) = causal_ok && window_ok && custom_ok      (all masks AND)
//   LogitsTransform x = q'·k'
//                   s = sm_scale * x                              (always)
//                     + alibi_slopes[h] * (kv_pos - q_pos)         (ALiBi)
//                   s = cap * tanh(s / cap)                        (soft-cap, cap > 0)
//                   s = sigmoid(s + sigmoid_bias)                  (sigmoid attention)
//   use_softmax     !sigmoid
//   OutputTransform softmax:  out = Σ_kept e^{s_j} v_j / (Σ_kept e^{s_j} + e^{sinks[h]})
//                             lse = log(Σ_kept e^{s_j} + e^{sinks[h]})   (natural log)
//                   sigmoid:  out = Σ_kept s_j v_j                 (no normalisation, no lse)
//
// A device kernel may fold sm_scale (and log2(e), or 1/cap) into Q — FlashInfer's QueryTransform
// does — as long as the logit it feeds the softmax equals `s` above.
//
// Sources followed (FlashInfer include/flashinfer/attention/variants.cuh, DefaultAttention):
// - soft-cap: FlashInfer computes tanh(x * sm_scale / cap) and scales by cap * log2(e), i.e.
//   s = cap * tanh(sm_scale * x / cap): sm_scale applies BEFORE the cap (Gemma 2 does the same:
//   scaled logits, then `softcap * tanh(logits / softcap)`).
// - ALiBi: FlashInfer adds slopes[h] * (kv_idx - qo_idx) to sm_scale * x (natural-log units),
//   before the cap. Slopes are positive (ALiBi paper: m = 2^(-8h/H)), so keys behind the query get
//   a negative bias. flashkv takes q_pos on the causal diagonal (kv_len - qo_len + i); FlashInfer
//   uses the row index qo_idx. The two differ by a per-row constant, which the softmax cancels:
//   outputs are identical, lse differs by slope * (kv_len - qo_len). (FlashInfer, with ALiBi AND
//   soft-cap both on, multiplies by sm_scale twice; flashkv applies it once.)
// - window: FlashInfer keeps key j iff kv_idx + qo_len + window_left >= kv_len + qo_idx, i.e.
//   kv_pos >= q_pos - window_left: window_left + 1 keys up to and including the diagonal.
//   window_right (flash-attn's window_size[1]) keeps kv_pos <= q_pos + window_right. -1 = no
//   bound. A window does not imply causal (as in FlashInfer): set `causal` too for Gemma/Mistral.
// - custom mask: FlashInfer's `packed_custom_mask` with `mask_indptr`. Request b's boolean mask
//   [qo_len_b, kv_len_b] is flattened row-major; bit n = qo_idx * kv_len_b + kv_idx lives in byte
//   mask_indptr[b] + n / 8 at bit n % 8 (bitorder "little", numpy.packbits(..., bitorder="little")
//   per request, FlashInfer's segment_packbits). 1 = attend. Each request starts on a byte
//   boundary.
// - sinks: gpt-oss (openai/gpt-oss `sdpa`: concat a per-head logit to the scaled, masked logits,
//   softmax, drop that column) and FlashInfer's AttentionSink (the sink logit `sink[h] * log2e`
//   enters m/d once). The sink is a logit in the units of `s` (NOT multiplied by sm_scale, NOT
//   soft-capped, no ALiBi bias) whose value is zero: a virtual key with v = 0. lse includes it.
// - sigmoid: FlashSigmoid / FlashInfer's sigmoid example: sigmoid(sm_scale * x + bias), weights
//   not normalised, masked keys weigh 0.
// - RoPE: FlashInfer's in-kernel PosEncodingMode::kRoPELlama (pos_enc.cuh): the rotate-half
//   (non-interleaved) layout, pairs (d, d + D/2) for d < D/2, rotated by angle pos * f_d with
//   f_d = theta^(-2d/D) / rope_scale (llama). llama31 (Llama 3.1 scaling, FlashInfer's
//   apply_llama31_rope): f = theta^(-2d/D); smooth = clamp(f * old_context_len /
//   (2π (high_freq_factor - low_freq_factor)) - low_freq_factor / (high_freq_factor -
//   low_freq_factor), 0, 1); f_d = (1 - smooth) * f / rope_scale + smooth * f.
//   x'[d] = x[d] cos - x[d + D/2] sin,  x'[d + D/2] = x[d + D/2] cos + x[d] sin.
//   Positions: q_rope_pos = q_rope_offset[row] when given (one entry per query row of the call,
//   FlashInfer's maybe_q_rope_offset), else q_pos; k_rope_pos = k_rope_offset[b] + j when given,
//   else j. Masks and ALiBi always use q_pos/kv_pos, never the RoPE positions.
//
// Rows with no kept key (kv_len 0, or every key masked): softmax rows give out = 0 and
// lse = -inf (attention.h), except that with sinks the sink is still in the denominator:
// out = 0, lse = sinks[h]. Sigmoid rows give out = 0.
//
// Split-KV and ⊕ (docs/design.md "Kernel families"): a state over a KV chunk is computed with every
// mask and position of the WHOLE request (a chunk is keys [begin, end) at their own kv_pos). The
// sink is itself a state, (o = 0, lse = sinks[h]); it must enter a row's merge exactly once: either
// one chunk carries it (flashkv's kernels: decode the request's last chunk, which also lets a
// sliding window skip the keys it hides; prefill the chunk at key 0) or the merge adds
// (0, sinks[h]) as one more state. Merging the chunks then equals the whole, sink included.
// Sigmoid partial states have no lse: they merge by summing outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "flashkv/attention.h"
#include "flashkv/tensor.h"

namespace flashkv {

enum class RopeMode : uint8_t { none, llama, llama31 };
const char* rope_mode_name(RopeMode m);  // "none", "llama", "llama31"

struct RopeParams {
  RopeMode mode = RopeMode::none;
  float rope_scale = 1.0f;  // positional interpolation factor (8 for Llama 3.1)
  float rope_theta = 1e4f;  // 5e5 for Llama 3.x
  // Llama 3.1 only (Meta's defaults).
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  float old_context_len = 8192.0f;
  TensorView q_rope_offset{};  // optional i32 [q rows of the call]: RoPE position of each query row
  TensorView k_rope_offset{};  // optional i32 [batch]: RoPE position of each request's key 0
};

// The D/2 rotation frequencies f_d (radians per position) of `p` for head_dim `dim` (even).
std::vector<double> rope_frequencies(const RopeParams& p, int dim);

// FlashInfer's packed_custom_mask. `bits` points at the packed bytes (host memory for the CPU
// reference, device memory for kernels); flashkv has no u8 DType, so this is a pointer and a size.
struct CustomMask {
  const uint8_t* bits = nullptr;
  int64_t num_bytes = 0;
  TensorView
      mask_indptr{};  // i32 [batch + 1] byte offset of each request; optional for one request
  bool defined() const { return bits != nullptr; }
};

// Packs per-request boolean masks (request b: qo_lens[b] * kv_lens[b] entries, row-major,
// requests back to back in `mask`) as FlashInfer's segment_packbits(bitorder="little") does.
// Returns the bytes; writes the i32 byte offsets [batch + 1] to `mask_indptr`.
std::vector<uint8_t> pack_custom_mask(const std::vector<bool>& mask,
                                      const std::vector<int64_t>& qo_lens,
                                      const std::vector<int64_t>& kv_lens,
                                      std::vector<int32_t>& mask_indptr);

// Bit (qo_idx, kv_idx) of a request's packed mask starting at `bytes` (1 = attend).
inline bool custom_mask_bit(const uint8_t* bytes, int64_t kv_len, int64_t qo_idx, int64_t kv_idx) {
  const int64_t n = qo_idx * kv_len + kv_idx;
  return (bytes[n / 8] >> (n % 8)) & 1;
}

struct AttentionVariant {
  float sm_scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  bool causal = false;
  int window_left = -1;          // -1: no left bound
  int window_right = -1;         // -1: no right bound
  float logits_soft_cap = 0.0f;  // 0: off
  TensorView alibi_slopes{};     // optional f32 [H_qo]
  TensorView sinks{};            // optional f32 [H_qo], one learned logit per query head
  bool sigmoid = false;          // sigmoid attention: no softmax, no lse
  float sigmoid_bias = 0.0f;
  CustomMask custom_mask{};
  RopeParams rope{};

  static AttentionVariant from(const AttentionOptions& o) {
    return {.sm_scale = o.sm_scale, .causal = o.causal};
  }
  bool use_softmax() const { return !sigmoid; }
};

}  // namespace flashkv
