// Helpers of the shared-prefix tests: host page tables built from page lists, random batches with
// nested shared prefixes, and the invariants every CascadeLayout must satisfy.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "flashkv/host_tensor.h"
#include "scheduler/prefix_sharing.h"

namespace flashkv::test {

// A host page table owning its arrays.
struct PageTableHost {
  std::vector<int32_t> indptr{0}, indices, last_page_len;
  int page_size = 1;

  void add(const std::vector<int32_t>& pages, int32_t last_len) {
    indices.insert(indices.end(), pages.begin(), pages.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last_page_len.push_back(pages.empty() ? 0 : last_len);
  }
  int batch() const { return static_cast<int>(last_page_len.size()); }
  std::vector<int32_t> pages(int i) const {
    return {indices.begin() + indptr[i], indices.begin() + indptr[i + 1]};
  }
  int64_t kv_len(int i) const {
    const int64_t n = indptr[i + 1] - indptr[i];
    return n == 0 ? 0 : (n - 1) * page_size + last_page_len[i];
  }
  scheduler::PageTableSpan span() const { return {indptr, indices, last_page_len, page_size}; }
};

// A batch of `groups` top-level groups plus a few loners. Each group shares a prefix of
// 1..max_prefix_pages pages; with probability 1/2 a sub-group shares 1..4 more pages (a second
// level); every request ends in its own suffix of 0..max_suffix_tokens tokens. Page ids are a
// shuffled range; requests are shuffled too (groups are not consecutive in the batch).
inline PageTableHost random_shared_batch(uint64_t seed, int page_size, int groups, int max_group,
                                         int max_prefix_pages, int max_suffix_tokens,
                                         int* num_pages_out = nullptr) {
  SplitMix64 rng(seed);
  auto uniform = [&](int lo, int hi) { return lo + static_cast<int>(rng.next() % (hi - lo + 1)); };
  int next_page = 0;
  auto new_pages = [&](int n) {
    std::vector<int32_t> p(n);
    std::iota(p.begin(), p.end(), next_page);
    next_page += n;
    return p;
  };
  struct Req {
    std::vector<int32_t> pages;
    int32_t last;
  };
  std::vector<Req> reqs;
  auto add_suffix = [&](std::vector<int32_t> pages) {
    const int suffix = uniform(0, max_suffix_tokens);
    const int n = (suffix + page_size - 1) / page_size;
    const std::vector<int32_t> own = new_pages(n);
    pages.insert(pages.end(), own.begin(), own.end());
    const int32_t last = n == 0 ? page_size : suffix - (n - 1) * page_size;
    reqs.push_back({pages, pages.empty() ? 0 : last});
  };
  for (int g = 0; g < groups; ++g) {
    const std::vector<int32_t> prefix = new_pages(uniform(1, max_prefix_pages));
    const int size = uniform(1, max_group);
    const int sub = rng.next() % 2 ? uniform(0, size) : 0;
    const std::vector<int32_t> sub_pages = new_pages(uniform(1, 4));
    for (int m = 0; m < size; ++m) {
      std::vector<int32_t> pages = prefix;
      if (m < sub) pages.insert(pages.end(), sub_pages.begin(), sub_pages.end());
      add_suffix(pages);
    }
  }
  for (int l = uniform(0, 2); l > 0; --l) add_suffix({});
  for (size_t i = reqs.size(); i > 1; --i) std::swap(reqs[i - 1], reqs[rng.next() % i]);
  // Page ids: a shuffled permutation, so the trie sees arbitrary numbers.
  std::vector<int32_t> perm(next_page);
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.next() % i]);
  PageTableHost t;
  t.page_size = page_size;
  for (Req& r : reqs) {
    for (int32_t& p : r.pages) p = perm[p];
    t.add(r.pages, r.last);
  }
  if (num_pages_out != nullptr) *num_pages_out = next_page;
  return t;
}

// Every invariant of prefix_sharing.h: request_order is a permutation; each level partitions the
// positions into consecutive groups nested in the previous level's; shared groups hold whole
// pages and >= 2 requests (or are empty); and each request's pages over the levels concatenate
// to its original list, ending in its original last page length.
inline void expect_valid_layout(const PageTableHost& t, const scheduler::CascadeLayout& layout,
                                const std::vector<int32_t>& qo_indptr = {}) {
  const int batch = t.batch();
  ASSERT_EQ(static_cast<int>(layout.request_order.size()), batch);
  std::vector<int32_t> sorted = layout.request_order;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < batch; ++i) ASSERT_EQ(sorted[i], i);
  std::vector<int32_t> rows;
  for (int i : layout.request_order) {
    const int b = qo_indptr.empty() ? i : qo_indptr[i];
    const int e = qo_indptr.empty() ? i + 1 : qo_indptr[i + 1];
    for (int r = b; r < e; ++r) rows.push_back(r);
  }
  EXPECT_EQ(layout.qo_rows, rows);
  std::vector<std::vector<int32_t>> rebuilt(batch);
  std::vector<int32_t> last_len(batch, 0);
  const int L = layout.num_levels();
  ASSERT_GE(L, 1);
  for (int l = 0; l < L; ++l) {
    const scheduler::CascadeLevel& lv = layout.levels[l];
    const int G = lv.num_groups();
    ASSERT_EQ(static_cast<int>(lv.request_indptr.size()), G + 1);
    ASSERT_EQ(static_cast<int>(lv.qo_indptr.size()), G + 1);
    ASSERT_EQ(static_cast<int>(lv.kv_indptr.size()), G + 1);
    EXPECT_EQ(lv.request_indptr.front(), 0);
    EXPECT_EQ(lv.request_indptr.back(), batch);
    EXPECT_EQ(lv.qo_indptr.back(), static_cast<int32_t>(rows.size()));
    if (l + 1 == L) EXPECT_EQ(G, batch) << "the suffix level has one group per request";
    int32_t row = 0;
    for (int g = 0; g < G; ++g) {
      ASSERT_LT(lv.request_indptr[g], lv.request_indptr[g + 1]) << "level " << l << " group " << g;
      const int32_t pages = lv.kv_indptr[g + 1] - lv.kv_indptr[g];
      if (l > 0) {  // nested: the group lies inside one group of the previous level
        const auto& up = layout.levels[l - 1].request_indptr;
        auto it = std::upper_bound(up.begin(), up.end(), lv.request_indptr[g]);
        EXPECT_LE(lv.request_indptr[g + 1], *it) << "level " << l << " group " << g;
      }
      if (l + 1 < L && pages > 0) {
        EXPECT_GE(lv.group_size(g), 2);
        EXPECT_EQ(lv.kv_last_page_len[g], t.page_size);
      }
      for (int32_t p = lv.request_indptr[g]; p < lv.request_indptr[g + 1]; ++p) {
        const int i = layout.request_order[p];
        row += qo_indptr.empty() ? 1 : qo_indptr[i + 1] - qo_indptr[i];
        rebuilt[i].insert(rebuilt[i].end(), lv.kv_indices.begin() + lv.kv_indptr[g],
                          lv.kv_indices.begin() + lv.kv_indptr[g + 1]);
        if (pages > 0) last_len[i] = lv.kv_last_page_len[g];
      }
      EXPECT_EQ(lv.qo_indptr[g + 1], row);
    }
  }
  for (int i = 0; i < batch; ++i) {
    EXPECT_EQ(rebuilt[i], t.pages(i)) << "request " << i;
    if (!rebuilt[i].empty()) EXPECT_EQ(last_len[i], t.last_page_len[i]) << "request " << i;
  }
}

}  // namespace flashkv::test
