// Tests of append_paged_kv_cache and get_batch_indices_positions on the CPU reference: appends
// that fill a page exactly, start a new page, or land in requests that were empty, in every
// storage (NHD/HND, separate/interleaved k and v) and dtype, checked against an index formula
// written out here; and the argument checks (out-of-range positions write nothing).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/cuda_view.h"
#include "common/test_util.h"
#include "flashkv/error.h"
#include "flashkv/kv_ops.h"
#include "flashkv/runtime.h"

namespace flashkv {
namespace {

using test::error_of;
using test::make_i32;

// A paged cache in host memory whose element addresses the test computes itself.
struct TestCache {
  KVLayout layout;
  bool interleaved;
  int64_t num_pages, page_size, heads, dim;
  HostTensor k, v, kv;  // k/v when separate, kv when interleaved

  TestCache(KVLayout layout, bool interleaved, int64_t num_pages, int64_t page_size, int64_t heads,
            int64_t dim, DType dtype)
      : layout(layout),
        interleaved(interleaved),
        num_pages(num_pages),
        page_size(page_size),
        heads(heads),
        dim(dim) {
    const std::vector<int64_t> page_shape = layout == KVLayout::NHD
                                                ? std::vector<int64_t>{page_size, heads, dim}
                                                : std::vector<int64_t>{heads, page_size, dim};
    std::vector<int64_t> shape = {num_pages};
    if (interleaved) shape.push_back(2);
    shape.insert(shape.end(), page_shape.begin(), page_shape.end());
    if (interleaved) {
      kv = HostTensor(dtype, shape);
      kv.fill_random(11);
    } else {
      k = HostTensor(dtype, shape);
      v = HostTensor(dtype, shape);
      k.fill_random(12);
      v.fill_random(13);
    }
  }

  // Flat element index of (page, k or v, token slot, head, d) in its tensor.
  int64_t index(int64_t page, bool is_v, int64_t slot, int64_t h, int64_t d) const {
    const int64_t inner =
        layout == KVLayout::NHD ? (slot * heads + h) * dim + d : (h * page_size + slot) * dim + d;
    const int64_t page_elems = page_size * heads * dim;
    return interleaved ? (page * 2 + (is_v ? 1 : 0)) * page_elems + inner
                       : page * page_elems + inner;
  }
  HostTensor& storage(bool is_v) { return interleaved ? kv : (is_v ? v : k); }

  PagedKVCache cache(const HostTensor& indptr, const HostTensor& indices,
                     const HostTensor& last_page_len) const {
    if (interleaved) {
      return PagedKVCache::interleaved(kv.view(), layout, indptr.view(), indices.view(),
                                       last_page_len.view());
    }
    return {k.view(), v.view(), layout, indptr.view(), indices.view(), last_page_len.view()};
  }
};

// A batch before and after one append: old_lens[i] tokens cached, append_lens[i] new ones.
struct Batch {
  std::vector<int64_t> old_lens, append_lens;
  int64_t page_size;
  // Page table after the append, pages handed out in a scrambled order.
  std::vector<std::vector<int64_t>> pages;
  HostTensor indptr, indices, last_page_len, append_indptr, seq_lens;
  int64_t num_pages = 0, nnz = 0;

