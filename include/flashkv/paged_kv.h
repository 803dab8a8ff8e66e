// The paged KV cache description (pages as the rows of a block-sparse matrix, the FlashInfer
// paper's format; docs/design.md "Kernel keys": page size).
//
// A request's KV is the concatenation of its pages kv_indices[kv_indptr[i] .. kv_indptr[i+1]),
// all full except the last, which holds kv_last_page_len[i] tokens. A request with no pages
// (kv_indptr[i] == kv_indptr[i+1]) has kv_len 0; its kv_last_page_len entry is then ignored.
//
// Storage layouts (one page, in elements):
//   NHD: k[page][token][kv_head][dim]   (vLLM / SGLang default)
//   HND: k[page][kv_head][token][dim]
// K and V are separate tensors of shape [num_pages, page_size, H_kv, D] (NHD) or
// [num_pages, H_kv, page_size, D] (HND), or one interleaved tensor [num_pages, 2, ...]
// (FlashInfer's convention) split by PagedKVCache::interleaved().
#pragma once

#include <cstdint>
#include <string>

#include "flashkv/attention.h"
#include "flashkv/tensor.h"

namespace flashkv {

enum class KVLayout : uint8_t { NHD, HND };
const char* kv_layout_name(KVLayout l);
KVLayout parse_kv_layout(const std::string& name);  // "NHD" / "HND" (case-insensitive)

// head_dim values the GPU kernels support. The CPU reference accepts any head_dim.
inline constexpr int kSupportedHeadDims[] = {64, 128, 256};
bool is_supported_head_dim(int head_dim);

// How the plan checks' messages name the page-table arrays (plan_checks.h; the plan options'
// `names`): the C++ API's names by default; the Python wrappers pass FlashInfer's argument names.
struct PageTableNames {
  const char* qo_indptr = "qo_indptr";
  const char* kv_indptr = "kv_indptr";
  const char* kv_indices = "kv_indices";
  const char* kv_last_page_len = "kv_last_page_len";
};

struct PagedKVCache {
  TensorView k;  // [num_pages, page_size, H_kv, D] (NHD) or [num_pages, H_kv, page_size, D] (HND)
  TensorView v;  // same shape, dtype and device as k
  KVLayout layout = KVLayout::NHD;
  TensorView indptr;         // i32 [batch + 1], indptr[0] == 0, non-decreasing
  TensorView indices;        // i32 [indptr[batch]] page ids in [0, num_pages)
  TensorView last_page_len;  // i32 [batch], 1 <= last_page_len <= page_size for non-empty requests
  // Dequantization scales of an fp8 cache (attention.h): read by every op that reads the cache,
  // and divided by when append_paged_kv_cache or the fused decode step quantizes into it. A
  // quantized format (scale.format, kv_quant.h) adds its group-scale pools here: k and v then hold
  // the format's values (u8 pairs for INT4 / NVFP4: the last dimension is head_dim / 2).
  KVScale scale;

  // Splits one interleaved tensor kv[num_pages, 2, ...] into the k and v views.
  static PagedKVCache interleaved(const TensorView& kv, KVLayout layout, const TensorView& indptr,
                                  const TensorView& indices, const TensorView& last_page_len);

  int64_t num_pages() const { return k.size(0); }
  int page_size() const;
  int num_kv_heads() const;
  int head_dim() const;  // elements, not bytes: twice k.size(3) for the packed formats
  int batch_size() const { return static_cast<int>(indptr.size(0)) - 1; }
  // Element strides of k/v: between pages, between tokens of a page, between heads.
  int64_t page_stride() const { return k.stride(0); }
  int64_t token_stride() const { return layout == KVLayout::NHD ? k.stride(1) : k.stride(2); }
  int64_t head_stride() const { return layout == KVLayout::NHD ? k.stride(2) : k.stride(1); }

  // Shapes, dtypes and devices of every tensor. Cheap, touches no data.
  void validate_shapes() const;
  // validate_shapes() plus every index invariant (monotone indptr, indices in range,
  // last_page_len in [1, page_size]). The index tensors must be on the host.
  void validate() const;
  // kv_len of request i (index tensors on the host).
  int64_t kv_len(int i) const;
};

// kv_len of request i from raw host page-table arrays.
inline int64_t paged_kv_len(const int32_t* indptr, const int32_t* last_page_len, int page_size,
                            int i) {
  const int64_t pages = indptr[i + 1] - indptr[i];
  return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[i];
}

// The group-scale pools of a quantized cache (kv_quant.h) against the cache `kv` (its layout,
// pages, page size, heads, head_dim, element dtype): each pool defined where the format has it
// (and only there), the shape of kv.k with head_dim replaced by the group count, a scale dtype the
// format takes, the cache's device; on the host also every entry (scales finite and >= 0, zero
// points finite). On a CUDA cache: NotImplementedError (no kernel reads these formats yet).
// Called by validate_shapes().
void check_kv_group_scales(const PagedKVCache& kv, const char* name = "paged_kv.scale");

// Checks num_qo_heads / num_kv_heads for GQA/MQA: both positive and H_qo divisible by H_kv.
void check_heads(int num_qo_heads, int num_kv_heads);

}  // namespace flashkv
