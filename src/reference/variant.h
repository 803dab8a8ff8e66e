// Internals of the reference's variant ops (variant_*.cpp). Not a public header.
//
// A variant is resolved once per call (parameters read from host tensors and checked), then
// applied through VariantHooks, one object per (request, query head) with one method per hook of
// the device variant functors (kernels/variants/variant.cuh; docs/design.md "Kernel families"),
// whose shape it mirrors (FlashInfer's variant closures are built per (batch_idx, head) the same
// way).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "flashkv/reference_variants.h"
#include "flashkv/variants.h"
#include "reference/attend.h"

namespace flashkv::reference::detail {

// An AttentionVariant with its tensors read into host vectors, for one call.
struct ResolvedVariant {
  double sm_scale = 0;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  double soft_cap = 0;
  bool sigmoid = false;
  double sigmoid_bias = 0;
  std::vector<double> alibi_slopes;  // [H_qo] or empty
  std::vector<double> sinks;         // [H_qo] or empty
  const uint8_t* mask = nullptr;     // custom mask bytes or null
  int64_t mask_bytes = 0;
  std::vector<int64_t> mask_offset;  // [batch] byte offset of each request's mask
  RopeMode rope = RopeMode::none;
  std::vector<double> rope_freq;     // [D/2]
  std::vector<int64_t> q_rope_pos;   // [q rows] or empty (then q_pos)
  std::vector<int64_t> k_rope_base;  // [batch] or empty (then 0)
  KVChunk chunk;
};

// Checks `v` against the call's query shape, batch size and lse, and reads its tensors.
ResolvedVariant resolve_variant(const AttentionVariant& v, const KVChunk& chunk, const QOShape& qo,
                                int64_t batch, const TensorView& lse);

// Checks that request `b`'s custom mask (qo_len x kv_len bits) lies inside the mask bytes.
void check_mask_extent(const ResolvedVariant& v, int64_t b, int64_t qo_len, int64_t kv_len);

// Rotates x[D] in place by RoPE at `pos` (rotate-half layout, variants.h).
void apply_rope(std::span<double> x, const std::vector<double>& freq, int64_t pos);

// The hooks of one (request b, query head h): qo_len query rows over kv_len keys.
class VariantHooks {
 public:
  VariantHooks(const ResolvedVariant& v, int64_t b, int64_t qo_len, int64_t kv_len, int head);

  // Position of query row i on the causal diagonal (attention.h): kv_len - qo_len + i.
  int64_t q_pos(int64_t i) const { return kv_len_ - qo_len_ + i; }
  // QueryTransform: RoPE of q at its RoPE position (`row` is the row's index in the call's q).
  void query_transform(std::span<double> q, int64_t row, int64_t i) const;
  // KeyTransform of key j (per kv head; needs no query head).
  static void key_transform(const ResolvedVariant& v, int64_t b, std::span<double> k, int64_t j);
  // LogitsMask: causal, window and custom mask, ANDed. True = attend.
  bool logits_mask(int64_t i, int64_t j) const;
  // LogitsTransform: x = q'·k' -> s (sm_scale, ALiBi, soft-cap, sigmoid).
  double logits_transform(double x, int64_t i, int64_t j) const;
  // The sink logit this row's state carries (-inf: none).
  double sink_logit() const { return sink_; }
  bool use_softmax() const { return !v_.sigmoid; }

 private:
  const ResolvedVariant& v_;
  int64_t qo_len_, kv_len_;
  double alibi_slope_ = 0;
  double sink_;
  const uint8_t* mask_ = nullptr;  // this request's mask bytes or null
};

// Attends query row i (already query-transformed) over the key-transformed rows of `kv`, keys
// [chunk.begin, chunk.end) only. Softmax: the state (o, lse) with the sink in its denominator;
// sigmoid: o = Σ s_j v_j and lse = -inf (unused).
RowState attend_variant_row(std::span<const double> q, const KVRows& kv, const VariantHooks& hooks,
                            int64_t i, const KVChunk& chunk);

// run_requests() of attend.h for a variant: requests[b] is request b of the variant's arrays.
void run_variant_requests(const TensorView& q, const std::vector<Request>& requests,
                          const TensorView& out, const TensorView& lse, int num_kv_heads,
                          const ResolvedVariant& v);

}  // namespace flashkv::reference::detail
