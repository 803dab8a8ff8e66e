// The block-sparse layouts (flashkv/block_sparse.h) and their CPU reference
// (reference_block_sparse.h): named errors for bad layouts; at full density the reference equals
// dense attention (causal bottom-right aligned, R != C, M != N), an element mask equals the dense
// reference under the same custom mask, soft-cap and sinks follow variants.h, empty block rows
// give out 0 / lse -inf, and a BSR pattern and the variable layout of the same pattern agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "flashkv/block_sparse.h"
#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "flashkv/reference_block_sparse.h"
#include "flashkv/reference_variants.h"

namespace flashkv::test {
namespace {

struct Dense {
  HostTensor q, k, v;
  int64_t M, N;
  int hq, hkv, d;
};

Dense make_dense(int64_t M, int64_t N, int hq, int hkv, int d, DType dt, uint64_t seed) {
  Dense x{HostTensor(dt, {M, hq, d}),
          HostTensor(dt, {N, hkv, d}),
          HostTensor(dt, {N, hkv, d}),
          M,
          N,
          hq,
          hkv,
          d};
  x.q.fill_random(seed);
  x.k.fill_random(seed + 1);
  x.v.fill_random(seed + 2);
  return x;
}

// Every block of an M x N matrix in R x C blocks.
struct FullBsr {
  std::vector<int32_t> indptr, indices;
  BlockSparseLayout layout(int64_t M, int64_t N, int R, int C) {
    indptr = {0};
    indices.clear();
    for (int64_t i = 0; i < M / R; ++i) {
      for (int64_t j = 0; j < N / C; ++j) indices.push_back(static_cast<int32_t>(j));
      indptr.push_back(static_cast<int32_t>(indices.size()));
    }
    return {indptr.data(), indices.data(), M, N, R, C};
  }
};

void expect_close(const HostTensor& a, const HostTensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  const auto x = a.to_doubles(), y = b.to_doubles();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(y[i])) {
      ASSERT_EQ(x[i], y[i]) << what << " [" << i << "]";
    } else {
      ASSERT_NEAR(x[i], y[i], tol * std::max(1.0, std::abs(y[i]))) << what << " [" << i << "]";
    }
  }
}

TEST(BlockSparseLayout, BadLayoutsAreNamed) {
  std::vector<int32_t> indptr = {0, 2, 3}, indices = {0, 2, 1};
  BlockSparseLayout ok{indptr.data(), indices.data(), 6, 9, 3, 3};
  EXPECT_NO_THROW(check_block_sparse_layout(ok));
  auto bad = ok;
  bad.R = 0;
  EXPECT_NE(error_of([&] { check_block_sparse_layout(bad); }).find("BlockSparseLayout.R"),
            std::string::npos);
  bad = ok;
  bad.M = 7;
  EXPECT_NE(error_of([&] { check_block_sparse_layout(bad); }).find("not a multiple of R"),
            std::string::npos);
  bad = ok;
  bad.N = 10;
  EXPECT_NE(error_of([&] { check_block_sparse_layout(bad); }).find("not a multiple of C"),
            std::string::npos);
  std::vector<int32_t> dec = {0, 2, 1};
  bad = ok;
  bad.indptr = dec.data();
  EXPECT_NE(error_of([&] { check_block_sparse_layout(bad); }).find("non-decreasing"),
            std::string::npos);
  std::vector<int32_t> start1 = {1, 2, 3};
  bad = ok;
  bad.indptr = start1.data();
  EXPECT_NE(error_of([&] { check_block_sparse_layout(bad); }).find("indptr[0] must be 0"),
            std::string::npos);
  std::vector<int32_t> far = {0, 3, 1};
  bad = ok;
  bad.indices = far.data();
  EXPECT_NE(error_of([&] { check_block_sparse_layout(bad); }).find("outside [0, N / C = 3)"),
            std::string::npos);
  std::vector<int32_t> twice = {2, 2, 1};
  bad = ok;
  bad.indices = twice.data();
  EXPECT_NE(error_of([&] { check_block_sparse_layout(bad); }).find("repeated in block row 0"),
            std::string::npos);

  std::vector<uint8_t> map(2 * 2 * 3, 1);
  std::vector<int32_t> rows = {2, 4, 3, 3}, cols = {1, 1, 1, 2, 0, 1};
  VariableBlockSparseLayout vl{map.data(), rows.data(), cols.data(), 2, 2, 3, 6, 3};
  EXPECT_NO_THROW(check_variable_block_sparse_layout(vl));
  std::vector<int32_t> short_rows = {2, 4, 3, 2};
  auto vb = vl;
  vb.block_row_sz = short_rows.data();
  EXPECT_NE(error_of([&] {
              check_variable_block_sparse_layout(vb);
            }).find("block_row_sz[1] sums to 5; expected M = 6"),
            std::string::npos);
  std::vector<int32_t> neg = {1, 1, 1, 3, -1, 1};
  vb = vl;
  vb.block_col_sz = neg.data();
  EXPECT_NE(error_of([&] { check_variable_block_sparse_layout(vb); }).find("block_col_sz[1][1]"),
            std::string::npos);
}

