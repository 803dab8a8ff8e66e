// The reference's variant ops, part 1: checking an AttentionVariant against a call and reading its
// tensors into host vectors (ResolvedVariant), once per call.
#include <cmath>
#include <string>

#include "flashkv/error.h"
#include "reference/variant.h"

namespace flashkv::reference::detail {
namespace {

// A host i32 or f32 vector of `n` entries named `name`, as doubles.
std::vector<double> read_vector(const TensorView& t, const char* name, DType dtype, int64_t n) {
  check_cpu(t, name);
  check_dtype(t, name, dtype);
  check_shape(t, name, {n});
  std::vector<double> vals(n);
  const int64_t stride = t.stride(0);
  for (int64_t i = 0; i < n; ++i) vals[i] = load_as_double(t.data(), dtype, i * stride);
  return vals;
}

std::vector<int64_t> read_i32_vector(const TensorView& t, const char* name, int64_t n) {
  const std::vector<double> d = read_vector(t, name, DType::i32, n);
  return std::vector<int64_t>(d.begin(), d.end());
}

}  // namespace

ResolvedVariant resolve_variant(const AttentionVariant& v, const KVChunk& chunk, const QOShape& qo,
                                int64_t batch, const TensorView& lse) {
  ResolvedVariant r;
  r.sm_scale = resolve_sm_scale(v.sm_scale, qo.head_dim);
  r.causal = v.causal;
  check(v.window_left >= -1, "variant.window_left must be >= -1 (-1: no window), got ",
        v.window_left);
  check(v.window_right >= -1, "variant.window_right must be >= -1 (-1: no window), got ",
        v.window_right);
  r.window_left = v.window_left;
  r.window_right = v.window_right;
  check(std::isfinite(v.logits_soft_cap) && v.logits_soft_cap >= 0,
        "variant.logits_soft_cap must be >= 0 (0: off), got ", v.logits_soft_cap);
  r.soft_cap = v.logits_soft_cap;
  r.sigmoid = v.sigmoid;
  r.sigmoid_bias = v.sigmoid_bias;
  if (v.sigmoid) {
    check(!lse.defined(),
          "lse: sigmoid attention has no softmax denominator; pass an undefined lse");
    check(!v.sinks.defined(),
          "variant.sinks: sinks join a softmax denominator; sigmoid "
          "attention has none");
  }
  if (v.alibi_slopes.defined()) {
    r.alibi_slopes =
        read_vector(v.alibi_slopes, "variant.alibi_slopes", DType::f32, qo.num_qo_heads);
  }
  if (v.sinks.defined()) {
    r.sinks = read_vector(v.sinks, "variant.sinks", DType::f32, qo.num_qo_heads);
  }
  if (v.custom_mask.defined()) {
    check(v.custom_mask.num_bytes >= 0, "variant.custom_mask.num_bytes must be >= 0, got ",
          v.custom_mask.num_bytes);
    r.mask = v.custom_mask.bits;
    r.mask_bytes = v.custom_mask.num_bytes;
    if (v.custom_mask.mask_indptr.defined()) {
      r.mask_offset =
          read_i32_vector(v.custom_mask.mask_indptr, "variant.custom_mask.mask_indptr", batch + 1);
      r.mask_offset.pop_back();  // entry b is request b's start; the last bounds nothing we need
    } else {
      check(batch == 1, "variant.custom_mask.mask_indptr is required for a batch of ", batch,
            " requests");
      r.mask_offset = {0};
    }
  } else {
    check(!v.custom_mask.mask_indptr.defined(),
          "variant.custom_mask: mask_indptr given without mask bits");
  }
  r.rope = v.rope.mode;
  if (r.rope != RopeMode::none) {
    r.rope_freq = rope_frequencies(v.rope, qo.head_dim);
    if (v.rope.q_rope_offset.defined()) {
      r.q_rope_pos = read_i32_vector(v.rope.q_rope_offset, "variant.rope.q_rope_offset", qo.rows);
    }
    if (v.rope.k_rope_offset.defined()) {
      r.k_rope_base = read_i32_vector(v.rope.k_rope_offset, "variant.rope.k_rope_offset", batch);
    }
  } else {
    check(!v.rope.q_rope_offset.defined() && !v.rope.k_rope_offset.defined(),
          "variant.rope: q_rope_offset/k_rope_offset given with rope mode none");
  }
  check(chunk.begin >= 0, "chunk.begin must be >= 0, got ", chunk.begin);
  check(chunk.end == -1 || chunk.end >= chunk.begin, "chunk.end must be -1 or >= chunk.begin (",
        chunk.begin, "), got ", chunk.end);
  r.chunk = chunk;
  return r;
}

void check_mask_extent(const ResolvedVariant& v, int64_t b, int64_t qo_len, int64_t kv_len) {
  if (v.mask == nullptr) return;
  const int64_t need = (qo_len * kv_len + 7) / 8;
  const int64_t begin = v.mask_offset[b];
  check(begin >= 0 && begin + need <= v.mask_bytes, "variant.custom_mask: request ", b,
        " needs bytes [", begin, ", ", begin + need, ") for its ", qo_len, " x ", kv_len,
        " mask, but the mask has ", v.mask_bytes, " bytes");
}

void apply_rope(std::span<double> x, const std::vector<double>& freq, int64_t pos) {
  const size_t half = freq.size();
  for (size_t d = 0; d < half; ++d) {
    const double angle = static_cast<double>(pos) * freq[d];
    const double c = std::cos(angle), s = std::sin(angle);
    const double a = x[d], b = x[d + half];
    x[d] = a * c - b * s;
    x[d + half] = b * c + a * s;
  }
}

}  // namespace flashkv::reference::detail
