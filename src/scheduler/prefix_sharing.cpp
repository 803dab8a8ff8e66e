// Shared-prefix detection: a trie over page ids, read off as nested groups (prefix_sharing.h).
#include "scheduler/prefix_sharing.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "flashkv/error.h"

namespace flashkv::scheduler {
namespace {

// One trie node = one page position shared by every request whose list passes through it.
struct TrieNode {
  int32_t count = 0;          // requests whose shareable pages pass through this node
  int32_t first_request = 0;  // smallest such request (requests are inserted in index order)
};

// A run of one request's path on which the set of requests through each node stays the same.
struct Segment {
  int32_t begin = 0, end = 0;  // page positions [begin, end) of the request's list
  int32_t group = 0;           // rank of the group: its smallest request index
};

void validate(const PageTableSpan& t, const PrefixSharingOptions& opts) {
  check(t.page_size > 0, "page_size must be positive, got ", t.page_size);
  check(!t.kv_indptr.empty(), "kv_indptr: expected batch + 1 entries, got none");
  const int batch = t.batch_size();
  check(t.kv_indptr[0] == 0, "kv_indptr[0] must be 0, got ", t.kv_indptr[0]);
  for (int i = 0; i < batch; ++i) {
    check(t.kv_indptr[i + 1] >= t.kv_indptr[i], "kv_indptr must be non-decreasing: kv_indptr[",
          i + 1, "] = ", t.kv_indptr[i + 1], " < kv_indptr[", i, "] = ", t.kv_indptr[i]);
  }
  check(static_cast<int64_t>(t.kv_indices.size()) >= t.kv_indptr[batch],
        "kv_indices: ", t.kv_indices.size(), " entries, kv_indptr[batch] = ", t.kv_indptr[batch]);
  check(static_cast<int>(t.kv_last_page_len.size()) == batch, "kv_last_page_len: expected ", batch,
        " entries (batch), got ", t.kv_last_page_len.size());
  for (int i = 0; i < batch; ++i) {
    if (t.kv_indptr[i + 1] == t.kv_indptr[i]) continue;
    check(t.kv_last_page_len[i] >= 1 && t.kv_last_page_len[i] <= t.page_size, "kv_last_page_len[",
          i, "] = ", t.kv_last_page_len[i], " is out of range [1, ", t.page_size, "]");
  }
  if (!opts.qo_indptr.empty()) {
    check(static_cast<int>(opts.qo_indptr.size()) == batch + 1, "qo_indptr: expected ", batch + 1,
          " entries (batch + 1), got ", opts.qo_indptr.size());
    check(opts.qo_indptr[0] == 0, "qo_indptr[0] must be 0, got ", opts.qo_indptr[0]);
    for (int i = 0; i < batch; ++i) {
      check(opts.qo_indptr[i + 1] >= opts.qo_indptr[i], "qo_indptr must be non-decreasing at ",
            i + 1);
    }
  }
  check(opts.max_levels >= 1, "max_levels must be >= 1, got ", opts.max_levels);
  check(opts.min_group_size >= 2, "min_group_size must be >= 2, got ", opts.min_group_size);
}

int64_t qo_begin(const PrefixSharingOptions& opts, int i) {
  return opts.qo_indptr.empty() ? i : opts.qo_indptr[i];
}
int64_t qo_len(const PrefixSharingOptions& opts, int i) {
  return opts.qo_indptr.empty() ? 1 : opts.qo_indptr[i + 1] - opts.qo_indptr[i];
}

// Pages of request i that every one of its query rows sees in full: whole pages only, and with a
// causal mask only those before the first row's horizon (prefix_sharing.h).
int32_t shareable_pages(const PageTableSpan& t, const PrefixSharingOptions& opts, int i) {
  const int32_t pages = t.kv_indptr[i + 1] - t.kv_indptr[i];
  if (pages == 0 || qo_len(opts, i) == 0) return 0;
  int32_t full = t.kv_last_page_len[i] == t.page_size ? pages : pages - 1;
  if (opts.causal) {
    const int64_t kv_len = int64_t{pages - 1} * t.page_size + t.kv_last_page_len[i];
    const int64_t seen_by_all = std::max<int64_t>(0, kv_len - qo_len(opts, i) + 1);
    full = static_cast<int32_t>(std::min<int64_t>(full, seen_by_all / t.page_size));
  }
  return full;
}

}  // namespace

int64_t CascadeLevel::kv_len(int g, int page_size) const {
  const int64_t pages = kv_indptr[g + 1] - kv_indptr[g];
  return pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[g];
}

CascadeLayout detect_shared_prefixes(const PageTableSpan& table, const PrefixSharingOptions& opts) {
  validate(table, opts);
  const int batch = table.batch_size();
  const int max_shared_levels = opts.max_levels - 1;

  // 1. The trie. Node 0 is the root; child (node, page) -> node via one hash map. Node ids are
  // assigned in insertion order, so nothing below depends on the hash map's iteration order.
  std::vector<int32_t> path_ptr(batch + 1, 0);  // request i's nodes: path[path_ptr[i] ..)
  for (int i = 0; i < batch; ++i) path_ptr[i + 1] = path_ptr[i] + shareable_pages(table, opts, i);
  std::vector<int32_t> path(path_ptr[batch]);
  std::vector<TrieNode> nodes(1);
  std::unordered_map<uint64_t, int32_t> child;
  if (max_shared_levels > 0) {
    child.reserve(path.size());
    for (int i = 0; i < batch; ++i) {
      int32_t node = 0;
      for (int32_t d = 0; d < path_ptr[i + 1] - path_ptr[i]; ++d) {
        const uint32_t page = static_cast<uint32_t>(table.kv_indices[table.kv_indptr[i] + d]);
        const uint64_t key = (static_cast<uint64_t>(node) << 32) | page;
        auto [it, inserted] = child.try_emplace(key, static_cast<int32_t>(nodes.size()));
        if (inserted) nodes.push_back({.count = 0, .first_request = i});
        node = it->second;
        ++nodes[node].count;
        path[path_ptr[i] + d] = node;
      }
    }
  }

  // 2. Each request's shared segments, outermost first: maximal runs of equal count (equal
  // count along one path means the same set of requests) while count >= min_group_size.
  std::vector<std::vector<Segment>> segments(batch);
  std::vector<int32_t> shared_pages(batch, 0);
  int num_levels = 1;
  for (int i = 0; max_shared_levels > 0 && i < batch; ++i) {
    std::vector<Segment>& segs = segments[i];
    for (int32_t d = 0; d < path_ptr[i + 1] - path_ptr[i]; ++d) {
      const TrieNode& n = nodes[path[path_ptr[i] + d]];
      if (n.count < opts.min_group_size) break;
      const bool same_set = d > 0 && nodes[path[path_ptr[i] + d - 1]].count == n.count;
      if (!same_set) {
        if (static_cast<int>(segs.size()) == max_shared_levels) break;  // deeper stays in suffix
        segs.push_back({.begin = d, .end = d, .group = n.first_request});
      }
      segs.back().end = d + 1;
    }
    shared_pages[i] = segs.empty() ? 0 : segs.back().end;
    num_levels = std::max(num_levels, static_cast<int>(segs.size()) + 1);
  }

  // 3. Request order: by (group at level 0, group at level 1, ..., request index), a request
  // outside any group at a level being its own group. Groups nest, so every level's groups are
  // then consecutive.
  auto rank = [&](int i, int level) {
    return level < static_cast<int>(segments[i].size()) ? segments[i][level].group : i;
  };
  CascadeLayout out;
  out.page_size = table.page_size;
  out.request_order.resize(batch);
  std::iota(out.request_order.begin(), out.request_order.end(), 0);
  std::sort(out.request_order.begin(), out.request_order.end(), [&](int a, int b) {
    for (int level = 0; level < num_levels - 1; ++level) {
      if (rank(a, level) != rank(b, level)) return rank(a, level) < rank(b, level);
    }
    return a < b;
  });
  for (int i : out.request_order) {
    for (int64_t r = qo_begin(opts, i); r < qo_begin(opts, i) + qo_len(opts, i); ++r) {
      out.qo_rows.push_back(static_cast<int32_t>(r));
    }
  }

  // 4. The levels. A group's pages are those of its first member (all members hold the same).
  out.levels.resize(num_levels);
  for (int level = 0; level < num_levels; ++level) {
    CascadeLevel& lv = out.levels[level];
    const bool suffix = level == num_levels - 1;
    lv.request_indptr = {0};
    lv.qo_indptr = {0};
    lv.kv_indptr = {0};
    int32_t rows = 0;
    for (int p = 0; p < batch; ++p) {
      const int i = out.request_order[p];
      rows += static_cast<int32_t>(qo_len(opts, i));
      const bool last_member =
          suffix || p + 1 == batch || rank(out.request_order[p + 1], level) != rank(i, level);
      if (!last_member) continue;
      const int first = out.request_order[lv.request_indptr.back()];
      const int32_t base = table.kv_indptr[first];
      int32_t begin = 0, end = 0, last_len = table.page_size;
      if (suffix) {
        begin = shared_pages[first];
        end = table.kv_indptr[first + 1] - base;
        last_len = table.kv_last_page_len[first];
      } else if (level < static_cast<int>(segments[first].size())) {
        begin = segments[first][level].begin;
        end = segments[first][level].end;
      }
      for (int32_t d = begin; d < end; ++d) lv.kv_indices.push_back(table.kv_indices[base + d]);
      lv.kv_last_page_len.push_back(end > begin ? last_len : 0);
      lv.kv_indptr.push_back(static_cast<int32_t>(lv.kv_indices.size()));
      lv.request_indptr.push_back(p + 1);
      lv.qo_indptr.push_back(rows);
    }
  }
  return out;
}

}  // namespace flashkv::scheduler
