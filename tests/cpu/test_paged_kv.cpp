// PagedKVCache: geometry in both layouts, interleaved K/V, and one test per invariant that
// validate() enforces, each checking that the message names the argument and the index.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "flashkv/error.h"
#include "flashkv/paged_kv.h"

namespace flashkv {
namespace {

using test::error_of;

// A valid page table for 3 requests over 10 pages of 16 tokens: 37, 0 and 64 tokens.
// K/V carry no data: shape checks and index checks never read them.
struct Table {
  int64_t num_pages = 10;
  int64_t page_size = 16;
  int64_t heads = 8;
  int64_t dim = 128;
  KVLayout layout = KVLayout::NHD;
  std::vector<int32_t> indptr = {0, 3, 3, 7};
  std::vector<int32_t> indices = {4, 0, 9, 1, 2, 3, 8};
  std::vector<int32_t> last_page_len = {5, 0, 16};  // request 1 is empty: its entry is ignored

  TensorView kv_view() const {
    return layout == KVLayout::NHD
               ? TensorView(nullptr, DType::f16, {num_pages, page_size, heads, dim})
               : TensorView(nullptr, DType::f16, {num_pages, heads, page_size, dim});
  }
  TensorView i32(std::vector<int32_t>& v, Device d = Device::cpu()) {
    return TensorView(v.data(), DType::i32, {static_cast<int64_t>(v.size())}, d);
  }
  PagedKVCache cache() {
    PagedKVCache c;
    c.k = kv_view();
    c.v = kv_view();
    c.layout = layout;
    c.indptr = i32(indptr);
    c.indices = i32(indices);
    c.last_page_len = i32(last_page_len);
    return c;
  }
};

TEST(PagedKVLayout, NamesAndHeadDims) {
  EXPECT_STREQ(kv_layout_name(KVLayout::NHD), "NHD");
  EXPECT_STREQ(kv_layout_name(KVLayout::HND), "HND");
  EXPECT_EQ(parse_kv_layout("NHD"), KVLayout::NHD);
  EXPECT_EQ(parse_kv_layout("hnd"), KVLayout::HND);
  EXPECT_EQ(parse_kv_layout("Hnd"), KVLayout::HND);
  EXPECT_ERROR_HAS(parse_kv_layout("NDH"), "'NDH'");
  for (int d : {64, 128, 256}) EXPECT_TRUE(is_supported_head_dim(d)) << d;
  for (int d : {0, 32, 96, 512}) EXPECT_FALSE(is_supported_head_dim(d)) << d;
}

TEST(PagedKV, ValidNHD) {
  Table t;
  const PagedKVCache c = t.cache();
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.num_pages(), 10);
  EXPECT_EQ(c.page_size(), 16);
  EXPECT_EQ(c.num_kv_heads(), 8);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.batch_size(), 3);
  EXPECT_EQ(c.page_stride(), 16 * 8 * 128);
  EXPECT_EQ(c.token_stride(), 8 * 128);
  EXPECT_EQ(c.head_stride(), 128);
}

TEST(PagedKV, ValidHND) {
  Table t;
  t.layout = KVLayout::HND;
  const PagedKVCache c = t.cache();
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.page_size(), 16);
  EXPECT_EQ(c.num_kv_heads(), 8);
  EXPECT_EQ(c.page_stride(), 8 * 16 * 128);
  EXPECT_EQ(c.token_stride(), 128);
  EXPECT_EQ(c.head_stride(), 16 * 128);
}

TEST(PagedKV, KvLen) {
  Table t;
  const PagedKVCache c = t.cache();
  EXPECT_EQ(c.kv_len(0), 2 * 16 + 5);
  EXPECT_EQ(c.kv_len(1), 0);
  EXPECT_EQ(c.kv_len(2), 3 * 16 + 16);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(paged_kv_len(t.indptr.data(), t.last_page_len.data(), 16, i), c.kv_len(i));
  }
  EXPECT_ERROR_HAS(c.kv_len(3), "request 3");
  EXPECT_ERROR_HAS(c.kv_len(-1), "request -1");
}

