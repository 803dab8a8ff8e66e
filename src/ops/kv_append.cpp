// Host side of the KV-cache append ops (kv_ops.h): shape checks, then the CPU reference for host
// tensors. The GPU kernels are not written yet: CUDA tensors get a clear error, never a no-op.
#include "core/kv_ops_checks.h"
#include "flashkv/error.h"
#include "flashkv/kv_ops.h"
#include "flashkv/reference_kv_ops.h"
#include "ops/jit_util.h"

namespace flashkv {
void append_paged_kv_cache(const TensorView& append_key, const TensorView& append_value,
                           const TensorView& batch_indices, const TensorView& positions,
                           const PagedKVCache& paged_kv, Stream stream) {
  detail::check_append_tensors(append_key, append_value, batch_indices, positions, paged_kv);
  const Device dev = ops::common_device({{"append_key", &append_key},
                                         {"append_value", &append_value},
                                         {"batch_indices", &batch_indices},
                                         {"positions", &positions},
                                         {"paged_kv.k", &paged_kv.k},
                                         {"paged_kv.v", &paged_kv.v},
                                         {"paged_kv.indptr", &paged_kv.indptr},
                                         {"paged_kv.indices", &paged_kv.indices},
                                         {"paged_kv.last_page_len", &paged_kv.last_page_len}});
  if (dev.is_cpu()) {
    return reference::append_paged_kv_cache(append_key, append_value, batch_indices, positions,
                                            paged_kv);
  }
  detail::fail_no_gpu_kernel("append_paged_kv_cache", dev);
}

void get_batch_indices_positions(const TensorView& append_indptr, const TensorView& seq_lens,
                                 const TensorView& batch_indices, const TensorView& positions,
                                 Stream stream) {
  detail::check_batch_indices_args(append_indptr, seq_lens);
  detail::check_i32_vector(batch_indices, "batch_indices", -1);
  detail::check_i32_vector(positions, "positions", batch_indices.size(0));
  const Device dev = ops::common_device({{"append_indptr", &append_indptr},
                                         {"seq_lens", &seq_lens},
                                         {"batch_indices", &batch_indices},
                                         {"positions", &positions}});
  if (dev.is_cpu()) {
    return reference::get_batch_indices_positions(append_indptr, seq_lens, batch_indices,
                                                  positions);
  }
  detail::fail_no_gpu_kernel("get_batch_indices_positions", dev);
}

BatchIndicesPositions get_batch_indices_positions(const TensorView& append_indptr,
                                                  const TensorView& seq_lens, int64_t nnz) {
  check(nnz >= 0, "nnz = ", nnz, ": expected >= 0");
  BatchIndicesPositions r{HostTensor(DType::i32, {nnz}), HostTensor(DType::i32, {nnz})};
  get_batch_indices_positions(append_indptr, seq_lens, r.batch_indices.view(), r.positions.view());
  return r;
}

}  // namespace flashkv