  Batch(std::vector<int64_t> old, std::vector<int64_t> app, int64_t ps)
      : old_lens(std::move(old)), append_lens(std::move(app)), page_size(ps) {
    std::vector<int64_t> ptr = {0}, ids, last, aptr = {0}, lens;
    for (size_t i = 0; i < old_lens.size(); ++i) {
      const int64_t len = old_lens[i] + append_lens[i];
      const int64_t n = (len + ps - 1) / ps;
      pages.emplace_back();
      for (int64_t j = 0; j < n; ++j) pages.back().push_back(num_pages++);
      ptr.push_back(ptr.back() + n);
      last.push_back(n == 0 ? 0 : len - (n - 1) * ps);
      aptr.push_back(aptr.back() + append_lens[i]);
      lens.push_back(len);
    }
    // Scramble: page id p becomes (p * 7 + 3) mod num_pages (7 is coprime with the counts used).
    for (auto& req : pages) {
      for (int64_t& p : req) {
        p = (p * 7 + 3) % num_pages;
        ids.push_back(p);
      }
    }
    nnz = aptr.back();
    indptr = make_i32(ptr);
    indices = make_i32(ids);
    last_page_len = make_i32(last);
    append_indptr = make_i32(aptr);
    seq_lens = make_i32(lens);
  }
};

using AppendParam = std::tuple<KVLayout, bool, DType>;
class AppendTest : public ::testing::TestWithParam<AppendParam> {};

TEST_P(AppendTest, WritesEachNewTokenToItsSlotAndNothingElse) {
  const auto [layout, interleaved, dtype] = GetParam();
  const int64_t ps = 4, heads = 3, dim = 8;
  // Requests: empty before (5 new: a full page and one more), filling a page exactly (3 + 1),
  // starting a new page (4 + 1), nothing appended (5 + 0), empty and staying empty, a prefill
  // chunk over several pages (6 + 11).
  Batch b({0, 3, 4, 5, 0, 6}, {5, 1, 1, 0, 0, 11}, ps);
  ASSERT_NE(b.num_pages % 7, 0);  // the scramble is a permutation
  TestCache c(layout, interleaved, b.num_pages, ps, heads, dim, dtype);
  HostTensor new_k(dtype, {b.nnz, heads, dim}), new_v(dtype, {b.nnz, heads, dim});
  new_k.fill_random(21);
  new_v.fill_random(22);

  std::vector<double> expect_k = c.storage(false).to_doubles();
  std::vector<double> expect_v = c.storage(true).to_doubles();
  std::vector<double>& expect_v_ref = interleaved ? expect_k : expect_v;
  int64_t t = 0;
  for (size_t r = 0; r < b.old_lens.size(); ++r) {
    for (int64_t j = 0; j < b.append_lens[r]; ++j, ++t) {
      const int64_t pos = b.old_lens[r] + j;
      const int64_t page = b.pages[r][pos / ps], slot = pos % ps;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < dim; ++d) {
          expect_k[c.index(page, false, slot, h, d)] = new_k.get((t * heads + h) * dim + d);
          expect_v_ref[c.index(page, true, slot, h, d)] = new_v.get((t * heads + h) * dim + d);
        }
      }
    }
  }

  const BatchIndicesPositions bp =
      get_batch_indices_positions(b.append_indptr.view(), b.seq_lens.view(), b.nnz);
  append_paged_kv_cache(new_k.view(), new_v.view(), bp.batch_indices.view(), bp.positions.view(),
                        c.cache(b.indptr, b.indices, b.last_page_len));
  EXPECT_EQ(c.storage(false).to_doubles(), expect_k);
  if (!interleaved) EXPECT_EQ(c.storage(true).to_doubles(), expect_v);
}

std::string append_param_name(const ::testing::TestParamInfo<AppendParam>& info) {
  return std::string(kv_layout_name(std::get<0>(info.param))) +
         (std::get<1>(info.param) ? "_interleaved_" : "_separate_") +
         dtype_name(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Storage, AppendTest,
                         ::testing::Combine(::testing::Values(KVLayout::NHD, KVLayout::HND),
                                            ::testing::Bool(),
                                            ::testing::Values(DType::f16, DType::bf16, DType::f32)),
                         append_param_name);

TEST(BatchIndicesPositions, FlashInferSemantics) {
  // Requests with 2, 0, 3 new tokens and KV lengths 5, 4, 3 after the append.
  const HostTensor indptr = make_i32({0, 2, 2, 5}), seq_lens = make_i32({5, 4, 3});
  const BatchIndicesPositions r = get_batch_indices_positions(indptr.view(), seq_lens.view(), 5);
  EXPECT_EQ(r.batch_indices.to_doubles(), (std::vector<double>{0, 0, 2, 2, 2}));
  EXPECT_EQ(r.positions.to_doubles(), (std::vector<double>{3, 4, 0, 1, 2}));
}

TEST(BatchIndicesPositions, RejectsBadInput) {
  const HostTensor indptr = make_i32({0, 2, 5});
  EXPECT_NE(error_of([&] {
              get_batch_indices_positions(indptr.view(), make_i32({5, 2}).view(), 5);
            }).find("seq_lens[1] = 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              get_batch_indices_positions(indptr.view(), make_i32({5, 5}).view(), 4);
            }).find("append_indptr"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              get_batch_indices_positions(indptr.view(), make_i32({5}).view(), 5);
            }).find("seq_lens"),
            std::string::npos);
}

