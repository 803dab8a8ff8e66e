#include "gpu/append_case.h"

#include <cstring>
#include <numeric>
#include <sstream>

#include "flashkv/device_errors.h"
#include "flashkv/kv_ops.h"
#include "flashkv/reference_kv_ops.h"

namespace flashkv::test {
namespace {

constexpr int64_t kSparePages = 3;  // pages no request owns: the append must leave them alone

std::vector<int64_t> storage_shape(const AppendCase& c, int64_t num_pages) {
  std::vector<int64_t> s = {num_pages};
  if (c.interleaved) s.push_back(2);
  if (c.layout == KVLayout::NHD) {
    s.insert(s.end(), {c.page_size, c.num_kv_heads, c.head_dim});
  } else {
    s.insert(s.end(), {c.num_kv_heads, c.page_size, c.head_dim});
  }
  return s;
}

// [nnz, H, D] view of rows stored [nnz, H, D + pad].
TensorView rows_view(const void* data, DType dt, int64_t nnz, int64_t heads, int64_t dim,
                     int64_t pad, Device dev) {
  return TensorView(const_cast<void*>(data), dt, {nnz, heads, dim},
                    {heads * (dim + pad), dim + pad, 1}, dev);
}

}  // namespace

std::string AppendCase::str() const {
  std::ostringstream os;
  os << dtype_name(dtype) << " H" << num_kv_heads << " D" << head_dim << " page " << page_size
     << " " << kv_layout_name(layout) << (interleaved ? " interleaved" : "") << " pad " << row_pad
     << " requests (old+new):";
  for (size_t i = 0; i < old_lens.size() && i < 8; ++i)
    os << " " << old_lens[i] << "+" << append_lens[i];
  if (old_lens.size() > 8) os << " ... (" << old_lens.size() << ")";
  os << " seed " << seed;
  return os.str();
}

AppendInputs make_append_inputs(const AppendCase& c) {
  AppendInputs in;
  in.layout = c.layout;
  in.pad = c.row_pad;
  const int64_t ps = c.page_size;
  std::vector<int64_t> ptr = {0}, last, aptr = {0}, lens;
  for (size_t i = 0; i < c.old_lens.size(); ++i) {
    const int64_t len = c.old_lens[i] + c.append_lens[i], n = (len + ps - 1) / ps;
    ptr.push_back(ptr.back() + n);
    last.push_back(n == 0 ? 0 : len - (n - 1) * ps);
    aptr.push_back(aptr.back() + c.append_lens[i]);
    lens.push_back(len);
  }
  in.num_pages = ptr.back() + kSparePages;
  in.nnz = aptr.back();
  // Page ids: a seeded shuffle of all pages; requests own the first indptr[batch] of them.
  std::vector<int64_t> perm(in.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  SplitMix64 rng(c.seed * 5 + 1);
  for (int64_t i = in.num_pages - 1; i > 0; --i)
    std::swap(perm[i], perm[rng.next() % static_cast<uint64_t>(i + 1)]);
  perm.resize(ptr.back());
  in.indptr = make_i32(ptr);
  in.indices = make_i32(perm);
  in.last_page_len = make_i32(last);
  in.append_indptr = make_i32(aptr);
  in.seq_lens = make_i32(lens);
  BatchIndicesPositions bp =
      get_batch_indices_positions(in.append_indptr.view(), in.seq_lens.view(), in.nnz);
  in.batch_indices = std::move(bp.batch_indices);
  in.positions = std::move(bp.positions);

  const std::vector<int64_t> shape = storage_shape(c, in.num_pages);
  if (c.interleaved) {
    in.kv = HostTensor(c.dtype, shape);
    in.kv.fill_random(c.seed * 5 + 2);
  } else {
    in.k = HostTensor(c.dtype, shape);
    in.v = HostTensor(c.dtype, shape);
    in.k.fill_random(c.seed * 5 + 2);
    in.v.fill_random(c.seed * 5 + 3);
  }
  in.new_k = HostTensor(c.dtype, {in.nnz, c.num_kv_heads, c.head_dim + c.row_pad});
  in.new_v = HostTensor(c.dtype, in.new_k.shape());
  if (in.nnz > 0) {
    in.new_k.fill_random(c.seed * 5 + 4);
    in.new_v.fill_random(c.seed * 5 + 5);
  }
  return in;
}

PagedKVCache AppendInputs::host_cache() const {
  if (kv.numel() > 0) {
    return PagedKVCache::interleaved(kv.view(), layout, indptr.view(), indices.view(),
                                     last_page_len.view());
  }
  return {k.view(), v.view(), layout, indptr.view(), indices.view(), last_page_len.view()};
}

TensorView AppendInputs::key_view() const {
  const auto& s = new_k.shape();
  return rows_view(new_k.data(), new_k.dtype(), s[0], s[1], s[2] - pad, pad, Device::cpu());
}
TensorView AppendInputs::value_view() const {
  const auto& s = new_v.shape();
  return rows_view(new_v.data(), new_v.dtype(), s[0], s[1], s[2] - pad, pad, Device::cpu());
}

AppendDevice to_device(const AppendInputs& in, const AppendCase& c) {
  AppendDevice d;
  d.indptr = to_device(in.indptr);
  d.indices = to_device(in.indices);
  d.last_page_len = to_device(in.last_page_len);
  if (c.interleaved) {
    d.kv = to_device(in.kv);
    d.cache = PagedKVCache::interleaved(d.kv.view, c.layout, d.indptr.view, d.indices.view,
                                        d.last_page_len.view);
  } else {
    d.k = to_device(in.k);
    d.v = to_device(in.v);
    d.cache = {d.k.view, d.v.view, c.layout, d.indptr.view, d.indices.view, d.last_page_len.view};
  }
  d.new_k = to_device(in.new_k);
  d.new_v = to_device(in.new_v);
  d.key = rows_view(d.new_k.view.data(), c.dtype, in.nnz, c.num_kv_heads, c.head_dim, c.row_pad,
                    Device::cuda(0));
  d.value = rows_view(d.new_v.view.data(), c.dtype, in.nnz, c.num_kv_heads, c.head_dim, c.row_pad,
                      Device::cuda(0));
  d.batch_indices = to_device(in.batch_indices);
  d.positions = to_device(in.positions);
  return d;
}

std::vector<const HostTensor*> cache_storage(const AppendInputs& in) {
  if (in.kv.numel() > 0) return {&in.kv};
  return {&in.k, &in.v};
}

std::vector<HostTensor> cache_to_host(const AppendDevice& d, const AppendInputs& in) {
  std::vector<HostTensor> out;
  if (in.kv.numel() > 0) {
    out.emplace_back(in.kv.dtype(), in.kv.shape());
    to_host(d.kv, out.back());
  } else {
    out.emplace_back(in.k.dtype(), in.k.shape());
    to_host(d.k, out.back());
    out.emplace_back(in.v.dtype(), in.v.shape());
    to_host(d.v, out.back());
  }
  return out;
}

void expect_append_matches_reference(const AppendCase& c) {
  AppendInputs in = make_append_inputs(c);
  AppendDevice d = to_device(in, c);  // before the reference updates the host cache
  const std::vector<HostTensor> before = [&] {
    std::vector<HostTensor> b;
    for (const HostTensor* t : cache_storage(in)) b.push_back(*t);
    return b;
  }();
  reference::append_paged_kv_cache(in.key_view(), in.value_view(), in.batch_indices.view(),
                                   in.positions.view(), in.host_cache());
  Stream s = create_stream();
  append_paged_kv_cache(d.key, d.value, d.batch_indices.view, d.positions.view, d.cache, s);
  synchronize(s);
  EXPECT_NO_THROW(check_device_errors(0, s)) << c.str();
  destroy_stream(s);
  const std::vector<HostTensor> got = cache_to_host(d, in);
  const std::vector<const HostTensor*> want = cache_storage(in);
  for (size_t i = 0; i < got.size(); ++i) {
    const auto* g = static_cast<const unsigned char*>(got[i].data());
    const auto* w = static_cast<const unsigned char*>(want[i]->data());
    const size_t n = got[i].nbytes();
    if (std::memcmp(g, w, n) == 0) continue;
    size_t first = 0;
    while (first < n && g[first] == w[first]) ++first;
    const int64_t elem = static_cast<int64_t>(first / dtype_size(c.dtype));
    ADD_FAILURE() << c.str() << ": cache tensor " << i
                  << " differs from the reference's at element " << elem << " (got "
                  << got[i].get(elem) << ", reference " << want[i]->get(elem)
                  << ", before the append " << before[i].get(elem) << ")";
  }
  // The test means something: with new tokens, the reference's cache did change.
  if (in.nnz > 0) {
    bool changed = false;
    for (size_t i = 0; i < before.size(); ++i)
      changed |= std::memcmp(before[i].data(), want[i]->data(), before[i].nbytes()) != 0;
    EXPECT_TRUE(changed) << c.str();
  }
}

}  // namespace flashkv::test
