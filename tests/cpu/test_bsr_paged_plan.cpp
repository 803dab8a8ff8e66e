// Block-sparse attention mapped onto batch prefill over a paged view of K/V
// (ops/block_sparse/bsr_paged_plan.h), checked without a GPU: the mapped arrays run through the
// paged variant reference must equal reference::block_sparse_attention (dense masked attention
// from the layout) on random patterns: R, C in {1, 3, 16, 64, 200}, densities 1 % to 100 %, empty
// block rows, causal with R != C and M != N, element masks (rows masked entirely), GQA, soft-cap
// and sinks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "flashkv/block_sparse.h"
#include "flashkv/reference_block_sparse.h"
#include "flashkv/reference_variants.h"
#include "ops/block_sparse/bsr_paged_plan.h"

namespace flashkv::test {
namespace {

struct Case {
  int R, C;
  int64_t MB, NB;
  double density;
  bool causal = false, element_mask = false, soft_cap_and_sinks = false;
  bool diagonal = false;  // every non-empty block row holds its diagonal block (MB == NB)
  int hq = 4, hkv = 2, d = 64;
  uint64_t seed = 1;
  std::string str() const {
    return "R " + std::to_string(R) + " C " + std::to_string(C) + " MB " + std::to_string(MB) +
           " NB " + std::to_string(NB) + " density " + std::to_string(density) +
           (causal ? " causal" : "") + (element_mask ? " mask" : "") +
           (soft_cap_and_sinks ? " cap+sinks" : "") + (diagonal ? " diagonal" : "") + " H " +
           std::to_string(hq) + "/" + std::to_string(hkv);
  }
};

void run_case(const Case& c) {
  SCOPED_TRACE(c.str());
  const int64_t M = c.R * c.MB, N = c.C * c.NB;
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int32_t> indptr = {0}, indices;
  for (int64_t i = 0; i < c.MB; ++i) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < c.NB; ++j)
      if (i != c.MB / 2 && ((c.diagonal && j == i) || u(rng) < c.density))
        row.push_back(static_cast<int32_t>(j));
    std::shuffle(row.begin(), row.end(), rng);  // any order
    indices.insert(indices.end(), row.begin(), row.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  BlockSparseLayout l{indptr.data(), indices.data(), M, N, c.R, c.C};
  std::vector<uint8_t> bm;
  if (c.element_mask) {
    bm.resize(indices.size() * c.R * c.C);
    for (auto& b : bm) b = u(rng) < 0.7;
    // Row 0 of the first stored block's row keeps nothing anywhere: a fully masked row.
    for (int64_t t = indptr[0]; t < indptr[1]; ++t)
      for (int cc = 0; cc < c.C; ++cc) bm[(t * c.R) * c.C + cc] = 0;
    l.block_mask = bm.data();
  }

  HostTensor q(DType::bf16, {M, c.hq, c.d}), k(DType::bf16, {N, c.hkv, c.d}),
      v(DType::bf16, {N, c.hkv, c.d});
  q.fill_random(c.seed + 1);
  k.fill_random(c.seed + 2);
  v.fill_random(c.seed + 3);
  const HostTensor sinks = make_tensor(DType::f32, {c.hq}, std::vector<double>(c.hq, 0.75));
  BlockSparseOptions o;
  o.causal = c.causal;
  if (c.soft_cap_and_sinks) {
    o.logits_soft_cap = 3.0f;
    o.sinks = sinks.view();
  }
  HostTensor want(DType::f32, {M, c.hq, c.d}), want_lse(DType::f32, {M, c.hq});
  reference::block_sparse_attention(q.view(), k.view(), v.view(), l, want.view(), want_lse.view(),
                                    o);

  const ops::BsrPagedPlan p = ops::bsr_as_paged_prefill(l, c.causal);
  // The kernel's own causal mask exactly where it is the positional one.
  EXPECT_EQ(p.causal, c.causal && c.diagonal && c.R == c.C && c.MB == c.NB && !c.element_mask);
  EXPECT_EQ(p.has_mask(), (c.causal && !p.causal) || c.element_mask);
  EXPECT_EQ(block_sparse_mask_bytes(l, c.causal), static_cast<int64_t>(p.mask.size()));
  // k, v [N, H, D] as pages [N / C, C, H, D].
  const int64_t shape[4] = {c.NB, c.C, c.hkv, c.d};
  const int64_t strides[4] = {c.C * c.hkv * c.d, c.hkv * c.d, c.d, 1};
  const auto ints = [](const std::vector<int32_t>& x) {
    return make_i32(std::vector<int64_t>(x.begin(), x.end()));
  };
  const HostTensor kv_indptr = ints(p.kv_indptr), kv_indices = ints(p.kv_indices),
                   last = ints(p.kv_last_page_len), qo_indptr = ints(p.qo_indptr),
                   mask_indptr = ints(p.mask_indptr);
  PagedKVCache cache;
  cache.k = TensorView(k.data(), k.dtype(), 4, shape, strides, Device::cpu());
  cache.v = TensorView(v.data(), v.dtype(), 4, shape, strides, Device::cpu());
  cache.indptr = kv_indptr.view();
  cache.indices = kv_indices.view();
  cache.last_page_len = last.view();
  AttentionVariant av;
  av.causal = p.causal;
  if (c.soft_cap_and_sinks) {
    av.logits_soft_cap = 3.0f;
    av.sinks = sinks.view();
  }
  if (p.has_mask())
    av.custom_mask = {p.mask.data(), static_cast<int64_t>(p.mask.size()), mask_indptr.view()};
  HostTensor got(DType::f32, {M, c.hq, c.d}), got_lse(DType::f32, {M, c.hq});
  reference::batch_prefill_paged_variant(q.view(), qo_indptr.view(), cache, got.view(),
                                         got_lse.view(), av);

  const auto a = got.to_doubles(), b = want.to_doubles();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-12) << "out[" << i << "]";
  const auto al = got_lse.to_doubles(), bl = want_lse.to_doubles();
  int64_t empty = 0;
  for (size_t i = 0; i < al.size(); ++i) {
    if (std::isinf(bl[i])) {
      ++empty;
      ASSERT_EQ(al[i], bl[i]) << "lse[" << i << "]";
    } else {
      ASSERT_NEAR(al[i], bl[i], 1e-12 * std::max(1.0, std::abs(bl[i]))) << "lse[" << i << "]";
    }
  }
  if (!c.soft_cap_and_sinks) EXPECT_GT(empty, 0) << "the empty block row must show";
}

TEST(BsrPagedPlan, RandomPatternsMatchTheBlockSparseReference) {
  uint64_t seed = 100;
  const Case cases[] = {
      {1, 1, 40, 60, 0.3},                      // vector sparsity
      {3, 16, 10, 8, 0.5, true},                // causal, R != C, M != N
      {16, 3, 4, 30, 0.2, false, true},         // element mask
      {64, 64, 3, 4, 1.0, true},                // full density, causal
      {200, 1, 2, 300, 0.01},                   // 1 %: rows of a few keys
      {1, 200, 300, 2, 0.6, true, true, true},  // everything at once
      {16, 64, 6, 5, 0.4, false, false, true},  // soft-cap and sinks
  };
  for (Case c : cases) {
    c.seed = seed++;
    run_case(c);
  }
  // R == C, M == N, causal, diagonal blocks present: the kernel's causal mask, no custom mask
  // (blocks above the diagonal are dropped); also with soft-cap and sinks, and with C = 1.
  Case diag{16, 16, 8, 8, 0.4, true};
  diag.diagonal = true;
  for (const auto& [R, cap] : {std::pair{16, false}, std::pair{16, true}, std::pair{1, false}}) {
    Case d = diag;
    d.R = d.C = R;
    d.MB = d.NB = R == 1 ? 50 : 8;
    d.soft_cap_and_sinks = cap;
    d.seed = seed++;
    run_case(d);
  }
  Case mqa{3, 3, 12, 12, 0.5, true, true};  // MQA, head_dim 128
  mqa.hq = 8;
  mqa.hkv = 1;
  mqa.d = 128;
  mqa.seed = seed++;
  run_case(mqa);
}

TEST(BsrPagedPlan, PlainLayoutsNeedNoMaskAndKeepTheirArrays) {
  std::vector<int32_t> indptr = {0, 2, 2, 3}, indices = {4, 1, 0};
  const BlockSparseLayout l{indptr.data(), indices.data(), 9, 25, 3, 5};
  const ops::BsrPagedPlan p = ops::bsr_as_paged_prefill(l, false);
  EXPECT_FALSE(p.has_mask());
  EXPECT_EQ(p.page_size, 5);
  EXPECT_EQ(p.qo_indptr, (std::vector<int32_t>{0, 3, 6, 9}));
  EXPECT_EQ(p.kv_indptr, indptr);
  EXPECT_EQ(p.kv_indices, indices);
  EXPECT_EQ(p.kv_last_page_len, (std::vector<int32_t>{5, 0, 5}));
  EXPECT_NE(error_of([&] {
              ops::bsr_as_paged_prefill({indptr.data(), indices.data(), 9, 20, 3, 5}, false);
            }).find("outside [0, N / C = 4)"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv::test
