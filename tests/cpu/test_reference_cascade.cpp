// Tests of the cascade reference (reference_cascade.h): on batches with (nested) shared prefixes
// laid out by detect_shared_prefixes(), ⊕ over the levels equals plain attention over the full
// page lists, compared in double (relative error ~1e-15) and through the public f32 outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "cpu/prefix_sharing_test_util.h"
#include "flashkv/reference.h"
#include "flashkv/reference_cascade.h"
#include "reference/attend.h"
#include "reference/cascade.h"
#include "scheduler/prefix_sharing.h"

namespace flashkv {
namespace {

using reference::CascadeLevelView;
using reference::detail::RowState;
using scheduler::CascadeLayout;
using test::HostTensor;
using test::PageTableHost;

constexpr double kDoubleTol = 1e-12;  // both sides accumulate in double

HostTensor i32(const std::vector<int32_t>& v) {
  return test::make_i32(std::vector<int64_t>(v.begin(), v.end()));
}

// A random page pool and a batch's page table over it.
struct Problem {
  PageTableHost table;
  std::vector<int32_t> qo_indptr;  // [batch + 1]
  HostTensor k, v, q;              // pool [pages, ps, H_kv, D] (NHD); q [nnz_qo, H_qo, D]
  HostTensor indptr, indices, last, qo;
  int num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;

