// Host side of the KV-cache append ops (kv_ops.h): shape checks, then the CPU reference for host
// tensors or the JIT kernels (kv/append.cuh) for CUDA tensors. The GPU path reads the page table,
// batch indices and positions only on the device, where the kernel validates them per token
// (device_errors.h): no copy, no synchronization, safe inside a CUDA graph.
#include <algorithm>

#include "core/kv_ops_checks.h"
#include "flashkv/error.h"
#include "flashkv/kv_ops.h"
#include "flashkv/reference_kv_ops.h"
#include "kv/append_params.cuh"
#include "ops/common/kv_scale_params.h"
#include "ops/jit/jit_util.h"
#include "ops/jit/kernel_specs.h"
#include "ops/kv/kv_gpu.h"
#include "runtime/device_errors.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"

namespace flashkv {
namespace {

constexpr unsigned kBatchPositionsThreads = 256;

// The copy kernel (rows in the cache's dtype) or, for rows of another dtype into an fp8 cache,
// the quantizing one.
std::string append_kernel_name(DType cache, DType src, int vec) {
  if (src == cache) {
    return std::string("flashkv::append_kernel<") + ops::device_type_name(cache, "paged_kv.k") +
           ", " + std::to_string(vec) + ">";
  }
  return std::string("flashkv::append_quantize_kernel<") +
         ops::device_type_name(src, "append_key") + ", " +
         ops::device_type_name(cache, "paged_kv.k") + ", " + std::to_string(vec) + ">";
}

void gpu_append(const TensorView& append_key, const TensorView& append_value,
                const TensorView& batch_indices, const TensorView& positions,
                const PagedKVCache& kv, int64_t nnz, Stream stream) {
  ops::require_cuda("append_paged_kv_cache", kv.k.device());
  ops::check_gpu_index(batch_indices, "batch_indices");
  ops::check_gpu_index(positions, "positions");
  ops::check_gpu_index(kv.indptr, "paged_kv.indptr");
  ops::check_gpu_index(kv.indices, "paged_kv.indices");
  ops::check_gpu_index(kv.last_page_len, "paged_kv.last_page_len");
  if (nnz == 0) return;
  const int device = kv.k.device().index;
  const DType dt = kv.k.dtype();
  const DType src = append_key.dtype();  // dt, or a wider type an fp8 cache quantizes
  const int heads = kv.num_kv_heads(), dim = kv.head_dim(), page_size = kv.page_size();
  // Strides of dimensions of size 1 are never stepped over: they need not divide the vector.
  auto step = [](int64_t size, int64_t stride) { return size > 1 ? stride : 0; };
  // Vectors of 16 bytes of the rows (the quantizing kernel then writes 4 or 8 bytes).
  const int vec =
      ops::vector_width(src, {&append_key, &append_value, &kv.k, &kv.v},
                        {dim, step(nnz, append_key.stride(0)), step(heads, append_key.stride(1)),
                         step(nnz, append_value.stride(0)), step(heads, append_value.stride(1)),
                         step(kv.num_pages(), kv.page_stride()), step(page_size, kv.token_stride()),
                         step(heads, kv.head_stride())});

  AppendParams p{};
  p.key = append_key.data();
  p.value = append_value.data();
  p.key_stride_n = append_key.stride(0);
  p.key_stride_h = append_key.stride(1);
  p.value_stride_n = append_value.stride(0);
  p.value_stride_h = append_value.stride(1);
  p.batch_indices = batch_indices.data_as<const int>();
  p.positions = positions.data_as<const int>();
  p.k = kv.k.data();
  p.v = kv.v.data();
  p.page_stride = kv.page_stride();
  p.token_stride = kv.token_stride();
  p.head_stride = kv.head_stride();
  p.kv_indptr = kv.indptr.data_as<const int>();
  p.kv_indices = kv.indices.data_as<const int>();
  p.kv_last_page_len = kv.last_page_len.data_as<const int>();
  p.nnz = nnz;
  p.num_indices = kv.indices.size(0);
  p.num_pages = kv.num_pages();
  p.batch = kv.batch_size();
  p.page_size = page_size;
  p.num_heads = heads;
  p.head_dim = dim;
  p.scale = ops::kv_scale_params(kv.scale);  // checked by validate_shapes
  // One token's rows are heads * dim / vec vectors (of k, and as many of v); tokens whose rows
  // are short share a CTA.
  const int64_t row_units = static_cast<int64_t>(heads) * (dim / vec);
  p.threads_per_token = static_cast<int>(std::min<int64_t>(kAppendThreads, row_units));
  const int tokens_per_cta = std::max(1, kAppendThreads / p.threads_per_token);
  const int64_t ctas = (nnz + tokens_per_cta - 1) / tokens_per_cta;
  check(ctas <= INT32_MAX, "append_paged_kv_cache: ", nnz, " tokens are too many for one launch");

  const ops::KernelSpec ks = ops::kv_append_kernel_spec(dt, src);
  const auto& mod = runtime::KernelCache::instance().module(ks.id, device, ks.make);
  p.error = runtime::device_error_record(device);
  runtime::ensure_context(device);  // a cached module may have been loaded by another thread
  void* args[] = {&p};
  runtime::launch(mod.function(append_kernel_name(dt, src, vec)),
                  {static_cast<unsigned>(ctas), 1, 1,
                   static_cast<unsigned>(tokens_per_cta * p.threads_per_token), 1, 1, 0},
                  stream, args, "append_paged_kv_cache");
  runtime::check_device_errors_if_debug(device, stream);
}

void gpu_batch_indices_positions(const TensorView& append_indptr, const TensorView& seq_lens,
                                 const TensorView& batch_indices, const TensorView& positions,
                                 Stream stream) {
  ops::require_cuda("get_batch_indices_positions", append_indptr.device());
  for (auto [t, name] : {std::pair{&append_indptr, "append_indptr"},
                         {&seq_lens, "seq_lens"},
                         {&batch_indices, "batch_indices"},
                         {&positions, "positions"}}) {
    ops::check_gpu_index(*t, name);
  }
  const int device = append_indptr.device().index;
  const int64_t nnz = batch_indices.size(0);
  // At least one thread: it checks append_indptr's ends even when there are no rows.
  const int64_t ctas =
      std::max<int64_t>(1, (nnz + kBatchPositionsThreads - 1) / kBatchPositionsThreads);
  check(ctas <= INT32_MAX, "get_batch_indices_positions: ", nnz, " rows are too many");
  const ops::KernelSpec ks = ops::batch_indices_positions_kernel_spec();
  const auto& mod = runtime::KernelCache::instance().module(ks.id, device, ks.make);
  DeviceErrorRecord* error = runtime::device_error_record(device);
  runtime::ensure_context(device);
  const int* indptr = append_indptr.data_as<const int>();
  const int* lens = seq_lens.data_as<const int>();
  int batch = static_cast<int>(append_indptr.size(0) - 1);
  int* bi = batch_indices.data_as<int>();
  int* pos = positions.data_as<int>();
  long long n = nnz;
  void* args[] = {&indptr, &lens, &batch, &bi, &pos, &n, &error};
  runtime::launch(mod.function("flashkv::batch_indices_positions_kernel"),
                  {static_cast<unsigned>(ctas), 1, 1, kBatchPositionsThreads, 1, 1, 0}, stream,
                  args, "get_batch_indices_positions");
  runtime::check_device_errors_if_debug(device, stream);
}

}  // namespace

namespace ops {
KernelSpec kv_append_kernel_spec(DType cache, DType src) {
  const std::string id = std::string("kv_append<") + dtype_name(cache) +
                         (src == cache ? std::string() : std::string(",") + dtype_name(src)) + ">";
  const int vec = 16 / static_cast<int>(dtype_size(src));
  std::vector<std::string> names = {append_kernel_name(cache, src, vec),
                                    append_kernel_name(cache, src, 1)};
  return {id, [id, names] { return make_request(id, "kv/append.cuh", names); }};
}

KernelSpec batch_indices_positions_kernel_spec() {
  const std::string id = "batch_indices_positions";
  return {id, [id] {
            return make_request(id, "kv/append.cuh", {"flashkv::batch_indices_positions_kernel"});
          }};
}
}  // namespace ops

void append_paged_kv_cache(const TensorView& append_key, const TensorView& append_value,
                           const TensorView& batch_indices, const TensorView& positions,
                           const PagedKVCache& paged_kv, Stream stream) {
  const int64_t nnz =
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
  gpu_append(append_key, append_value, batch_indices, positions, paged_kv, nnz, stream);
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
  gpu_batch_indices_positions(append_indptr, seq_lens, batch_indices, positions, stream);
}

BatchIndicesPositions get_batch_indices_positions(const TensorView& append_indptr,
                                                  const TensorView& seq_lens, int64_t nnz) {
  check(nnz >= 0, "nnz = ", nnz, ": expected >= 0");
  BatchIndicesPositions r{HostTensor(DType::i32, {nnz}), HostTensor(DType::i32, {nnz})};
  get_batch_indices_positions(append_indptr, seq_lens, r.batch_indices.view(), r.positions.view());
  return r;
}

}  // namespace flashkv
