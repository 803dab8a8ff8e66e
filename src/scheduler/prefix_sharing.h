// Shared-prefix detection for cascade attention (docs/design.md "Kernel families",
// composed ops).
// Pure C++: no CUDA, no KV data. Unit-tested on the CPU.
//
// When requests' page lists start with the same pages (a system prompt, parallel sampling,
// tree search), a cascade reads those pages once per group instead of once per request: each
// shared prefix is attended by all the group's query rows at once (one large query tile), each
// request's own suffix by its rows alone, and the per-level states are merged with ⊕. Only index
// arrays are built; the KV cache is not touched.
//
// detect_shared_prefixes() builds a trie over page ids (one hash-map lookup per page: O(total
// pages) expected time) and reads the groups off it. A path segment of the trie on which the
// number of requests through each node stays the same, and is >= min_group_size, is one shared
// prefix; a request's path gives its nested prefixes in order (the sets of requests sharing them
// shrink strictly with depth). Whole pages only: a partially filled last page is never shared.
//
// CascadeLayout, the output, is what a MultiLevelCascade plan()/run() consumes (FlashInfer's
// multi-level cascade arrays, plus a request order):
//
//   cascade rows: the batch's query rows reordered so that the requests of every group, at every
//     level, are consecutive: request_order[p] is the request at position p, and cascade row j is
//     the original query row qo_rows[j] (decode: one row per request, qo_rows == request_order).
//     A GPU run gathers q rows through qo_rows (or the caller passes q already in this order when
//     request_order is the identity) and scatters the merged output back the same way.
//   levels[0 .. L-2]: shared prefixes, outermost first. Every level partitions ALL requests into
//     consecutive groups (level k+1's groups nest inside level k's). A group that shares nothing
//     at that level is one request with no pages: its state is (0, -inf), the identity of ⊕, and
//     a kernel may skip it. Shared groups hold whole pages (kv_last_page_len = page_size). These
//     levels are attended WITHOUT a causal mask: detection only shares pages every query row of
//     every member sees in full (see PrefixSharingOptions::causal).
//   levels[L-1]: one group per request (in request_order), holding the pages after its shared
//     prefixes, ending in its original (possibly partial) last page; possibly empty. Attended as
//     the plain op would (causal, aligned to the end of the suffix = the end of the request's KV).
//   L == 1 means nothing is shared: levels[0] is the batch's own page table, reordered.
//
// Each level is a page table over the same paged cache (kv_indptr / kv_indices /
// kv_last_page_len, as in paged_kv.h, with groups as its "requests"), plus qo_indptr over the
// cascade rows and request_indptr over request_order positions. Merging the L states of each
// row with ⊕ equals plain attention of its request over the full page list.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace flashkv::scheduler {

// A batch's host page table (paged_kv.h conventions).
struct PageTableSpan {
  std::span<const int32_t> kv_indptr;         // [batch + 1]
  std::span<const int32_t> kv_indices;        // [kv_indptr[batch]] page ids
  std::span<const int32_t> kv_last_page_len;  // [batch]; ignored for requests with no pages
  int page_size = 0;
  int batch_size() const { return static_cast<int>(kv_indptr.size()) - 1; }
};

struct PrefixSharingOptions {
  // Levels of the output, the suffix level included: 1 turns sharing off, 2 gives one level of
  // shared prefixes, 3 (FlashInfer's usual depth) nested ones. Prefixes nested deeper than
  // max_levels - 1 stay in the members' suffixes (still correct, just not shared).
  int max_levels = 3;
  int min_group_size = 2;  // fewer requests than this never form a group (>= 2)
  // Query rows per request: qo_indptr [batch + 1]; empty means decode (one row per request).
  // Requests with no query rows share nothing (there is nothing to save).
  std::span<const int32_t> qo_indptr;
  // Causal attention (aligned to the end of the KV, attention.h): query row i of a request with
  // qo_len rows and kv_len keys sees keys < kv_len - qo_len + i + 1, so only the first
  // floor((kv_len - qo_len + 1) / page_size) pages are visible to all its rows and may be shared.
  // (Decode, qo_len 1, sees every page either way.)
  bool causal = false;
};

// One level: a page table whose "requests" are groups of consecutive cascade rows.
struct CascadeLevel {
  std::vector<int32_t> request_indptr;    // [num_groups + 1] over request_order positions
  std::vector<int32_t> qo_indptr;         // [num_groups + 1] over cascade rows
  std::vector<int32_t> kv_indptr;         // [num_groups + 1] into kv_indices
  std::vector<int32_t> kv_indices;        // page ids of the original cache (no KV is copied)
  std::vector<int32_t> kv_last_page_len;  // [num_groups]; 0 for a group with no pages
  int num_groups() const { return static_cast<int>(kv_last_page_len.size()); }
  // Tokens group g attends at this level.
  int64_t kv_len(int g, int page_size) const;
  int group_size(int g) const { return request_indptr[g + 1] - request_indptr[g]; }
};

struct CascadeLayout {
  int page_size = 0;
  std::vector<int32_t> request_order;  // [batch] request at each position (a permutation)
  std::vector<int32_t> qo_rows;        // [nnz_qo] original query row of each cascade row
  std::vector<CascadeLevel> levels;    // shared prefixes outermost first; back() = suffixes
  int num_levels() const { return static_cast<int>(levels.size()); }
  bool has_shared_prefix() const { return levels.size() > 1; }
};

// Finds the groups of requests whose page lists start with the same full pages and lays them out
// as cascade levels. Deterministic: the same arrays always give the same layout, whatever the
// hash map does (groups are ordered by their smallest request index; requests keep their
// relative order within a group). Throws flashkv::Error on an invalid page table or options.
CascadeLayout detect_shared_prefixes(const PageTableSpan& table,
                                     const PrefixSharingOptions& opts = {});

}  // namespace flashkv::scheduler
