// Host side of RoPE (rope.h): shape checks, then the CPU reference for host tensors. The GPU
// kernels are not written yet: CUDA tensors get a clear error, never a no-op.
#include "flashkv/rope.h"

#include "core/kv_ops_checks.h"
#include "flashkv/error.h"
#include "flashkv/reference_kv_ops.h"
#include "ops/jit_util.h"

namespace flashkv {
namespace {

// Checks what does not depend on the device and returns the device of all the tensors.
Device rope_device(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                   const TensorView& k_rope, const TensorView& a, const char* a_name,
                   const TensorView& b = {}, const char* b_name = "") {
  detail::check_rope_tensors(q, k, q_rope, k_rope);
  return ops::common_device(
      {{"q", &q}, {"k", &k}, {"q_rope", &q_rope}, {"k_rope", &k_rope}, {a_name, &a}, {b_name, &b}});
}

}  // namespace

void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                const TensorView& k_rope, const TensorView& indptr, const TensorView& offsets,
                const RopeOptions& opts, Stream stream) {
  const Device dev = rope_device(q, k, q_rope, k_rope, indptr, "indptr", offsets, "offsets");
  if (dev.is_cpu()) return reference::apply_rope(q, k, q_rope, k_rope, indptr, offsets, opts);
  detail::fail_no_gpu_kernel("apply_rope", dev);
}

void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& pos_ids,
                        const RopeOptions& opts, Stream stream) {
  const Device dev = rope_device(q, k, q_rope, k_rope, pos_ids, "pos_ids");
  if (dev.is_cpu()) return reference::apply_rope_pos_ids(q, k, q_rope, k_rope, pos_ids, opts);
  detail::fail_no_gpu_kernel("apply_rope_pos_ids", dev);
}

void apply_llama31_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& indptr,
                        const TensorView& offsets, const Llama31RopeOptions& opts, Stream stream) {
  const Device dev = rope_device(q, k, q_rope, k_rope, indptr, "indptr", offsets, "offsets");
  if (dev.is_cpu()) {
    return reference::apply_llama31_rope(q, k, q_rope, k_rope, indptr, offsets, opts);
  }
  detail::fail_no_gpu_kernel("apply_llama31_rope", dev);
}

void apply_llama31_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                const TensorView& k_rope, const TensorView& pos_ids,
                                const Llama31RopeOptions& opts, Stream stream) {
  const Device dev = rope_device(q, k, q_rope, k_rope, pos_ids, "pos_ids");
  if (dev.is_cpu()) {
    return reference::apply_llama31_rope_pos_ids(q, k, q_rope, k_rope, pos_ids, opts);
  }
  detail::fail_no_gpu_kernel("apply_llama31_rope_pos_ids", dev);
}

void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k,
                                   const TensorView& q_rope, const TensorView& k_rope,
                                   const TensorView& positions, const TensorView& cos_sin_cache,
                                   bool is_neox, Stream stream) {
  const Device dev =
      rope_device(q, k, q_rope, k_rope, positions, "positions", cos_sin_cache, "cos_sin_cache");
  if (dev.is_cpu()) {
    return reference::apply_rope_with_cos_sin_cache(q, k, q_rope, k_rope, positions, cos_sin_cache,
                                                    is_neox);
  }
  detail::fail_no_gpu_kernel("apply_rope_with_cos_sin_cache", dev);
}

}  // namespace flashkv