TEST(PagedKV, PageSizeOneAndEmptyBatch) {
  Table t;
  t.page_size = 1;
  t.last_page_len = {1, 7, 1};
  const PagedKVCache c = t.cache();
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.kv_len(0), 3);
  EXPECT_EQ(c.kv_len(2), 4);

  Table e;
  e.indptr = {0};
  e.indices = {};
  e.last_page_len = {};
  EXPECT_NO_THROW(e.cache().validate());
  EXPECT_EQ(e.cache().batch_size(), 0);
}

TEST(PagedKV, StridedIndexTensors) {
  // indptr read from every other element of a buffer, as a sliced host tensor would be.
  Table t;
  std::vector<int32_t> spread = {0, -1, 3, -1, 3, -1, 7, -1};
  PagedKVCache c = t.cache();
  c.indptr = TensorView(spread.data(), DType::i32, {4}, {2});
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.kv_len(2), 64);
}

TEST(PagedKV, InterleavedNHD) {
  constexpr int64_t kPages = 10, kPage = 16, kHeads = 8, kDim = 128;
  std::vector<uint16_t> buf(kPages * 2 * kPage * kHeads * kDim);
  Table t;
  const TensorView kv(buf.data(), DType::f16, {kPages, 2, kPage, kHeads, kDim});
  const PagedKVCache c = PagedKVCache::interleaved(kv, KVLayout::NHD, t.i32(t.indptr),
                                                   t.i32(t.indices), t.i32(t.last_page_len));
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.k.data(), buf.data());
  EXPECT_EQ(c.v.data(), buf.data() + kPage * kHeads * kDim);
  EXPECT_EQ(c.k.shape_str(), "[10, 16, 8, 128]");
  EXPECT_EQ(c.v.shape_str(), "[10, 16, 8, 128]");
  EXPECT_EQ(c.page_stride(), 2 * kPage * kHeads * kDim);
  EXPECT_EQ(c.token_stride(), kHeads * kDim);
  EXPECT_EQ(c.head_stride(), kDim);
  EXPECT_EQ(c.k.dtype(), DType::f16);
  EXPECT_FALSE(c.k.is_contiguous());
}

TEST(PagedKV, InterleavedHND) {
  constexpr int64_t kPages = 4, kPage = 5, kHeads = 2, kDim = 64;
  std::vector<uint8_t> buf(kPages * 2 * kHeads * kPage * kDim);
  std::vector<int32_t> indptr = {0, 2, 4}, indices = {3, 1, 0, 2}, last = {5, 1};
  const TensorView kv(buf.data(), DType::e4m3, {kPages, 2, kHeads, kPage, kDim}, Device::cpu());
  const PagedKVCache c = PagedKVCache::interleaved(
      kv, KVLayout::HND, TensorView(indptr.data(), DType::i32, {3}),
      TensorView(indices.data(), DType::i32, {4}), TensorView(last.data(), DType::i32, {2}));
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.v.data(), buf.data() + kHeads * kPage * kDim);
  EXPECT_EQ(c.page_size(), 5);
  EXPECT_EQ(c.num_kv_heads(), 2);
  EXPECT_EQ(c.head_stride(), kPage * kDim);
  EXPECT_EQ(c.kv_len(0), 10);
  EXPECT_EQ(c.kv_len(1), 6);
}

TEST(PagedKV, InterleavedRejectsBadShape) {
  Table t;
  const TensorView kv3(nullptr, DType::f16, {10, 3, 16, 8, 128});
  EXPECT_ERROR_HAS(PagedKVCache::interleaved(kv3, KVLayout::NHD, t.i32(t.indptr), t.i32(t.indices),
                                             t.i32(t.last_page_len)),
                   "paged_kv.kv: expected shape [*, 2, *, *, *], got [10, 3, 16, 8, 128]");
  const TensorView kv4(nullptr, DType::f16, {10, 2, 16, 8});
  EXPECT_ERROR_HAS(PagedKVCache::interleaved(kv4, KVLayout::NHD, t.i32(t.indptr), t.i32(t.indices),
                                             t.i32(t.last_page_len)),
                   "paged_kv.kv");
}

