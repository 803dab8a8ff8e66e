// Paged KV cache description: layout helpers and the validation every op runs before it trusts a
// page table. A bad page id in a kernel is a silent out-of-bounds read, so validate() checks
// every invariant the kernels rely on and names the first entry that breaks one.
#include "flashkv/paged_kv.h"

#include <algorithm>
#include <cctype>

#include "flashkv/error.h"

namespace flashkv {
namespace {

// Element i of a 1-D i32 host tensor (strided views are fine).
int64_t at(const TensorView& t, int64_t i) { return t.data_as<const int32_t>()[i * t.stride(0)]; }

void check_index_tensor(const TensorView& t, const char* name) {
  check_defined(t, name);
  check_dtype(t, name, DType::i32);
  check_ndim(t, name, 1);
}

void check_on_host(const TensorView& t, const char* name) {
  if (!(t.device().is_cpu())) {
    fail(name, ": expected device cpu, got ", t.device().str(),
         " (the page table is read on the host; pass a host copy)");
  }
}

}  // namespace

const char* kv_layout_name(KVLayout l) { return l == KVLayout::NHD ? "NHD" : "HND"; }

KVLayout parse_kv_layout(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper == "NHD") return KVLayout::NHD;
  if (upper == "HND") return KVLayout::HND;
  fail("unknown kv layout '", name, "': expected NHD or HND");
}

bool is_supported_head_dim(int head_dim) {
  return std::find(std::begin(kSupportedHeadDims), std::end(kSupportedHeadDims), head_dim) !=
         std::end(kSupportedHeadDims);
}

PagedKVCache PagedKVCache::interleaved(const TensorView& kv, KVLayout layout,
                                       const TensorView& indptr, const TensorView& indices,
                                       const TensorView& last_page_len) {
  check_defined(kv, "paged_kv.kv");
  check_shape(kv, "paged_kv.kv", {-1, 2, -1, -1, -1});
  // k and v share the page, token and head strides; v starts one kv.stride(1) further on.
  const int64_t shape[4] = {kv.size(0), kv.size(2), kv.size(3), kv.size(4)};
  const int64_t strides[4] = {kv.stride(0), kv.stride(2), kv.stride(3), kv.stride(4)};
  void* v_data = kv.data() == nullptr
                     ? nullptr
                     : static_cast<char*>(kv.data()) +
                           kv.stride(1) * static_cast<int64_t>(dtype_size(kv.dtype()));
  PagedKVCache c;
  c.k = TensorView(kv.data(), kv.dtype(), 4, shape, strides, kv.device());
  c.v = TensorView(v_data, kv.dtype(), 4, shape, strides, kv.device());
  c.layout = layout;
  c.indptr = indptr;
  c.indices = indices;
  c.last_page_len = last_page_len;
  return c;
}

int PagedKVCache::page_size() const {
  return static_cast<int>(layout == KVLayout::NHD ? k.size(1) : k.size(2));
}

int PagedKVCache::num_kv_heads() const {
  return static_cast<int>(layout == KVLayout::NHD ? k.size(2) : k.size(1));
}

int PagedKVCache::head_dim() const {
  return static_cast<int>(k.size(3)) * (scale.format.packed() ? 2 : 1);
}