TEST(BlockSparseReference, FullDensityIsDenseAttention) {
  // R != C, M != N, GQA 4 / 2, causal (bottom-right) and not.
  const Dense x = make_dense(12, 20, 4, 2, 64, DType::f16, 11);
  for (bool causal : {false, true}) {
    FullBsr full;
    const BlockSparseLayout l = full.layout(x.M, x.N, 3, 5);
    HostTensor out(DType::f32, {x.M, x.hq, x.d}), lse(DType::f32, {x.M, x.hq});
    HostTensor ref(DType::f32, {x.M, x.hq, x.d}), ref_lse(DType::f32, {x.M, x.hq});
    BlockSparseOptions o;
    o.causal = causal;
    reference::block_sparse_attention(x.q.view(), x.k.view(), x.v.view(), l, out.view(), lse.view(),
                                      o);
    AttentionOptions ao;
    ao.causal = causal;
    reference::single_prefill(x.q.view(), x.k.view(), x.v.view(), ref.view(), ref_lse.view(),
                              KVLayout::NHD, ao);
    expect_close(out, ref, 1e-12, causal ? "causal out" : "out");
    expect_close(lse, ref_lse, 1e-12, "lse");
  }
}

TEST(BlockSparseReference, ElementMaskSoftCapAndSinksMatchTheVariantReference) {
  const Dense x = make_dense(8, 12, 2, 1, 64, DType::bf16, 21);
  FullBsr full;
  BlockSparseLayout l = full.layout(x.M, x.N, 4, 3);
  // A random element mask over every stored block, and the same mask as a dense custom mask.
  std::mt19937 rng(5);
  std::vector<uint8_t> bm(l.indptr[l.num_block_rows()] * l.R * l.C);
  for (auto& b : bm) b = rng() % 3 != 0;
  l.block_mask = bm.data();
  std::vector<bool> dense(x.M * x.N);
  for (int64_t i = 0; i < l.num_block_rows(); ++i)
    for (int64_t t = l.indptr[i]; t < l.indptr[i + 1]; ++t)
      for (int r = 0; r < l.R; ++r)
        for (int c = 0; c < l.C; ++c)
          dense[(i * l.R + r) * x.N + l.indices[t] * l.C + c] = bm[(t * l.R + r) * l.C + c] != 0;
  std::vector<int32_t> mask_indptr;
  const std::vector<uint8_t> packed = pack_custom_mask(dense, {x.M}, {x.N}, mask_indptr);
  const HostTensor sinks = make_tensor(DType::f32, {x.hq}, {0.5, -1.0});

  BlockSparseOptions o;
  o.logits_soft_cap = 2.0f;
  o.sinks = sinks.view();
  o.sm_scale = 0.3f;
  HostTensor out(DType::f32, {x.M, x.hq, x.d}), lse(DType::f32, {x.M, x.hq});
  reference::block_sparse_attention(x.q.view(), x.k.view(), x.v.view(), l, out.view(), lse.view(),
                                    o);
  AttentionVariant av;
  av.logits_soft_cap = 2.0f;
  av.sinks = sinks.view();
  av.sm_scale = 0.3f;
  av.custom_mask = {packed.data(), static_cast<int64_t>(packed.size()), TensorView()};
  HostTensor ref(DType::f32, {x.M, x.hq, x.d}), ref_lse(DType::f32, {x.M, x.hq});
  reference::single_prefill_variant(x.q.view(), x.k.view(), x.v.view(), ref.view(), ref_lse.view(),
                                    KVLayout::NHD, av);
  expect_close(out, ref, 1e-12, "out");
  expect_close(lse, ref_lse, 1e-12, "lse");
}

