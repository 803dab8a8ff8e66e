// Variable block sparsity mapped onto one batch prefill per KV head
// (ops/block_sparse/variable_paged_plan.h), checked without a GPU: each head's arrays, run through
// the paged variant reference over that head's keys as pages of one token with its query heads,
// must equal reference::variable_block_sparse_attention on random layouts: row / column blocks of
// different sizes per head (0 included), densities 5 % to 100 %, empty block rows, causal with
// M != N, GQA and MQA, soft-cap and sinks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "flashkv/block_sparse.h"
#include "flashkv/reference_block_sparse.h"
#include "flashkv/reference_variants.h"
#include "ops/block_sparse/variable_paged_plan.h"

namespace flashkv::test {
namespace {

struct VCase {
  int64_t MB, NB, M, N;
  double density;
  bool causal = false, cap_and_sinks = false;
  int hq = 4, hkv = 2, d = 64;
  uint64_t seed = 1;
};

// Random sizes summing to `total` over `n` blocks (some 0 when total allows).
std::vector<int32_t> random_sizes(std::mt19937_64& rng, int64_t n, int64_t total) {
  std::vector<int32_t> s(n, 0);
  for (int64_t i = 0; i < total; ++i) ++s[rng() % n];
  return s;
}

void run_case(const VCase& c) {
  SCOPED_TRACE("MB " + std::to_string(c.MB) + " NB " + std::to_string(c.NB) + " M " +
               std::to_string(c.M) + " N " + std::to_string(c.N) + (c.causal ? " causal" : "") +
               " H " + std::to_string(c.hq) + "/" + std::to_string(c.hkv));
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint8_t> map(c.hkv * c.MB * c.NB);
  for (auto& b : map) b = u(rng) < c.density;
  for (int64_t b = 0; b < c.NB; ++b) map[1 * c.NB + b] = 0;  // head 0, block row 1: empty
  std::vector<int32_t> rows, cols;
  for (int h = 0; h < c.hkv; ++h) {
    const auto r = random_sizes(rng, c.MB, c.M), k = random_sizes(rng, c.NB, c.N);
    rows.insert(rows.end(), r.begin(), r.end());
    cols.insert(cols.end(), k.begin(), k.end());
  }
  if (c.MB > 1 && rows[1] == 0) {  // block row 1 of head 0 holds rows: the empty row shows
    for (int64_t a = 0; a < c.MB; ++a)
      if (rows[a] > 0) {
        --rows[a];
        ++rows[1];
        break;
      }
  }
  VariableBlockSparseLayout l{map.data(), rows.data(), cols.data(), c.hkv, c.MB, c.NB, c.M, c.N};
  check_variable_block_sparse_layout(l);

  HostTensor q(DType::f16, {c.M, c.hq, c.d}), k(DType::f16, {c.N, c.hkv, c.d}),
      v(DType::f16, {c.N, c.hkv, c.d});
  q.fill_random(c.seed + 1);
  k.fill_random(c.seed + 2);
  v.fill_random(c.seed + 3);
  std::vector<double> sink_vals;
  for (int h = 0; h < c.hq; ++h) sink_vals.push_back(0.25 * h - 0.5);
  const HostTensor sinks = make_tensor(DType::f32, {c.hq}, sink_vals);
  BlockSparseOptions o;
  o.causal = c.causal;
  if (c.cap_and_sinks) {
    o.logits_soft_cap = 2.5f;
    o.sinks = sinks.view();
  }
  HostTensor want(DType::f32, {c.M, c.hq, c.d}), want_lse(DType::f32, {c.M, c.hq});
  reference::variable_block_sparse_attention(q.view(), k.view(), v.view(), l, want.view(),
                                             want_lse.view(), o);
  HostTensor got(DType::f32, {c.M, c.hq, c.d}), got_lse(DType::f32, {c.M, c.hq});
  got.fill_poison();
  got_lse.fill_poison();
  const int g = c.hq / c.hkv;
  const auto ints = [](const std::vector<int32_t>& x) {
    return make_i32(std::vector<int64_t>(x.begin(), x.end()));
  };
  for (int h = 0; h < c.hkv; ++h) {
    const ops::BsrPagedPlan p = ops::variable_head_as_paged_prefill(l, h, c.causal);
    ASSERT_EQ(p.page_size, 1);
    ASSERT_EQ(p.qo_indptr.back(), c.M);
    const HostTensor kv_indptr = ints(p.kv_indptr), kv_indices = ints(p.kv_indices),
                     last = ints(p.kv_last_page_len), qo_indptr = ints(p.qo_indptr),
                     mask_indptr = ints(p.mask_indptr);
    // Head h's keys as pages of one token, its query heads and outputs as strided views.
    const int64_t kshape[4] = {c.N, 1, 1, c.d}, kstr[4] = {c.hkv * c.d, c.hkv * c.d, c.d, 1};
    const int64_t qshape[3] = {c.M, g, c.d}, qstr[3] = {c.hq * c.d, c.d, 1};
    const int64_t lshape[2] = {c.M, g}, lstr[2] = {c.hq, 1};
    PagedKVCache cache;
    cache.k = TensorView(static_cast<uint8_t*>(k.data()) + h * c.d * 2, DType::f16, 4, kshape, kstr,
                         Device::cpu());
    cache.v = TensorView(static_cast<uint8_t*>(v.data()) + h * c.d * 2, DType::f16, 4, kshape, kstr,
                         Device::cpu());
    cache.indptr = kv_indptr.view();
    cache.indices = kv_indices.view();
    cache.last_page_len = last.view();
    AttentionVariant av;
    if (c.cap_and_sinks) {
      av.logits_soft_cap = 2.5f;
      const int64_t ss[1] = {g}, st[1] = {1};
      av.sinks = TensorView(static_cast<uint8_t*>(const_cast<void*>(sinks.data())) + h * g * 4,
                            DType::f32, 1, ss, st, Device::cpu());
    }
    if (p.has_mask())
      av.custom_mask = {p.mask.data(), static_cast<int64_t>(p.mask.size()), mask_indptr.view()};
    reference::batch_prefill_paged_variant(
        TensorView(static_cast<uint8_t*>(q.data()) + h * g * c.d * 2, DType::f16, 3, qshape, qstr,
                   Device::cpu()),
        qo_indptr.view(), cache,
        TensorView(static_cast<uint8_t*>(got.data()) + h * g * c.d * 4, DType::f32, 3, qshape, qstr,
                   Device::cpu()),
        TensorView(static_cast<uint8_t*>(got_lse.data()) + h * g * 4, DType::f32, 2, lshape, lstr,
                   Device::cpu()),
        av);
  }
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
  if (!c.cap_and_sinks && c.MB > 1) EXPECT_GT(empty, 0) << "the empty block row must show";
}

TEST(VariablePagedPlan, RandomLayoutsMatchTheVariableReference) {
  uint64_t seed = 300;
  VCase cases[] = {
      {4, 5, 40, 50, 0.5},
      {6, 3, 30, 70, 0.7, true},        // causal, M != N
      {3, 8, 50, 20, 0.4, true, true},  // causal, M > N, soft-cap and sinks
      {5, 5, 25, 25, 1.0, true},        // full density, causal
      {8, 10, 64, 200, 0.05},           // sparse
  };
  for (VCase c : cases) {
    c.seed = seed++;
    run_case(c);
  }
  VCase mqa{4, 4, 32, 48, 0.5, true};
  mqa.hq = 8;
  mqa.hkv = 1;
  mqa.seed = seed++;
  run_case(mqa);
  VCase gqa8{3, 4, 24, 40, 0.6, false, true};
  gqa8.hq = 16;
  gqa8.hkv = 2;
  gqa8.seed = seed++;
  run_case(gqa8);
}

}  // namespace
}  // namespace flashkv::test
