// KV-cache ops: writing new tokens' keys and values into a paged cache (FlashInfer's
// append_paged_kv_cache and get_batch_indices_positions). Includes rope.h, so this one header
// gives the per-layer ops an engine runs before attention: RoPE, then the append.
//
// Append. The new tokens are ragged: append_key / append_value [nnz, H_kv, D] (any row/head
// strides, last dimension contiguous), f16/bf16/f32, the dtype of the cache; or, into an fp8
// cache (e4m3 / e5m2), f16/bf16/f32 rows that are quantized on the way in: each element becomes
// float(x) / scale (an f32 division, scale = paged_kv.scale's k or v factor for its KV head,
// attention.h) rounded to nearest even and saturated to the format's largest finite value (e5m2's
// infinities too), NaN staying NaN: bit for bit float_to_e4m3 / float_to_e5m2 (dtype.h). fp8 rows
// into an fp8 cache of their dtype are copied as they are. Token t goes to
// request b = batch_indices[t] at position p = positions[t] (both i32 [nnz]), i.e. to slot
// p % page_size of page paged_kv.indices[paged_kv.indptr[b] + p / page_size].
// `paged_kv` describes the cache AFTER the append, as in FlashInfer: the caller has already
// allocated the pages and set last_page_len so that kv_len(b) counts the new tokens. A token with
// p >= kv_len(b) (it would write past the request's pages, or past its counted tokens) is an error
// and is not written (host: nothing at all is; GPU: that token is skipped, see Devices); so are b
// outside [0, batch), p < 0, and (host only) two tokens that would write the same slot. Slots no
// token names are left as they were. NHD/HND, separate or interleaved k/v
// (PagedKVCache::interleaved), as paged_kv.h describes.
//
// Batch indices and positions (FlashInfer semantics). append_indptr i32 [batch + 1] splits the
// nnz new tokens by request (0, non-decreasing); seq_lens i32 [batch] are the requests' KV
// lengths after the append (seq_lens[i] >= append_len(i) = append_indptr[i+1] - append_indptr[i]).
// Token j of request i (row append_indptr[i] + j) gets
//   batch_indices = i,   positions = seq_lens[i] - append_len(i) + j.
//
// Devices: host tensors (page table included) run on the CPU reference (reference_kv_ops.h),
// which checks everything before writing anything. CUDA tensors (all on one device, page table
// included; index arrays contiguous) run JIT kernels (kernels/kv/append.cuh) on `stream`: no
// copy, no synchronization, safe to capture in a CUDA graph (after the first GPU call on the
// device, which allocates the error record: device_errors.h); elements are copied bit for bit
// with 16-byte vector accesses when pointers and strides allow. Shapes and dtypes are checked on
// the host (flashkv::Error naming the argument); the values of the device-resident arrays are
// checked by the kernel, per token (device_errors.h): a token with a batch index outside
// [0, batch), a position outside [0, kv_len(b)), a page-table entry out of range (indptr range,
// last_page_len, page id) is not written at all, and the first such error is raised by the next
// check_device_errors() (at once with FLASHKV_CHECK_DEVICE_ERRORS=1). The GPU path does NOT
// detect two tokens that write the same slot (which one wins is unspecified); the CPU reference
// does. get_batch_indices_positions on the GPU likewise reports an append_indptr that is not
// non-decreasing from 0 to nnz, or a seq_len shorter than its append, and leaves those rows
// unwritten.
#pragma once

#include "flashkv/host_tensor.h"
#include "flashkv/paged_kv.h"
#include "flashkv/rope.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"

namespace flashkv {

// Writes the new tokens' k and v into their pages (see above).
void append_paged_kv_cache(const TensorView& append_key, const TensorView& append_value,
                           const TensorView& batch_indices, const TensorView& positions,
                           const PagedKVCache& paged_kv, Stream stream = nullptr);

// Fills batch_indices and positions, i32 [nnz] each, nnz = append_indptr[batch] (see above).
void get_batch_indices_positions(const TensorView& append_indptr, const TensorView& seq_lens,
                                 const TensorView& batch_indices, const TensorView& positions,
                                 Stream stream = nullptr);

// The same on host inputs, returning new host tensors of `nnz` entries (nnz must equal
// append_indptr[batch]; FlashInfer takes it to size its outputs).
struct BatchIndicesPositions {
  HostTensor batch_indices;  // i32 [nnz]
  HostTensor positions;      // i32 [nnz]
};
BatchIndicesPositions get_batch_indices_positions(const TensorView& append_indptr,
                                                  const TensorView& seq_lens, int64_t nnz);

}  // namespace flashkv