TEST(BlockSparseReference, EmptyRowsAndTheVariableLayoutOfTheSamePattern) {
  // A random 30 % pattern, block row 1 empty; the same pattern as a variable layout (uniform
  // sizes, both KV heads) must give the same answer; a row with no key: out 0, lse -inf.
  const int R = 2, C = 4;
  const Dense x = make_dense(10, 24, 4, 2, 64, DType::f16, 31);
  std::mt19937 rng(9);
  std::vector<int32_t> indptr = {0}, indices;
  const int64_t MB = x.M / R, NB = x.N / C;
  std::vector<uint8_t> map(2 * MB * NB, 0);
  for (int64_t i = 0; i < MB; ++i) {
    for (int64_t j = NB - 1; j >= 0; --j) {  // descending: any order is allowed
      if (i == 1 || rng() % 10 >= 3) continue;
      indices.push_back(static_cast<int32_t>(j));
      map[i * NB + j] = map[(MB + i) * NB + j] = 1;
    }
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  const BlockSparseLayout l{indptr.data(), indices.data(), x.M, x.N, R, C};
  std::vector<int32_t> rows(2 * MB, R), cols(2 * NB, C);
  const VariableBlockSparseLayout vl{map.data(), rows.data(), cols.data(), 2, MB, NB, x.M, x.N};
  HostTensor a(DType::f16, {x.M, x.hq, x.d}), a_lse(DType::f32, {x.M, x.hq});
  HostTensor b(DType::f16, {x.M, x.hq, x.d}), b_lse(DType::f32, {x.M, x.hq});
  reference::block_sparse_attention(x.q.view(), x.k.view(), x.v.view(), l, a.view(), a_lse.view());
  reference::variable_block_sparse_attention(x.q.view(), x.k.view(), x.v.view(), vl, b.view(),
                                             b_lse.view());
  expect_close(a, b, 0.0, "out");
  expect_close(a_lse, b_lse, 0.0, "lse");
  for (int r = R; r < 2 * R; ++r)
    for (int h = 0; h < x.hq; ++h) {
      EXPECT_TRUE(std::isinf(a_lse.get(r * x.hq + h)) && a_lse.get(r * x.hq + h) < 0);
      for (int d = 0; d < x.d; ++d) EXPECT_EQ(a.get((r * x.hq + h) * x.d + d), 0.0);
    }
}

TEST(BlockSparseReference, VariableBlocksDifferPerKvHead) {
  // Head 0: one block of everything; head 1: rows {3, 5} x cols {7, 9}, only the diagonal
  // blocks. Each head must equal dense attention restricted to its pattern.
  const Dense x = make_dense(8, 16, 2, 2, 64, DType::f16, 41);
  std::vector<uint8_t> map = {1, 0, 0, 0,   // head 0: MB = 2, NB = 2; block (0, 0) only
                              1, 0, 0, 1};  // head 1: the diagonal
  std::vector<int32_t> rows = {8, 0, 3, 5}, cols = {16, 0, 7, 9};
  const VariableBlockSparseLayout vl{map.data(), rows.data(), cols.data(), 2, 2, 2, 8, 16};
  HostTensor out(DType::f32, {8, 2, 64}), lse(DType::f32, {8, 2});
  reference::variable_block_sparse_attention(x.q.view(), x.k.view(), x.v.view(), vl, out.view(),
                                             lse.view());
  // Head 0 is dense attention; head 1 row m < 3 sees keys [0, 7), the rest [7, 16).
  HostTensor ref(DType::f32, {8, 2, 64}), ref_lse(DType::f32, {8, 2});
  reference::single_prefill(x.q.view(), x.k.view(), x.v.view(), ref.view(), ref_lse.view(),
                            KVLayout::NHD);
  for (int m = 0; m < 8; ++m)
    for (int d = 0; d < 64; ++d)
      ASSERT_NEAR(out.get((m * 2) * 64 + d), ref.get((m * 2) * 64 + d), 1e-12);
  std::vector<bool> dense(8 * 16);
  for (int m = 0; m < 8; ++m)
    for (int n = 0; n < 16; ++n) dense[m * 16 + n] = (m < 3) == (n < 7);
  std::vector<int32_t> mi;
  const std::vector<uint8_t> packed = pack_custom_mask(dense, {8}, {16}, mi);
  AttentionVariant av;
  av.custom_mask = {packed.data(), static_cast<int64_t>(packed.size()), TensorView()};
  reference::single_prefill_variant(x.q.view(), x.k.view(), x.v.view(), ref.view(), ref_lse.view(),
                                    KVLayout::NHD, av);
  for (int m = 0; m < 8; ++m) {
    ASSERT_NEAR(lse.get(m * 2 + 1), ref_lse.get(m * 2 + 1), 1e-12);
    for (int d = 0; d < 64; ++d)
      ASSERT_NEAR(out.get((m * 2 + 1) * 64 + d), ref.get((m * 2 + 1) * 64 + d), 1e-12);
  }
}

TEST(BlockSparseReference, CallShapesAreChecked) {
  const Dense x = make_dense(6, 9, 2, 1, 64, DType::f16, 51);
  FullBsr full;
  const BlockSparseLayout l = full.layout(x.M, x.N, 3, 3);
  HostTensor out(DType::f32, {x.M, x.hq, x.d});
  auto wrong = l;
  wrong.M = 9;
  FullBsr f2;
  wrong = f2.layout(9, 9, 3, 3);
  EXPECT_NE(error_of([&] {
              reference::block_sparse_attention(x.q.view(), x.k.view(), x.v.view(), wrong,
                                                out.view(), TensorView());
            }).find("q: expected M = 9"),
            std::string::npos);
  FullBsr f3;
  const BlockSparseLayout longer = f3.layout(6, 12, 3, 3);
  EXPECT_NE(error_of([&] {
              reference::block_sparse_attention(x.q.view(), x.k.view(), x.v.view(), longer,
                                                out.view(), TensorView());
            }).find("k: expected N = 12"),
            std::string::npos);
  BlockSparseOptions o;
  const HostTensor sinks = make_tensor(DType::f32, {3}, {0, 0, 0});
  o.sinks = sinks.view();
  EXPECT_NE(error_of([&] {
              reference::block_sparse_attention(x.q.view(), x.k.view(), x.v.view(), l, out.view(),
                                                TensorView(), o);
            }).find("opts.sinks"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv::test

namespace flashkv::test {
namespace {

// Sparse-KV decode (block_sparse.h): a selection of single tokens is a page table over
// token_pages(k); the reference decode over it equals attention over the gathered tokens.
TEST(SparseKvDecode, TokenSelectionsOverTheTokenPagesView) {
  const std::vector<int64_t> lens = {300, 77, 1};
  const int page = 16, hq = 8, hkv = 2, d = 64;
  PagedCacheHost c = make_paged_cache(lens, page, hkv, d, KVLayout::NHD, DType::f16, 5);
  const TensorView kt = token_pages(c.cache.k, KVLayout::NHD);
  const TensorView vt = token_pages(c.cache.v, KVLayout::NHD);
  ASSERT_EQ(kt.size(0), c.cache.k.size(0) * page);
  ASSERT_EQ(kt.size(1), 1);
  // Each request keeps a random subset of its tokens, in position order.
  std::mt19937 rng(3);
  std::vector<int64_t> indptr = {0}, ids;
  std::vector<std::vector<int64_t>> chosen(lens.size());
  const int32_t* pages = c.indices.view().data_as<int32_t>();
  const int32_t* page_ptr = c.indptr.view().data_as<int32_t>();
  for (size_t r = 0; r < lens.size(); ++r) {
    for (int64_t t = 0; t < lens[r]; ++t) {
      if (lens[r] > 1 && rng() % 4 != 0) continue;
      chosen[r].push_back(t);
      ids.push_back(static_cast<int64_t>(pages[page_ptr[r] + t / page]) * page + t % page);
    }
    indptr.push_back(static_cast<int64_t>(ids.size()));
  }
  const HostTensor sel_indptr = make_i32(indptr), sel_ids = make_i32(ids),
                   last = make_i32(std::vector<int64_t>(lens.size(), 1));
  PagedKVCache sel;
  sel.k = kt;
  sel.v = vt;
  sel.indptr = sel_indptr.view();
  sel.indices = sel_ids.view();
  sel.last_page_len = last.view();
  const int64_t B = static_cast<int64_t>(lens.size());
  HostTensor q(DType::f16, {B, hq, d});
  q.fill_random(9);
  HostTensor out(DType::f32, {B, hq, d}), lse(DType::f32, {B, hq});
  reference::batch_decode(q.view(), sel, out.view(), lse.view());
  // The same attention over the gathered tokens, request by request.
  for (int64_t r = 0; r < B; ++r) {
    const int64_t n = static_cast<int64_t>(chosen[r].size());
    HostTensor k(DType::f16, {n, hkv, d}), v(DType::f16, {n, hkv, d});
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = chosen[r][i], p = pages[page_ptr[r] + t / page];
      for (int64_t e = 0; e < hkv * d; ++e) {
        k.set(i * hkv * d + e, c.k.get(((p * page) + t % page) * hkv * d + e));
        v.set(i * hkv * d + e, c.v.get(((p * page) + t % page) * hkv * d + e));
      }
    }
    const int64_t qs[2] = {hq, d}, q_st[2] = {d, 1};
    HostTensor o1(DType::f32, {hq, d}), l1(DType::f32, {hq});
    const TensorView qr(static_cast<uint8_t*>(q.data()) + r * hq * d * 2, DType::f16, 2, qs, q_st,
                        Device::cpu());
    reference::single_decode(qr, k.view(), v.view(), o1.view(), l1.view(), KVLayout::NHD);
    for (int64_t i = 0; i < hq * d; ++i) ASSERT_NEAR(out.get(r * hq * d + i), o1.get(i), 1e-12);
    for (int h = 0; h < hq; ++h) ASSERT_NEAR(lse.get(r * hq + h), l1.get(h), 1e-12);
  }
  PagedCacheHost hnd = make_paged_cache(lens, page, hkv, d, KVLayout::HND, DType::f16, 6);
  EXPECT_NE(error_of([&] { token_pages(hnd.cache.k, KVLayout::HND); }).find("NHD"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv::test

namespace flashkv::test {
namespace {

// Selections per request and KV head (block_sparse.h head_pages): (request r, KV head h) is
// request r * H + h of a decode over the one-head view with the group's query heads; the
// reference decode over it equals attention over each head's gathered tokens. NHD selects
// tokens (page_size 1), HND whole pages (page_size S, the request's partial last page last).
void check_head_selection(KVLayout layout) {
  SCOPED_TRACE(layout == KVLayout::NHD ? "NHD" : "HND");
  const std::vector<int64_t> lens = {300, 77, 1};
  const int page = 16, hq = 8, hkv = 2, d = 64, g = hq / hkv;
  PagedCacheHost c = make_paged_cache(lens, page, hkv, d, layout, DType::f16, 5);
  const TensorView kh = head_pages(c.cache.k, layout), vh = head_pages(c.cache.v, layout);
  const int view_page = layout == KVLayout::NHD ? 1 : page;
  ASSERT_EQ(kh.size(0), c.cache.k.size(0) * (page / view_page) * hkv);
  const auto elem = [&](int64_t p, int64_t s, int64_t h) {  // offset of (page, slot, head)
    return (layout == KVLayout::NHD ? (p * page + s) * hkv + h : (p * hkv + h) * page + s) * d;
  };
  std::mt19937 rng(4);
  std::vector<int64_t> indptr = {0}, ids, last;
  std::vector<std::vector<int64_t>> chosen;  // cache element offsets, per (r, h)
  const int32_t* pages = c.indices.view().data_as<int32_t>();
  const int32_t* page_ptr = c.indptr.view().data_as<int32_t>();
  for (size_t r = 0; r < lens.size(); ++r) {
    for (int h = 0; h < hkv; ++h) {
      std::vector<int64_t> offs;
      int64_t last_len = view_page;
      const int64_t np = (lens[r] + page - 1) / page;
      for (int64_t pi = 0; pi < np; ++pi) {
        const int64_t p = pages[page_ptr[r] + pi];
        const int64_t in_page = std::min<int64_t>(page, lens[r] - pi * page);
        if (layout == KVLayout::HND) {
          if (np > 1 && rng() % 3 == 0) continue;  // drop this page
          ids.push_back(p * hkv + h);
          for (int64_t s = 0; s < in_page; ++s) offs.push_back(elem(p, s, h));
          last_len = in_page;  // only the request's last page can be partial
          continue;
        }
        for (int64_t s = 0; s < in_page; ++s) {
          if (lens[r] > 1 && rng() % 4 != 0) continue;
          ids.push_back((p * page + s) * hkv + h);
          offs.push_back(elem(p, s, h));
        }
      }
      indptr.push_back(static_cast<int64_t>(ids.size()));
      last.push_back(last_len);
      chosen.push_back(offs);
    }
  }
  const HostTensor sel_indptr = make_i32(indptr), sel_ids = make_i32(ids),
                   sel_last = make_i32(last);
  PagedKVCache sel;
  sel.k = kh;
  sel.v = vh;
  sel.layout = layout;
  sel.indptr = sel_indptr.view();
  sel.indices = sel_ids.view();
  sel.last_page_len = sel_last.view();
  const int64_t B = static_cast<int64_t>(lens.size());
  HostTensor q(DType::f16, {B * hkv, g, d});  // the memory of q [B, hq, d]
  q.fill_random(9);
  HostTensor out(DType::f32, {B * hkv, g, d}), lse(DType::f32, {B * hkv, g});
  reference::batch_decode(q.view(), sel, out.view(), lse.view());
  for (int64_t rh = 0; rh < B * hkv; ++rh) {
    const int64_t n = static_cast<int64_t>(chosen[rh].size());
    HostTensor k(DType::f16, {n, 1, d}), v(DType::f16, {n, 1, d});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < d; ++e) {
        k.set(i * d + e, c.k.get(chosen[rh][i] + e));
        v.set(i * d + e, c.v.get(chosen[rh][i] + e));
      }
    const int64_t qs[2] = {g, d}, q_st[2] = {d, 1};
    HostTensor o1(DType::f32, {g, d}), l1(DType::f32, {g});
    const TensorView qr(static_cast<uint8_t*>(q.data()) + rh * g * d * 2, DType::f16, 2, qs, q_st,
                        Device::cpu());
    reference::single_decode(qr, k.view(), v.view(), o1.view(), l1.view(), KVLayout::NHD);
    for (int64_t i = 0; i < g * d; ++i) ASSERT_NEAR(out.get(rh * g * d + i), o1.get(i), 1e-12);
    for (int j = 0; j < g; ++j) ASSERT_NEAR(lse.get(rh * g + j), l1.get(j), 1e-12);
  }
}

TEST(SparseKvDecode, PerHeadSelectionsOverTheHeadPagesView) {
  check_head_selection(KVLayout::NHD);
  check_head_selection(KVLayout::HND);
}

TEST(SparseKvDecode, HeadPagesRefusesUnevenlyStridedHeads) {
  PagedCacheHost c = make_paged_cache({40}, 16, 2, 64, KVLayout::NHD, DType::f16, 5);
  const TensorView& k = c.cache.k;
  const int64_t shape[4] = {k.size(0), k.size(1), 1, k.size(3)};  // head 0 of 2: stride gaps
  const int64_t strides[4] = {k.stride(0), k.stride(1), k.stride(2), k.stride(3)};
  const TensorView one(k.data(), k.dtype(), 4, shape, strides, k.device());
  EXPECT_NE(error_of([&] { head_pages(one, KVLayout::NHD); }).find("evenly strided"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv::test

namespace flashkv::test {
namespace {

// A shared-prefix level (every row sees the prefix) ⊕ a causal sparse level equals one
// block-sparse layout over [prefix; keys] with the prefix's blocks in every row: the composition
// with the cascade stays exact (the GPU test checks the same composition on the device).
TEST(BlockSparseReference, SharedPrefixLevelPlusSparseLevelComposeUnderMerge) {
  const int R = 4, C = 4, hq = 4, hkv = 2, d = 64;
  const int64_t MB = 6, NB = 8, M = R * MB, N = C * NB, pb = 3, Lp = pb * C;
  std::mt19937 rng(12);
  std::vector<int32_t> indptr = {0}, indices, cptr = {0}, cind;
  for (int64_t i = 0; i < MB; ++i) {
    for (int32_t b = 0; b < pb; ++b) cind.push_back(b);
    for (int32_t j = 0; j < NB; ++j)
      if (i != 2 && rng() % 2 == 0) {
        indices.push_back(j);
        cind.push_back(j + static_cast<int32_t>(pb));
      }
    indptr.push_back(static_cast<int32_t>(indices.size()));
    cptr.push_back(static_cast<int32_t>(cind.size()));
  }
  const BlockSparseLayout l{indptr.data(), indices.data(), M, N, R, C};
  const BlockSparseLayout lc{cptr.data(), cind.data(), M, Lp + N, R, C};
  HostTensor q(DType::f16, {M, hq, d}), kc(DType::f16, {Lp + N, hkv, d}),
      vc(DType::f16, {Lp + N, hkv, d});
  q.fill_random(1);
  kc.fill_random(2);
  vc.fill_random(3);
  const auto rows = [&](const HostTensor& t, int64_t first, int64_t n) {  // a view of rows
    const int64_t shape[3] = {n, hkv, d}, strides[3] = {hkv * d, d, 1};
    return TensorView(static_cast<uint8_t*>(const_cast<void*>(t.data())) + first * hkv * d * 2,
                      DType::f16, 3, shape, strides, Device::cpu());
  };
  BlockSparseOptions causal;
  causal.causal = true;
  HostTensor o1(DType::f32, {M, hq, d}), s1(DType::f32, {M, hq}), o2(DType::f32, {M, hq, d}),
      s2(DType::f32, {M, hq}), o(DType::f32, {M, hq, d}), so(DType::f32, {M, hq});
  reference::single_prefill(q.view(), rows(kc, 0, Lp), rows(vc, 0, Lp), o1.view(), s1.view(),
                            KVLayout::NHD);
  reference::block_sparse_attention(q.view(), rows(kc, Lp, N), rows(vc, Lp, N), l, o2.view(),
                                    s2.view(), causal);
  reference::merge_state(o1.view(), s1.view(), o2.view(), s2.view(), o.view(), so.view());
  HostTensor want(DType::f32, {M, hq, d}), want_lse(DType::f32, {M, hq});
  reference::block_sparse_attention(q.view(), kc.view(), vc.view(), lc, want.view(),
                                    want_lse.view(), causal);
  const auto a = o.to_doubles(), b = want.to_doubles();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-6) << "out[" << i << "]";
  const auto al = so.to_doubles(), bl = want_lse.to_doubles();
  for (size_t i = 0; i < al.size(); ++i) ASSERT_NEAR(al[i], bl[i], 2e-6) << "lse[" << i << "]";
}

}  // namespace
}  // namespace flashkv::test