// One request with 5 tokens (2 pages of 4) after appending 2 at positions 3 and 4.
struct SmallAppend {
  TestCache c{KVLayout::NHD, false, 3, 4, 2, 8, DType::f16};
  HostTensor indptr = make_i32({0, 2}), indices = make_i32({2, 0}), last = make_i32({1});
  HostTensor new_k{DType::f16, {2, 2, 8}}, new_v{DType::f16, {2, 2, 8}};
  HostTensor batch_indices = make_i32({0, 0}), positions = make_i32({3, 4});
  SmallAppend() {
    new_k.fill_random(1);
    new_v.fill_random(2);
  }
  PagedKVCache cache() const { return c.cache(indptr, indices, last); }
  void run() {
    append_paged_kv_cache(new_k.view(), new_v.view(), batch_indices.view(), positions.view(),
                          cache());
  }
  std::string error() {
    return error_of([&] { run(); });
  }
};

TEST(AppendErrors, PositionPastTheRequestsPagesWritesNothing) {
  SmallAppend a;
  a.positions = make_i32({4, 5});  // kv_len is 5: position 5 has no slot in the page table
  const std::vector<double> before_k = a.c.k.to_doubles(), before_v = a.c.v.to_doubles();
  const std::string msg = a.error();
  EXPECT_NE(msg.find("positions[1] = 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kv_len = 5"), std::string::npos) << msg;
  EXPECT_EQ(a.c.k.to_doubles(), before_k);
  EXPECT_EQ(a.c.v.to_doubles(), before_v);
}

TEST(AppendErrors, NamesTheBadArgument) {
  {
    SmallAppend a;
    a.batch_indices = make_i32({0, 1});
    EXPECT_NE(a.error().find("batch_indices[1] = 1"), std::string::npos);
  }
  {
    SmallAppend a;
    a.positions = make_i32({-1, 4});
    EXPECT_NE(a.error().find("positions[0] = -1"), std::string::npos);
  }
  {
    SmallAppend a;
    a.positions = make_i32({4, 4});
    EXPECT_NE(a.error().find("both write slot 0 of page 0"), std::string::npos) << a.error();
  }
  {
    SmallAppend a;
    a.new_k = HostTensor(DType::bf16, {2, 2, 8});
    EXPECT_NE(a.error().find("append_key: expected dtype f16"), std::string::npos) << a.error();
  }
  {
    SmallAppend a;
    a.new_v = HostTensor(DType::f16, {2, 3, 8});
    EXPECT_NE(a.error().find("append_value: expected shape"), std::string::npos) << a.error();
  }
  {
    SmallAppend a;
    a.positions = make_i32({3});
    EXPECT_NE(a.error().find("positions: expected shape [2]"), std::string::npos) << a.error();
  }
  {
    SmallAppend a;
    a.indices = make_i32({2, 3});  // page 3 of 3
    EXPECT_NE(a.error().find("paged_kv.indices[1] = 3"), std::string::npos) << a.error();
  }
}

// CUDA views of host memory: the device routing and its errors, without dereferencing anything.
// On a machine with a GPU the views would reach the kernel (host pointers): only the mixed-device
// check runs there; the GPU path itself is tested in tests/gpu/test_kv_ops_gpu.cpp.
TEST(AppendErrors, CudaTensorsWithoutAGpuRaiseNamingTheOp) {
  SmallAppend a;
  PagedKVCache kv = a.cache();
  auto gpu = [](const HostTensor& h) { return test::as_cuda_view(h.view()); };
  kv.k = gpu(a.c.k);
  kv.v = gpu(a.c.v);
  kv.indptr = gpu(a.indptr);
  kv.indices = gpu(a.indices);
  kv.last_page_len = gpu(a.last);
  if (!cuda_available()) {
    const std::string msg = error_of([&] {
      append_paged_kv_cache(gpu(a.new_k), gpu(a.new_v), gpu(a.batch_indices), gpu(a.positions), kv);
    });
    EXPECT_NE(msg.find("append_paged_kv_cache: tensors on cuda:0 but no usable GPU"),
              std::string::npos)
        << msg;
  }
  const std::string mixed = error_of([&] {
    append_paged_kv_cache(a.new_k.view(), a.new_v.view(), a.batch_indices.view(),
                          a.positions.view(), kv);
  });
  EXPECT_NE(mixed.find("expected device cpu"), std::string::npos) << mixed;
}

}  // namespace
}  // namespace flashkv