// --- index invariants (validate) --------------------------------------------------------------

TEST(PagedKVInvariants, IndptrStartsAtZero) {
  Table t;
  t.indptr = {1, 3, 3, 7};
  EXPECT_ERROR_HAS(t.cache().validate(), "paged_kv.indptr[0] = 1: expected 0");
}

TEST(PagedKVInvariants, IndptrNonDecreasing) {
  Table t;
  t.indptr = {0, 3, 2, 7};
  EXPECT_ERROR_HAS(t.cache().validate(),
                   "paged_kv.indptr[2] = 2 is less than paged_kv.indptr[1] = 3");
}

TEST(PagedKVInvariants, IndicesLongEnough) {
  Table t;
  t.indices = {4, 0, 9, 1, 2};
  const std::string msg = error_of([&] { t.cache().validate(); });
  EXPECT_NE(msg.find("paged_kv.indices: has 5 entries"), std::string::npos) << msg;
  EXPECT_NE(msg.find("paged_kv.indptr[3] = 7"), std::string::npos) << msg;
  // Extra entries past indptr[batch] are allowed (a preallocated buffer).
  t.indices = {4, 0, 9, 1, 2, 3, 8, 100, -5};
  EXPECT_NO_THROW(t.cache().validate());
}

TEST(PagedKVInvariants, IndexOutOfRange) {
  Table t;
  t.indices[5] = 12;
  EXPECT_EQ(error_of([&] { t.cache().validate(); }),
            "paged_kv.indices[5] = 12 is out of range: expected 0 <= index < 10 (num_pages)");
  t.indices[5] = 10;
  EXPECT_ERROR_HAS(t.cache().validate(), "paged_kv.indices[5] = 10");
  t.indices[5] = 3;
  t.indices[0] = -1;
  EXPECT_ERROR_HAS(t.cache().validate(), "paged_kv.indices[0] = -1 is out of range");
}

TEST(PagedKVInvariants, LastPageLenInRange) {
  Table t;
  t.last_page_len = {0, 0, 16};
  EXPECT_ERROR_HAS(t.cache().validate(),
                   "paged_kv.last_page_len[0] = 0 is out of range: expected 1 <= last_page_len "
                   "<= 16 (page_size)");
  t.last_page_len = {5, 0, 17};
  EXPECT_ERROR_HAS(t.cache().validate(), "paged_kv.last_page_len[2] = 17");
  // Empty requests ignore their entry, whatever it holds.
  t.last_page_len = {5, -3, 16};
  EXPECT_NO_THROW(t.cache().validate());
  t.last_page_len = {5, 99, 16};
  EXPECT_NO_THROW(t.cache().validate());
}

TEST(PagedKVInvariants, IndexTensorsOnHost) {
  Table t;
  PagedKVCache c = t.cache();
  c.indptr = t.i32(t.indptr, Device::cuda(0));
  EXPECT_NO_THROW(c.validate_shapes());  // shapes only: the device does not matter
  EXPECT_ERROR_HAS(c.validate(), "paged_kv.indptr: expected device cpu, got cuda:0");
  EXPECT_ERROR_HAS(c.kv_len(0), "paged_kv.indptr: expected device cpu, got cuda:0");
  c = t.cache();
  c.indices = t.i32(t.indices, Device::cuda(1));
  EXPECT_ERROR_HAS(c.validate(), "paged_kv.indices: expected device cpu, got cuda:1");
  c = t.cache();
  c.last_page_len = t.i32(t.last_page_len, Device::cuda(0));
  EXPECT_ERROR_HAS(c.validate(), "paged_kv.last_page_len: expected device cpu");
}