void PagedKVCache::validate_shapes() const {
  check(layout == KVLayout::NHD || layout == KVLayout::HND, "paged_kv.layout: invalid value ",
        static_cast<int>(layout), ": expected NHD or HND");
  check_defined(k, "paged_kv.k");
  check_defined(v, "paged_kv.v");
  check_ndim(k, "paged_kv.k", 4);
  check_dtype_in(k, "paged_kv.k",
                 {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::u8});
  check(k.dtype() != DType::u8 || scale.format.packed(), "paged_kv.k: a u8 cache holds packed ",
        "4-bit values: expected paged_kv.scale.format int4 or nvfp4 (kv_quant.h), got ",
        kv_format_name(scale.format, k.dtype()));
  check(v.dtype() == k.dtype(), "paged_kv.v: expected dtype ", dtype_name(k.dtype()),
        " (same as paged_kv.k), got ", dtype_name(v.dtype()));
  if (!(v.ndim() == 4 && v.size(0) == k.size(0) && v.size(1) == k.size(1) &&
        v.size(2) == k.size(2) && v.size(3) == k.size(3))) {
    fail("paged_kv.v: expected shape ", k.shape_str(), " (same as paged_kv.k), got ",
         v.shape_str());
  }
  if (!(v.device() == k.device())) {
    fail("paged_kv.v: expected device ", k.device().str(), " (same as paged_kv.k), got ",
         v.device().str());
  }
  // Kernels address k and v with one set of strides (page_stride() etc. come from k).
  for (int d = 0; d < 4; ++d) {
    check(v.stride(d) == k.stride(d) || v.size(d) <= 1, "paged_kv.v: stride(", d,
          ") = ", v.stride(d), " differs from paged_kv.k stride(", d, ") = ", k.stride(d),
          ": k and v must share one ", kv_layout_name(layout), " layout");
  }
  if (!(page_size() >= 1)) {
    fail("paged_kv.k: page_size must be >= 1, got ", page_size(), " (shape ", k.shape_str(),
         ", layout ", kv_layout_name(layout), ")");
  }
  if (!(num_kv_heads() >= 1)) {
    fail("paged_kv.k: num_kv_heads must be >= 1, got ", num_kv_heads(), " (shape ", k.shape_str(),
         ", layout ", kv_layout_name(layout), ")");
  }
  // Group scales first: on the GPU they are the NotImplementedError, whatever else is wrong.
  if (scale.has_group_scales()) check_kv_group_scales(*this, "paged_kv.scale");
  check_kv_scale(scale.base(), k.dtype(), num_kv_heads(), k.device(), k.device().is_cuda(),
                 "paged_kv.scale");
  check(head_dim() >= 1, "paged_kv.k: head_dim must be >= 1, got ", head_dim());
  check_last_dim_contiguous(k, "paged_kv.k");
  check_last_dim_contiguous(v, "paged_kv.v");

  check_index_tensor(indptr, "paged_kv.indptr");
  check_index_tensor(indices, "paged_kv.indices");
  check_index_tensor(last_page_len, "paged_kv.last_page_len");
  if (!(indptr.size(0) >= 1)) {
    fail(
        "paged_kv.indptr: expected shape [batch + 1] with at least 1 entry, "
        "got ",
        indptr.shape_str());
  }
  if (!(last_page_len.size(0) == batch_size())) {
    fail("paged_kv.last_page_len: expected shape [", batch_size(),
         "] (batch, from paged_kv.indptr ", indptr.shape_str(), "), got ",
         last_page_len.shape_str());
  }
}

void PagedKVCache::validate() const {
  validate_shapes();
  check_on_host(indptr, "paged_kv.indptr");
  check_on_host(indices, "paged_kv.indices");
  check_on_host(last_page_len, "paged_kv.last_page_len");

  const int batch = batch_size();
  check(at(indptr, 0) == 0, "paged_kv.indptr[0] = ", at(indptr, 0), ": expected 0");
  for (int i = 1; i <= batch; ++i) {
    check(at(indptr, i) >= at(indptr, i - 1), "paged_kv.indptr[", i, "] = ", at(indptr, i),
          " is less than paged_kv.indptr[", i - 1, "] = ", at(indptr, i - 1),
          ": expected non-decreasing");
  }
  const int64_t nnz = at(indptr, batch);
  check(indices.size(0) >= nnz, "paged_kv.indices: has ", indices.size(0),
        " entries, but paged_kv.indptr[", batch, "] = ", nnz, " needs at least ", nnz);

  const int64_t pages = num_pages();
  for (int64_t j = 0; j < nnz; ++j) {
    const int64_t page = at(indices, j);
    check(page >= 0 && page < pages, "paged_kv.indices[", j, "] = ", page,
          " is out of range: expected 0 <= index < ", pages, " (num_pages)");
  }
  const int ps = page_size();
  for (int i = 0; i < batch; ++i) {
    const int64_t n = at(indptr, i + 1) - at(indptr, i);
    if (n == 0) continue;  // empty request: last_page_len is ignored
    const int64_t len = at(last_page_len, i);
    check(len >= 1 && len <= ps, "paged_kv.last_page_len[", i, "] = ", len,
          " is out of range: expected 1 <= last_page_len <= ", ps, " (page_size) for request ", i,
          " with ", n, " pages");
  }
}

int64_t PagedKVCache::kv_len(int i) const {
  check(i >= 0 && i < batch_size(), "paged_kv.kv_len: request ", i,
        " is out of range: expected 0 <= i < ", batch_size(), " (batch)");
  check_on_host(indptr, "paged_kv.indptr");
  check_on_host(last_page_len, "paged_kv.last_page_len");
  const int64_t pages = at(indptr, i + 1) - at(indptr, i);
  return pages == 0 ? 0 : (pages - 1) * page_size() + at(last_page_len, i);
}

void check_heads(int num_qo_heads, int num_kv_heads) {
  check(num_qo_heads > 0 && num_kv_heads > 0, "num_qo_heads = ", num_qo_heads,
        " and num_kv_heads = ", num_kv_heads, ": both must be positive");
  check(num_qo_heads % num_kv_heads == 0, "num_qo_heads = ", num_qo_heads,
        " is not divisible by num_kv_heads = ", num_kv_heads,
        ": expected a whole number of query heads per KV head (GQA/MQA)");
}

}  // namespace flashkv
