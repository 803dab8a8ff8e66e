// Shape and dtype checks shared by the KV-cache ops, RoPE and their CPU reference.
#include "core/kv_ops_checks.h"

#include "flashkv/error.h"

namespace flashkv::detail {
namespace {

constexpr std::initializer_list<DType> kValueDTypes = {DType::f16, DType::bf16, DType::f32};

// `out` is `in` itself (in place) or does not start at the same address (out of place).
void check_in_place_or_separate(const TensorView& in, const char* in_name, const TensorView& out,
                                const char* out_name) {
  if (out.data() != in.data() || in.data() == nullptr) return;
  for (int d = 0; d < in.ndim(); ++d) {
    check(out.stride(d) == in.stride(d) || in.size(d) <= 1, out_name, ": shares its data with ",
          in_name, " but stride(", d, ") = ", out.stride(d), " differs from ", in_name, "'s ",
          in.stride(d), ": in place needs the same view");
  }
}

}  // namespace

void check_i32_vector(const TensorView& t, const char* name, int64_t len) {
  check_defined(t, name);
  check_dtype(t, name, DType::i32);
  check_ndim(t, name, 1);
  if (len >= 0) check_shape(t, name, {len});
}

RopeShape check_rope_tensors(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                             const TensorView& k_rope) {
  check_defined(q, "q");
  check_defined(k, "k");
  check_defined(q_rope, "q_rope");
  check_defined(k_rope, "k_rope");
  check_ndim(q, "q", 3);
  check_dtype_in(q, "q", kValueDTypes);
  RopeShape s{.nnz = q.size(0),
              .num_qo_heads = static_cast<int>(q.size(1)),
              .num_kv_heads = 0,
              .head_dim = static_cast<int>(q.size(2))};
  if (!(s.head_dim >= 2)) {
    fail("q: head_dim (the last dimension) must be >= 2, got shape ", q.shape_str());
  }
  check_shape(k, "k", {s.nnz, -1, s.head_dim});
  s.num_kv_heads = static_cast<int>(k.size(1));
  check_dtype(k, "k", q.dtype());
  check_shape(q_rope, "q_rope", {s.nnz, s.num_qo_heads, s.head_dim});
  check_shape(k_rope, "k_rope", {s.nnz, s.num_kv_heads, s.head_dim});
  check_dtype(q_rope, "q_rope", q.dtype());
  check_dtype(k_rope, "k_rope", q.dtype());
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(q_rope, "q_rope");
  check_last_dim_contiguous(k_rope, "k_rope");
  check_in_place_or_separate(q, "q", q_rope, "q_rope");
  check_in_place_or_separate(k, "k", k_rope, "k_rope");
  return s;
}

int resolve_rotary_dim(int rotary_dim, int head_dim, const char* what) {
  const int r = rotary_dim == 0 ? head_dim : rotary_dim;
  check(r >= 2 && r <= head_dim, what, ": rotary_dim = ", r,
        " is out of range: expected 2 <= ", "rotary_dim <= ", head_dim, " (head_dim)");
  check(r % 2 == 0, what, ": rotary_dim = ", r, " must be even (it rotates pairs)");
  return r;
}

int check_cos_sin_cache(const TensorView& cos_sin_cache, int head_dim) {
  check_defined(cos_sin_cache, "cos_sin_cache");
  check_ndim(cos_sin_cache, "cos_sin_cache", 2);
  check_dtype(cos_sin_cache, "cos_sin_cache", DType::f32);
  check_last_dim_contiguous(cos_sin_cache, "cos_sin_cache");
  if (!(cos_sin_cache.size(1) <= INT32_MAX)) {
    fail("cos_sin_cache: too wide: ", cos_sin_cache.shape_str());
  }
  return resolve_rotary_dim(static_cast<int>(cos_sin_cache.size(1)), head_dim, "cos_sin_cache");
}

int64_t check_append_tensors(const TensorView& append_key, const TensorView& append_value,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& paged_kv) {
  paged_kv.validate_shapes();
  if (!paged_kv.scale.format.is_none()) {
    // A quantized format (kv_quant.h) is always written from f16 / bf16 / f32 rows, quantized
    // with the group scales computed per row (kv_quantize.h): stored bytes alone have no scales.
    check_defined(append_key, "append_key");
    check_dtype_in(append_key, "append_key", kValueDTypes);
    check_defined(append_value, "append_value");
    check_dtype(append_value, "append_value", append_key.dtype());
  }
  check_dtype_in(paged_kv.k, "paged_kv.k",
                 {DType::f16, DType::bf16, DType::f32, DType::e4m3, DType::e5m2, DType::u8});
  check_defined(append_key, "append_key");
  check_defined(append_value, "append_value");
  const int64_t heads = paged_kv.num_kv_heads(), dim = paged_kv.head_dim();
  check_ndim(append_key, "append_key", 3);
  const int64_t nnz = append_key.size(0);
  check_shape(append_key, "append_key", {nnz, heads, dim});
  check_shape(append_value, "append_value", {nnz, heads, dim});
  // An fp8 cache also takes f16 / bf16 / f32 rows, which the append quantizes (kv_ops.h).
  if (!paged_kv.scale.format.is_none()) {
    // checked above
  } else if (is_fp8_dtype(paged_kv.k.dtype()) && append_key.dtype() != paged_kv.k.dtype()) {
    check_dtype_in(append_key, "append_key", kValueDTypes);
    check_dtype(append_value, "append_value", append_key.dtype());
  } else {
    check_dtype(append_key, "append_key", paged_kv.k.dtype());
    check_dtype(append_value, "append_value", paged_kv.k.dtype());
  }
  check_last_dim_contiguous(append_key, "append_key");
  check_last_dim_contiguous(append_value, "append_value");
  check_i32_vector(batch_indices, "batch_indices", nnz);
  check_i32_vector(positions, "positions", nnz);
  return nnz;
}

int64_t check_batch_indices_args(const TensorView& append_indptr, const TensorView& seq_lens) {
  check_i32_vector(append_indptr, "append_indptr", -1);
  if (!(append_indptr.size(0) >= 1)) {
    fail("append_indptr: expected batch + 1 >= 1 entries, got shape ", append_indptr.shape_str());
  }
  const int64_t batch = append_indptr.size(0) - 1;
  check_i32_vector(seq_lens, "seq_lens", batch);
  return batch;
}

}  // namespace flashkv::detail
