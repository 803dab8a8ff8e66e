// Host side of RoPE (rope.h): shape checks, then the CPU reference for host tensors or the JIT
// kernel (kv/rope.cuh) for CUDA tensors. Every entry point reduces to a RopeSpec (frequencies or
// a cos/sin cache, ops/kv/rope_spec.h) and a source of positions.
#include "flashkv/rope.h"

#include <algorithm>

#include "core/kv_ops_checks.h"
#include "flashkv/error.h"
#include "flashkv/reference_kv_ops.h"
#include "kv/rope_params.cuh"
#include "ops/jit/jit_util.h"
#include "ops/jit/kernel_specs.h"
#include "ops/kv/kv_gpu.h"
#include "ops/kv/rope_spec.h"
#include "runtime/device_errors.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"

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

// Where a GPU launch takes its positions from: pos_ids (named `pos_name`), or indptr + offsets.
struct PositionSource {
  const TensorView* pos_ids = nullptr;
  const char* pos_name = "pos_ids";
  const TensorView* indptr = nullptr;
  const TensorView* offsets = nullptr;
};

std::string kernel_name(DType t, int vec, bool interleave) {
  return std::string("flashkv::rope_kernel<") + ops::device_type_name(t, "q") + ", " +
         std::to_string(vec) + ", " + (interleave ? "true" : "false") + ">";
}

// The element counts a 16-byte vector access needs to divide: dims, the rotary half (both
// pairings move whole vectors of V pairs), and the strides of dimensions that are stepped over.
int rope_vector_width(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                      const TensorView& k_rope, int rotary_dim) {
  auto stride = [](const TensorView& t, int d) { return t.size(d) > 1 ? t.stride(d) : 0; };
  return ops::vector_width(
      q.dtype(), {&q, &k, &q_rope, &k_rope},
      {q.size(2), rotary_dim / 2, stride(q, 0), stride(q, 1), stride(k, 0), stride(k, 1),
       stride(q_rope, 0), stride(q_rope, 1), stride(k_rope, 0), stride(k_rope, 1)});
}

void gpu_rope(const char* op_name, int op, const TensorView& q, const TensorView& k,
              const TensorView& q_rope, const TensorView& k_rope, const PositionSource& src,
              const RopeSpec& spec, Stream stream) {
  ops::require_cuda(op_name, q.device());
  const detail::RopeShape s = detail::check_rope_tensors(q, k, q_rope, k_rope);
  RopeKernelParams p{};
  if (src.pos_ids != nullptr) {
    detail::check_i32_vector(*src.pos_ids, src.pos_name, s.nnz);
    ops::check_gpu_index(*src.pos_ids, src.pos_name);
    p.pos_ids = src.pos_ids->data_as<const int>();
  } else {
    detail::check_i32_vector(*src.indptr, "indptr", -1);
    if (!(src.indptr->size(0) >= 1)) {
      fail("indptr: expected batch + 1 >= 1 entries, got shape ", src.indptr->shape_str());
    }
    p.batch = static_cast<int>(src.indptr->size(0) - 1);
    detail::check_i32_vector(*src.offsets, "offsets", p.batch);
    ops::check_gpu_index(*src.indptr, "indptr");
    ops::check_gpu_index(*src.offsets, "offsets");
    p.indptr = src.indptr->data_as<const int>();
    p.offsets = src.offsets->data_as<const int>();
  }
  // Positions come from pos_ids: nothing to check or write without rows. From indptr, one CTA
  // still runs to check indptr's ends (an indptr that claims rows nnz = 0 does not have).
  if (s.nnz == 0 && p.pos_ids != nullptr) return;

  const int device = q.device().index;
  const int rotary_dim = spec.rotary_dim;
  const int vec = rope_vector_width(q, k, q_rope, k_rope, rotary_dim);
  p.q = q.data();
  p.k = k.data();
  p.q_out = q_rope.data();
  p.k_out = k_rope.data();
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.k_stride_n = k.stride(0);
  p.k_stride_h = k.stride(1);
  p.qo_stride_n = q_rope.stride(0);
  p.qo_stride_h = q_rope.stride(1);
  p.ko_stride_n = k_rope.stride(0);
  p.ko_stride_h = k_rope.stride(1);
  p.nnz = s.nnz;
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  // In place the tail is already where it belongs. (With only one of q, k in place, that one's
  // tail is copied onto itself by the thread that reads it: harmless.)
  p.copy_tail = (q_rope.data() == q.data() && k_rope.data() == k.data()) ? 0 : 1;
  p.op = op;
  p.rope = spec;

  // Threads of one token: `units` (vectors of pairs) x `head_lanes`; enough tokens per CTA to
  // fill kRopeThreads. More head lanes give a small batch (decode) parallelism; cos/sin are
  // computed once per (token, pair) whatever the lanes.
  const int units = rotary_dim / (2 * vec);
  const int heads = std::max(1, s.num_qo_heads + s.num_kv_heads);
  p.head_lanes = std::clamp(kRopeThreads / units, 1, heads);
  p.threads_per_token = units * p.head_lanes;
  const int tokens_per_cta = std::max(1, kRopeThreads / p.threads_per_token);
  const int64_t ctas = std::max<int64_t>(1, (s.nnz + tokens_per_cta - 1) / tokens_per_cta);
  check(ctas <= INT32_MAX, op_name, ": ", s.nnz, " rows are too many for one launch");
  const unsigned smem =
      static_cast<unsigned>(tokens_per_cta * (rotary_dim / 2) * 2 * sizeof(float));

  const ops::KernelSpec ks = ops::rope_kernel_spec(q.dtype());
  const auto& mod = runtime::KernelCache::instance().module(ks.id, device, ks.make);
  p.error = runtime::device_error_record(device);
  runtime::ensure_context(device);  // a cached module may have been loaded by another thread
  void* args[] = {&p};
  runtime::launch(mod.function(kernel_name(q.dtype(), vec, spec.interleave != 0)),
                  {static_cast<unsigned>(ctas), 1, 1,
                   static_cast<unsigned>(tokens_per_cta * p.threads_per_token), 1, 1, smem},
                  stream, args, op_name);
  runtime::check_device_errors_if_debug(device, stream);
}