  PagedKVCache cache() const {
    return {k.view(), v.view(), KVLayout::NHD, indptr.view(), indices.view(), last.view()};
  }
};

Problem make_problem(PageTableHost t, int num_pages, int hq, int hkv, int dim, int max_qo,
                     uint64_t seed) {
  Problem p;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = dim;
  p.qo_indptr = {0};
  SplitMix64 rng(seed);
  for (int i = 0; i < t.batch(); ++i) {
    p.qo_indptr.push_back(p.qo_indptr.back() + 1 + static_cast<int32_t>(rng.next() % max_qo));
  }
  p.k = HostTensor(DType::f32, {std::max(num_pages, 1), t.page_size, hkv, dim});
  p.v = HostTensor(DType::f32, p.k.shape());
  p.k.fill_random(seed + 1);
  p.v.fill_random(seed + 2);
  p.q = HostTensor(DType::f32, {p.qo_indptr.back(), hq, dim});
  p.q.fill_random(seed + 3, -2.0, 2.0);
  p.indptr = i32(t.indptr);
  p.indices = i32(t.indices);
  p.last = i32(t.last_page_len);
  p.qo = i32(p.qo_indptr);
  p.table = std::move(t);
  return p;
}

// Plain attention of every (row, head), in double, through the reference's own routines.
std::vector<RowState> plain_states(const Problem& p, bool causal) {
  namespace d = reference::detail;
  const d::QOShape qo{p.q.shape()[0], p.num_qo_heads, p.head_dim};
  const PagedKVCache kv = p.cache();
  const d::PageTable table = d::check_paged(kv, qo);
  const double scale = resolve_sm_scale(0.0f, p.head_dim);
  const int group = p.num_qo_heads / p.num_kv_heads;
  std::vector<RowState> out(qo.rows * p.num_qo_heads);
  for (int i = 0; i < p.table.batch(); ++i) {
    const int64_t qo_len = p.qo_indptr[i + 1] - p.qo_indptr[i];
    for (int kh = 0; kh < p.num_kv_heads; ++kh) {
      const d::KVRows rows = d::gather(d::paged_source(kv, table, i), kh, p.head_dim);
      for (int h = kh * group; h < (kh + 1) * group; ++h) {
        for (int64_t j = 0; j < qo_len; ++j) {
          const int64_t r = p.qo_indptr[i] + j;
          std::vector<double> q(p.head_dim);
          for (int x = 0; x < p.head_dim; ++x)
            q[x] = p.q.get((r * p.num_qo_heads + h) * p.head_dim + x);
          const int64_t visible = causal ? rows.len - qo_len + j + 1 : rows.len;
          out[r * p.num_qo_heads + h] = d::attend_row(q, rows, visible, scale);
        }
      }
    }
  }
  return out;
}

// The layout's levels as host tensors, and q in cascade row order.
struct CascadeInputs {
  std::vector<HostTensor> arrays;  // 4 per level
  std::vector<CascadeLevelView> levels;
  HostTensor q;
};

CascadeInputs cascade_inputs(const Problem& p, const CascadeLayout& c) {
  CascadeInputs in;
  for (const scheduler::CascadeLevel& lv : c.levels) {
    for (const auto* a : {&lv.qo_indptr, &lv.kv_indptr, &lv.kv_indices, &lv.kv_last_page_len}) {
      in.arrays.push_back(i32(*a));
    }
  }
  for (size_t l = 0; l < c.levels.size(); ++l) {
    const HostTensor* a = &in.arrays[4 * l];
    in.levels.push_back({a[0].view(), a[1].view(), a[2].view(), a[3].view()});
  }
  const int64_t row_elems = int64_t{p.num_qo_heads} * p.head_dim;
  in.q = HostTensor(DType::f32, p.q.shape());
  for (size_t j = 0; j < c.qo_rows.size(); ++j) {
    for (int64_t x = 0; x < row_elems; ++x)
      in.q.set(j * row_elems + x, p.q.get(c.qo_rows[j] * row_elems + x));
  }
  return in;
}

// Max relative error of the cascade's states (rows mapped back) against plain attention.
double max_state_error(const Problem& p, const CascadeLayout& c, bool causal) {
  const CascadeInputs in = cascade_inputs(p, c);
  const std::vector<RowState> got = reference::detail::cascade_states(
      in.q.view(), p.k.view(), p.v.view(), KVLayout::NHD, in.levels, {.causal = causal});
  const std::vector<RowState> want = plain_states(p, causal);
  double worst = 0;
  for (size_t j = 0; j < c.qo_rows.size(); ++j) {
    for (int h = 0; h < p.num_qo_heads; ++h) {
      const RowState& a = got[j * p.num_qo_heads + h];
      const RowState& b = want[c.qo_rows[j] * p.num_qo_heads + h];
      worst = std::max(worst, test::rel_err(a.o, b.o));
      if (std::isinf(b.lse)) {
        if (a.lse != b.lse) return INFINITY;
      } else {
        worst = std::max(worst, std::abs(a.lse - b.lse) / std::max(1.0, std::abs(b.lse)));
      }
    }
  }
  return worst;
}

struct Case {
  int page_size, hq, hkv;
  bool append;  // causal append on the last level (else decode)
};

TEST(ReferenceCascade, EqualsPlainAttentionOnRandomSharedBatches) {
  int levels_seen[4] = {0, 0, 0, 0};
  for (const Case& cs :
       {Case{1, 4, 4, false}, Case{1, 8, 2, true}, Case{16, 8, 2, false}, Case{16, 4, 4, true}}) {
    for (uint64_t seed = 0; seed < 6; ++seed) {
      // Prefixes of 1..300 tokens (page 1) or 16..288 (page 16); groups of 1..8; suffixes 0..100.
      const int max_prefix_pages = cs.page_size == 1 ? 300 : 18;
      int num_pages = 0;
      PageTableHost t =
          test::random_shared_batch(seed * 31 + cs.page_size, cs.page_size, 1 + seed % 3, 8,
                                    max_prefix_pages, 100, &num_pages);
      const Problem p =
          make_problem(std::move(t), num_pages, cs.hq, cs.hkv, 16, cs.append ? 6 : 1, seed + 100);
      for (int max_levels : {1, 2, 3}) {
        SCOPED_TRACE("page " + std::to_string(cs.page_size) + " hq/hkv " + std::to_string(cs.hq) +
                     "/" + std::to_string(cs.hkv) + " append " + std::to_string(cs.append) +
                     " seed " + std::to_string(seed) + " max_levels " + std::to_string(max_levels));
        const CascadeLayout c = scheduler::detect_shared_prefixes(
            p.table.span(),
            {.max_levels = max_levels, .qo_indptr = p.qo_indptr, .causal = cs.append});
        test::expect_valid_layout(p.table, c, p.qo_indptr);
        ++levels_seen[c.num_levels()];
        EXPECT_LE(max_state_error(p, c, cs.append), kDoubleTol);
      }
    }
  }
  EXPECT_GT(levels_seen[2], 0);
  EXPECT_GT(levels_seen[3], 0);
}

TEST(ReferenceCascade, PublicOutputMatchesBatchPrefillAndDecode) {
  int num_pages = 0;
  PageTableHost t = test::random_shared_batch(7, 16, 3, 8, 12, 100, &num_pages);
  for (bool append : {false, true}) {
    const Problem p = make_problem(PageTableHost(t), num_pages, 8, 2, 32, append ? 5 : 1, 11);
    const CascadeLayout c = scheduler::detect_shared_prefixes(
        p.table.span(), {.qo_indptr = p.qo_indptr, .causal = append});
    ASSERT_GE(c.num_levels(), 2);
    const CascadeInputs in = cascade_inputs(p, c);
    const int64_t rows = p.q.shape()[0];
    HostTensor out(DType::f32, {rows, 8, 32}), lse(DType::f32, {rows, 8});
    out.fill_poison();
    lse.fill_poison();
    reference::multi_level_cascade(in.q.view(), p.k.view(), p.v.view(), KVLayout::NHD, in.levels,
                                   out.view(), lse.view(), {.causal = append});
    HostTensor ref(DType::f32, {rows, 8, 32}), ref_lse(DType::f32, {rows, 8});
    if (append) {
      reference::batch_prefill_paged(p.q.view(), p.qo.view(), p.cache(), ref.view(), ref_lse.view(),
                                     {.causal = true});
    } else {
      reference::batch_decode(p.q.view(), p.cache(), ref.view(), ref_lse.view());
    }
    // Back to batch order.
    std::vector<double> o(out.numel()), s(lse.numel());
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t x = 0; x < 8 * 32; ++x) o[c.qo_rows[j] * 256 + x] = out.get(j * 256 + x);
      for (int64_t h = 0; h < 8; ++h) s[c.qo_rows[j] * 8 + h] = lse.get(j * 8 + h);
    }
    EXPECT_LE(test::rel_err(o, ref.to_doubles()),
              1e-7);  // one f32 rounding of nearly equal doubles
    EXPECT_LE(test::rel_err(s, ref_lse.to_doubles()), 1e-7);
  }
}