// --- shapes (validate_shapes) -----------------------------------------------------------------

TEST(PagedKVShapes, IndexTensors) {
  Table t;
  PagedKVCache c = t.cache();
  std::vector<float> f(4);
  c.indptr = TensorView(f.data(), DType::f32, {4});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.indptr: expected dtype i32, got f32");
  c = t.cache();
  c.indptr = TensorView(t.indptr.data(), DType::i32, {2, 2});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.indptr: expected 1-d");
  c = t.cache();
  c.indptr = TensorView(t.indptr.data(), DType::i32, {0});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.indptr");
  c = t.cache();
  c.indptr = TensorView();
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.indptr");
  c = t.cache();
  c.indices = TensorView(t.indices.data(), DType::i32, {7, 1});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.indices: expected 1-d");
  c = t.cache();
  c.last_page_len = TensorView(t.last_page_len.data(), DType::i32, {2});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.last_page_len: expected shape [3]");
  c = t.cache();
  c.last_page_len = TensorView(t.last_page_len.data(), DType::e5m2, {3});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.last_page_len: expected dtype i32, got e5m2");
}

TEST(PagedKVShapes, KAndVAgree) {
  Table t;
  PagedKVCache c = t.cache();
  c.v = TensorView(nullptr, DType::bf16, {10, 16, 8, 128});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.v: expected dtype f16");
  c = t.cache();
  c.v = TensorView(nullptr, DType::f16, {10, 16, 8, 64});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.v: expected shape [10, 16, 8, 128]");
  c = t.cache();
  c.v = TensorView(nullptr, DType::f16, {10, 16, 8, 128}, Device::cuda(0));
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.v: expected device cpu");
  c = t.cache();
  c.v = TensorView(nullptr, DType::f16, {10, 16, 8, 128}, {2 * 16 * 8 * 128, 8 * 128, 128, 1});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.v: stride(0)");
  c = t.cache();
  c.v = TensorView();
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.v");
}

TEST(PagedKVShapes, KItself) {
  Table t;
  PagedKVCache c = t.cache();
  c.k = TensorView(nullptr, DType::f16, {10, 16, 1024});
  c.v = c.k;
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.k: expected 4-d");
  c = t.cache();
  c.k = c.v = TensorView(nullptr, DType::i32, {10, 16, 8, 128});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.k: expected dtype");
  c = t.cache();
  c.k = c.v = TensorView(nullptr, DType::f16, {10, 0, 8, 128});
  EXPECT_ERROR_HAS(c.validate_shapes(), "page_size must be >= 1");
  c = t.cache();
  c.k = c.v = TensorView(nullptr, DType::f16, {10, 16, 8, 128}, {16 * 8 * 256, 8 * 256, 256, 2});
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.k: expected the last dimension to have stride 1");
  c = t.cache();
  c.k = TensorView();
  EXPECT_ERROR_HAS(c.validate_shapes(), "paged_kv.k");
  // Padded pages (row strides larger than the packed ones) are fine.
  c = t.cache();
  c.k = c.v = TensorView(nullptr, DType::f16, {10, 16, 8, 128}, {20 * 8 * 128, 8 * 128, 128, 1});
  EXPECT_NO_THROW(c.validate());
}

TEST(PagedKVHeads, CheckHeads) {
  EXPECT_NO_THROW(check_heads(32, 8));
  EXPECT_NO_THROW(check_heads(32, 32));
  EXPECT_NO_THROW(check_heads(7, 1));
  for (auto [qo, kv] :
       {std::pair{32, 5}, std::pair{8, 16}, std::pair{0, 8}, std::pair{8, 0}, std::pair{-4, 2}}) {
    const std::string msg = error_of([&] { check_heads(qo, kv); });
    EXPECT_NE(msg.find("num_qo_heads = " + std::to_string(qo)), std::string::npos) << msg;
    EXPECT_NE(msg.find("num_kv_heads = " + std::to_string(kv)), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace flashkv