// Llama / Llama 3.1 on the GPU: the frequency table of `opts`.
template <class Options>
void gpu_rope_freq(const char* op_name, int op, const TensorView& q, const TensorView& k,
                   const TensorView& q_rope, const TensorView& k_rope, const PositionSource& src,
                   const Options& opts, Stream stream) {
  const int rotary_dim =
      detail::resolve_rotary_dim(opts.rotary_dim, static_cast<int>(q.size(2)), "rotary_dim");
  const RopeSpec spec =
      ops::make_rope_spec(rotary_dim, rope_frequencies(rotary_dim, opts), opts.interleave);
  gpu_rope(op_name, op, q, k, q_rope, k_rope, src, spec, stream);
}

}  // namespace

namespace ops {
KernelSpec rope_kernel_spec(DType t) {
  const std::string id = std::string("rope<") + dtype_name(t) + ">";
  const int vec = 16 / static_cast<int>(dtype_size(t));
  std::vector<std::string> names;
  for (int v : {vec, 1})
    for (bool interleave : {false, true}) names.push_back(kernel_name(t, v, interleave));
  return {id, [id, names] { return make_request(id, "kv/rope.cuh", names); }};
}
}  // namespace ops

void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                const TensorView& k_rope, const TensorView& indptr, const TensorView& offsets,
                const RopeOptions& opts, Stream stream) {
  const Device dev = rope_device(q, k, q_rope, k_rope, indptr, "indptr", offsets, "offsets");
  if (dev.is_cpu()) return reference::apply_rope(q, k, q_rope, k_rope, indptr, offsets, opts);
  gpu_rope_freq("apply_rope", kDeviceOpApplyRope, q, k, q_rope, k_rope,
                {.indptr = &indptr, .offsets = &offsets}, opts, stream);
}

void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& pos_ids,
                        const RopeOptions& opts, Stream stream) {
  const Device dev = rope_device(q, k, q_rope, k_rope, pos_ids, "pos_ids");
  if (dev.is_cpu()) return reference::apply_rope_pos_ids(q, k, q_rope, k_rope, pos_ids, opts);
  gpu_rope_freq("apply_rope_pos_ids", kDeviceOpApplyRopePosIds, q, k, q_rope, k_rope,
                {.pos_ids = &pos_ids}, opts, stream);
}

void apply_llama31_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                        const TensorView& k_rope, const TensorView& indptr,
                        const TensorView& offsets, const Llama31RopeOptions& opts, Stream stream) {
  const Device dev = rope_device(q, k, q_rope, k_rope, indptr, "indptr", offsets, "offsets");
  if (dev.is_cpu()) {
    return reference::apply_llama31_rope(q, k, q_rope, k_rope, indptr, offsets, opts);
  }
  gpu_rope_freq("apply_llama31_rope", kDeviceOpApplyLlama31Rope, q, k, q_rope, k_rope,
                {.indptr = &indptr, .offsets = &offsets}, opts, stream);
}

void apply_llama31_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                const TensorView& k_rope, const TensorView& pos_ids,
                                const Llama31RopeOptions& opts, Stream stream) {
  const Device dev = rope_device(q, k, q_rope, k_rope, pos_ids, "pos_ids");
  if (dev.is_cpu()) {
    return reference::apply_llama31_rope_pos_ids(q, k, q_rope, k_rope, pos_ids, opts);
  }
  gpu_rope_freq("apply_llama31_rope_pos_ids", kDeviceOpApplyLlama31RopePosIds, q, k, q_rope, k_rope,
                {.pos_ids = &pos_ids}, opts, stream);
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
  ops::require_cuda("apply_rope_with_cos_sin_cache", dev);
  detail::check_cos_sin_cache(cos_sin_cache, static_cast<int>(q.size(2)));
  const RopeSpec spec = ops::make_rope_spec_cache(cos_sin_cache, /*interleave=*/!is_neox);
  gpu_rope("apply_rope_with_cos_sin_cache", kDeviceOpApplyRopeCosSinCache, q, k, q_rope, k_rope,
           {.pos_ids = &positions, .pos_name = "positions"}, spec, stream);
}

}  // namespace flashkv