TEST(ReferenceCascade, HandBuiltLevelsWithEmptyGroups) {
  // 3 requests (page 2): all share pages [0 1]; 0 and 1 share [2]; suffixes [3] / [] / [4 5].
  PageTableHost t;
  t.page_size = 2;
  t.add({0, 1, 2, 3}, 1);
  t.add({0, 1, 2}, 2);
  t.add({0, 1, 4, 5}, 2);
  const Problem p = make_problem(std::move(t), 6, 4, 1, 8, 1, 3);
  CascadeLayout c;
  c.page_size = 2;
  c.request_order = {0, 1, 2};
  c.qo_rows = {0, 1, 2};
  c.levels = {{{0, 3}, {0, 3}, {0, 2}, {0, 1}, {2}},
              {{0, 2, 3}, {0, 2, 3}, {0, 1, 1}, {2}, {2, 0}},
              {{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 1, 3}, {3, 4, 5}, {1, 0, 2}}};
  EXPECT_LE(max_state_error(p, c, false), kDoubleTol);
}

TEST(ReferenceCascade, CausalRowThatStartsInsideThePrefixIsAnError) {
  // Two requests share one page of 4; request 0 has 3 rows but only 1 suffix token.
  PageTableHost t;
  t.page_size = 4;
  t.add({0, 1}, 1);
  t.add({0, 2}, 4);
  Problem p = make_problem(std::move(t), 3, 2, 2, 8, 1, 5);
  const HostTensor q(DType::f32, {4, 2, 8});
  const std::vector<std::vector<int32_t>> arrays = {{0, 4},    {0, 1},    {0},    {4},
                                                    {0, 3, 4}, {0, 1, 2}, {1, 2}, {1, 4}};
  std::vector<HostTensor> a;
  for (const auto& x : arrays) a.push_back(i32(x));
  const std::vector<CascadeLevelView> levels = {
      {a[0].view(), a[1].view(), a[2].view(), a[3].view()},
      {a[4].view(), a[5].view(), a[6].view(), a[7].view()}};
  HostTensor out(DType::f32, {4, 2, 8});
  const std::string msg = test::error_of([&] {
    reference::multi_level_cascade(q.view(), p.k.view(), p.v.view(), KVLayout::NHD, levels,
                                   out.view(), TensorView{}, {.causal = true});
  });
  EXPECT_NE(msg.find("shared prefix"), std::string::npos) << msg;
  // Without the mask the same levels are fine.
  reference::multi_level_cascade(q.view(), p.k.view(), p.v.view(), KVLayout::NHD, levels,
                                 out.view(), TensorView{}, {});
  // A bad level names it.
  HostTensor bad = i32({0, 1, 9});
  std::vector<CascadeLevelView> bad_levels = levels;
  bad_levels[1].kv_indptr = bad.view();
  EXPECT_NE(test::error_of([&] {
              reference::multi_level_cascade(q.view(), p.k.view(), p.v.view(), KVLayout::NHD,
                                             bad_levels, out.view(), TensorView{}, {});
            }).find("levels[1]"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv
