// Argument checks the KV-cache ops and RoPE share between the public ops (src/ops/) and the CPU
// reference (src/reference/). Shapes and dtypes only: nothing here reads tensor data, so the
// checks run the same for host and CUDA tensors. Each check names the argument. Not a public
// header.
#pragma once

#include <cstdint>

#include "flashkv/paged_kv.h"
#include "flashkv/tensor.h"

namespace flashkv::detail {

// A 1-d i32 tensor named `name` with `len` entries (len < 0: any length).
void check_i32_vector(const TensorView& t, const char* name, int64_t len);

// The shapes of a RoPE call: q [nnz, H_qo, D], k [nnz, H_kv, D], q_rope / k_rope like q / k, all
// f16/bf16/f32 of q's dtype, last dimension contiguous; an output is either its input itself (in
// place: same data and strides) or a separate tensor.
struct RopeShape {
  int64_t nnz = 0;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};
RopeShape check_rope_tensors(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                             const TensorView& k_rope);

// rotary_dim resolved against head_dim (0 means head_dim): even, 2 <= rotary_dim <= head_dim.
// `what` names where the value came from ("rotary_dim", "cos_sin_cache").
int resolve_rotary_dim(int rotary_dim, int head_dim, const char* what);

// cos_sin_cache f32 [max_position, rotary_dim] (last dimension contiguous) for heads of
// head_dim; returns rotary_dim.
int check_cos_sin_cache(const TensorView& cos_sin_cache, int head_dim);

// The shapes of an append: append_key / append_value [nnz, H_kv, D] of the cache's H_kv, D and
// dtype (f16/bf16/f32), last dimension contiguous; batch_indices / positions i32 [nnz]; and
// paged_kv.validate_shapes(). Returns nnz.
int64_t check_append_tensors(const TensorView& append_key, const TensorView& append_value,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& paged_kv);

// append_indptr i32 [batch + 1], seq_lens i32 [batch]; returns batch.
int64_t check_batch_indices_args(const TensorView& append_indptr, const TensorView& seq_lens);

}  // namespace flashkv::detail
