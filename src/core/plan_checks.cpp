// plan()'s argument checks, shared by the GPU ops and the Python wrappers' host path
// (flashkv/plan_checks.h). Host code only: no GPU, no CUDA driver.
#include "flashkv/plan_checks.h"

#include <algorithm>

#include "flashkv/error.h"

namespace flashkv {
namespace {

void check_plan_dtypes(DType q, DType kv, DType o, PlanTarget target, const char* q_name,
                       const char* kv_name, const char* o_name, const KVQuantFormat& kv_format = {},
                       int head_dim = 0) {
  const bool gpu = target == PlanTarget::kGpu;
  check(q == DType::f16 || q == DType::bf16 || (!gpu && q == DType::f32), q_name,
        gpu ? ": expected f16 or bf16, got "
            : ": expected f16, bf16 or f32 (f32: CPU reference only), got ",
        dtype_name(q));
  // KV in q's dtype, or an fp8 cache (widened to q's dtype in the kernels; attention.h: KVScale),
  // or a quantized format (kv_quant.h), whose element dtype is the format's.
  if (!kv_format.is_none()) {
    check_kv_quant_plan(kv_format, kv, head_dim, target);
  } else if (is_fp8_dtype(kv)) {
    check(q != DType::f32, kv_name, ": an fp8 cache (", dtype_name(kv), ") takes f16 or bf16 ",
          "queries, got ", q_name, " ", dtype_name(q));
  } else {
    check(kv == q, kv_name, ": expected ", dtype_name(q),
          " (the q dtype) or an fp8 dtype (e4m3, e5m2), got ", dtype_name(kv));
  }
  check(o == q, o_name, ": expected ", dtype_name(q), " (the q dtype), got ", dtype_name(o));
}

void check_shape_args(int num_qo_heads, int num_kv_heads, int head_dim, int max_group) {
  check_heads(num_qo_heads, num_kv_heads);
  check(is_supported_head_dim(head_dim), "head_dim: expected 64, 128 or 256, got ", head_dim);
  const int group = num_qo_heads / num_kv_heads;
  check(group <= max_group, "num_qo_heads / num_kv_heads: expected a GQA group of at most ",
        max_group, ", got ", group);
}

// indptr[0 .. batch] from 0 and non-decreasing.
void check_indptr(const int32_t* indptr, int batch, const char* name) {
  check(indptr != nullptr, name, ": expected a host array of batch_size + 1 entries, got null");
  check(batch == 0 || indptr[0] == 0, name, "[0]: expected 0, got ", indptr[0]);
  for (int i = 0; i < batch; ++i) {
    check(indptr[i + 1] >= indptr[i], name, "[", i + 1, "] = ", indptr[i + 1],
          ": expected >= ", name, "[", i, "] = ", indptr[i]);
  }
}

// A page table: kv_indptr and kv_last_page_len in [1, page_size] for every request with pages.
void check_page_table(const int32_t* kv_indptr, const int32_t* kv_last_page_len, int batch,
                      int page_size, const PageTableNames& n) {
  check(page_size >= 1, "page_size: expected >= 1, got ", page_size);
  check_indptr(kv_indptr, batch, n.kv_indptr);
  check(batch == 0 || kv_last_page_len != nullptr, n.kv_last_page_len,
        ": expected a host array of batch_size entries, got null");
  for (int i = 0; i < batch; ++i) {
    const bool empty = kv_indptr[i + 1] == kv_indptr[i];
    check(empty || (kv_last_page_len[i] >= 1 && kv_last_page_len[i] <= page_size),
          n.kv_last_page_len, "[", i, "] = ", kv_last_page_len[i],
          ": expected 1 <= value <= ", page_size, " (page_size) for request ", i, " with ",
          kv_indptr[i + 1] - kv_indptr[i], " pages");
  }
}

}  // namespace

void check_decode_plan(const int32_t* kv_indptr, const int32_t* kv_last_page_len, int batch_size,
                       int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
                       DType q_dtype, DType kv_dtype, DType o_dtype, PlanTarget target,
                       const PageTableNames& names, const KVQuantFormat& kv_format) {
  check(batch_size >= 0, "batch_size: expected >= 0, got ", batch_size);
  check_shape_args(num_qo_heads, num_kv_heads, head_dim, kMaxDecodeGroup);
  check_plan_dtypes(q_dtype, kv_dtype, o_dtype, target, "q_dtype", "kv_dtype", "o_dtype", kv_format,
                    head_dim);
  check_page_table(kv_indptr, kv_last_page_len, batch_size, page_size, names);
}

void check_prefill_plan(const int32_t* qo_indptr, const int32_t* kv_indptr,
                        const int32_t* kv_last_page_len, int batch_size, int num_qo_heads,
                        int num_kv_heads, int head_dim, int page_size, bool paged, DType q_dtype,
                        DType kv_dtype, DType o_dtype, PlanTarget target,
                        const PageTableNames& names, const KVQuantFormat& kv_format) {
  check(batch_size >= 0, "batch_size: expected >= 0, got ", batch_size);
  check_shape_args(num_qo_heads, num_kv_heads, head_dim, kMaxPrefillGroup);
  check(paged || kv_format.is_none(), "kv_format: ", kv_format_name(kv_format, kv_dtype),
        " is read from a paged cache only (its scale pools share the page ids); ragged KV takes ",
        "f16 / bf16 or fp8 with per-tensor / per-head scales");
  check_plan_dtypes(q_dtype, kv_dtype, o_dtype, target, "q_dtype", "kv_dtype", "o_dtype", kv_format,
                    head_dim);
  check_indptr(qo_indptr, batch_size, names.qo_indptr);
  if (paged) {
    check_page_table(kv_indptr, kv_last_page_len, batch_size, page_size, names);
  } else {
    check_indptr(kv_indptr, batch_size, names.kv_indptr);
  }
}

void check_kv_quant_plan(const KVQuantFormat& kv_format, DType kv_dtype, int head_dim,
                         PlanTarget target, const char* name) {
  if (kv_format.is_none()) return;
  check_kv_format(kv_format, kv_dtype, head_dim, name);
  if (target == PlanTarget::kGpu) {
    fail_not_implemented(name, ": ", kv_format_name(kv_format, kv_dtype),
                         " has no GPU kernel yet (issue 42): the GPU ops read f16 / bf16 caches ",
                         "and fp8 with per-tensor / per-head scales; the host path (CPU ",
                         "reference) reads this format");
  }
}

PageIdMax check_page_ids(const int32_t* kv_indices, int64_t n, int64_t num_pages,
                         const char* name) {
  PageIdMax m;
  if (n <= 0) return m;
  check(kv_indices != nullptr, name, ": expected a host array of ", n,
        " entries (kv_indptr[batch_size]), got null");
  // One pass that vectorizes (min and max); the entry is looked up only when it is needed.
  int32_t lo = kv_indices[0], hi = kv_indices[0];
  for (int64_t j = 1; j < n; ++j) {
    lo = std::min(lo, kv_indices[j]);
    hi = std::max(hi, kv_indices[j]);
  }
  const bool known = num_pages > 0;
  if (lo < 0 || (known && hi >= num_pages)) {
    for (int64_t j = 0; j < n; ++j) {
      const int32_t id = kv_indices[j];
      if (id < 0 || (known && id >= num_pages)) {
        if (known) {
          fail(name, "[", j, "] = ", id,
               " is out of range [0, num_pages): expected 0 <= page id < ", num_pages,
               " (num_pages)");
        }
        fail(name, "[", j, "] = ", id, " is out of range [0, num_pages): expected a page id >= 0");
      }
    }
  }
  m.id = hi;
  m.entry = std::find(kv_indices, kv_indices + n, hi) - kv_indices;
  return m;
}

void check_page_ids_fit(const PageIdMax& max, int64_t num_pages, const char* name) {
  if (max.entry < 0 || max.id < num_pages) return;
  fail(name, "[", max.entry, "] = ", max.id, " is out of range [0, num_pages): the paged KV cache ",
       "given to run() has ", num_pages, " pages (the page table is the one given to plan(); ",
       "nothing was launched)");
}

PageIdMax check_cascade_plan(const CascadeBatch& b, const CascadeShape& shape, PlanTarget target,
                             const PageTableNames& names) {
  check(b.batch_size >= 0, "batch_size: expected >= 0, got ", b.batch_size);
  check_shape_args(shape.num_qo_heads, shape.num_kv_heads, shape.head_dim,
                   b.qo_indptr == nullptr ? kMaxDecodeGroup : kMaxPrefillGroup);
  check_plan_dtypes(shape.dtype, shape.dtype, shape.dtype, target, "CascadeShape.dtype",
                    "CascadeShape.dtype", "CascadeShape.dtype");
  check_kv_quant_plan(shape.kv_format, shape.cache_dtype(), shape.head_dim, target,
                      "CascadeShape.kv_format");
  if (b.qo_indptr != nullptr) check_indptr(b.qo_indptr, b.batch_size, names.qo_indptr);
  check_page_table(b.kv_indptr, b.kv_last_page_len, b.batch_size, b.page_size, names);
  if (b.kv_indices == nullptr) return {};  // the caller checks them (check_page_ids)
  const int64_t nnz = b.batch_size > 0 ? b.kv_indptr[b.batch_size] : 0;
  return check_page_ids(b.kv_indices, nnz, 0, names.kv_indices);
}

std::pair<int64_t, int> check_contiguous_kv_heads(const TensorView& k, KVLayout layout,
                                                  int num_qo_heads) {
  check_defined(k, "k");
  const bool nhd = layout == KVLayout::NHD;
  const char* expected =
      nhd ? "[kv_len, num_kv_heads, head_dim]" : "[num_kv_heads, kv_len, head_dim]";
  if (!(k.ndim() == 3)) {
    fail("k: with kv_layout '", kv_layout_name(layout), "' expected ", expected, ", got shape ",
         k.shape_str());
  }
  const int64_t kv_len = k.size(nhd ? 0 : 1);
  const int64_t num_kv_heads = k.size(nhd ? 1 : 0);
  if (!(num_qo_heads > 0 && num_kv_heads > 0 && num_qo_heads % num_kv_heads == 0)) {
    fail("k: with kv_layout '", kv_layout_name(layout), "' expected ", expected, ", got shape ",
         k.shape_str(), ", which reads num_kv_heads = ", num_kv_heads,
         ": num_qo_heads = ", num_qo_heads, " is not divisible by num_kv_heads = ", num_kv_heads,
         " (expected a whole number of query heads per KV head; is kv_layout right?)");
  }
  return {kv_len, static_cast<int>(num_kv_heads)};
}

}  // namespace flashkv
