// The load-balanced prefill/append schedule: query tiling, causal visibility, KV chunking, greedy
// (LPT) assignment of chunks to CTAs, partial-state slots and merge items. Contract in
// prefill_scheduler.h; the algorithm is the FlashInfer paper's (docs/design.md "Layers",
// "Workspace") with tiles = (request, kv_head, query tile). The decode scheduler is the special
// case of one query token per tile; it is kept separate because decode plans run at every step
// and are tuned for that (decode_scheduler.cpp), while this one favours being easy to read.
//
// Workspace bounds for dynamic splitting, proved. Let tile j see v_j KV tokens (v_j <= INT32_MAX),
// T = sum_j v_j, C = num_ctas and L = max(min_chunk_tokens, ceil(T / C)) (rounded up to a multiple
// of split_align, which only makes it larger); so L >= T / C, i.e.
// T / L <= C. Tile j gets n_j = max(1, ceil(v_j / L)) chunks.
//  * Work items (max_prefill_work_items). n_j <= 1 + v_j / L for every tile: a tile that sees
//    nothing has n_j = 1, and for v_j >= 1, ceil(v_j / L) <= 1 + (v_j - 1) / L. Summing,
//    sum_j n_j <= #tiles + T / L <= #tiles + C.
//  * Slots (max_split_slots). Only split tiles (n_j >= 2, i.e. v_j > L) use slots, n_j each.
//    For such a tile n_j = ceil(v_j / L) < v_j / L + 1 < 2 * v_j / L, as v_j / L > 1. Summing
//    over the split tiles, slots < 2 * T / L <= 2 * C, so slots <= 2 * C - 1.
//  * Merge items: each owns >= 2 slots, so merges <= slots / 2 < C.
//  * Tiles (max_prefill_tiles). With t query tokens per tile, a request of Q >= 1 tokens has
//    ceil(Q / t) <= (Q + t - 1) / t tiles per KV head and an empty one none; at most
//    b = min(max_batch, N) requests of a batch with N query tokens are non-empty, so the tiles
//    per head are <= (N + b * (t - 1)) / t (an integer, so its floor too). The count never grows
//    with t, and choose_query_tile_rows never picks fewer tokens per tile than the smallest tile
//    that holds one token, so that tile's t bounds every choice. (Tight for one-token requests.)
// If ceil(T / C) exceeds INT32_MAX, L is clamped there: no tile (v_j <= INT32_MAX) splits and both
// bounds hold trivially. fixed_split_size has no bound in terms of C (its chunks follow the
// lengths alone) and disable_split_kv uses no slots and exactly #tiles work items.
//
// Plan time: plan() runs this at every prefill step, so the greedy takes runs of equal-cost chunks
// (GreedyLpt) instead of a walk per chunk; head-major goes chunk by chunk (its costs rise again at
// every head). What is left is mostly writing the work items in CTA order and the sort by cost.
// The times, and what a walk per chunk or std::priority_queue took
// (PrefillScheduler.PlanTimeMicroBenchmark): NOTES "Scheduler", plan time.
#include "scheduler/prefill_scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "flashkv/error.h"
#include "scheduler/greedy_lpt.h"
#include "scheduler/split_options.h"

namespace flashkv::scheduler {
namespace {

// Counts saturate here instead of overflowing; a saturated count always fails a capacity check
// (capacities are ints) and the message still says "needs >= this many".
constexpr int64_t kCountSaturation = int64_t{1} << 62;

int64_t saturating_add(int64_t a, int64_t b) { return std::min(a + b, kCountSaturation); }
int64_t saturating_mul(int64_t a, int64_t b) {  // a, b >= 0
  return (b != 0 && a > kCountSaturation / b) ? kCountSaturation : a * b;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_tile_rows(int rows) {
  return std::find(std::begin(kPrefillTileRows), std::end(kPrefillTileRows), rows) !=
         std::end(kPrefillTileRows);
}

void check_group(int group, const char* who) {
  check(group >= 1 && group <= kMaxPrefillTileRows, who,
        ": group (query heads per KV head) must be in [1, ", kMaxPrefillTileRows,
        "] so that a query tile holds a whole token (got ", group, ")");
}

// The smallest tile that holds one whole token of `group` rows.
int smallest_tile_rows(int group) {
  for (int rows : kPrefillTileRows) {
    if (rows >= group) return rows;
  }
  return kMaxPrefillTileRows;  // unreachable after check_group
}

// One past the last KV position a tile of query tokens [q_start, q_end) sees (it sees [0, end)).
int64_t visible_end(int64_t qo_len, int64_t kv_len, int64_t q_end, bool causal) {
  if (!causal) return kv_len;
  return std::clamp<int64_t>(kv_len - qo_len + q_end, 0, kv_len);
}

// The first KV position a tile whose first query token is q_start (and which sees [.., end)) is
// assigned: its first row's window start rounded down to split_align; 0 without a window.
int64_t visible_begin(int64_t qo_len, int64_t kv_len, int64_t q_start, int64_t end,
                      const PrefillScheduleOptions& o) {
  if (o.window_left < 0) return 0;
  const int64_t first = std::clamp<int64_t>(kv_len - qo_len + q_start - o.window_left, 0, end);
  return first / o.split_align * o.split_align;
}

// Chunks of a tile that sees v KV tokens, under the chunk bound L of the mode.
int64_t num_chunks(int64_t v, int64_t bound, const PrefillScheduleOptions& o) {
  if (v == 0 || o.disable_split_kv || v <= bound) return 1;
  return ceil_div(v, bound);  // fixed_split_size: bound == fs
}

void validate_options(const PrefillScheduleOptions& o) {
  validate_split_options("plan_prefill", o);
  check_group(o.group, "plan_prefill");
  check(o.window_left >= -1, "plan_prefill: window_left must be >= 0 (or -1: no window), got ",
        o.window_left);
  check(o.split_align >= 1 && o.split_align <= std::max(1, o.min_chunk_tokens),
        "plan_prefill: split_align must be in [1, min_chunk_tokens] (got ", o.split_align, ")");
  check(o.tile_rows == 0 || is_tile_rows(o.tile_rows),
        "plan_prefill: tile_rows must be 0 (choose) or one of 16, 32, 64, 128 (got ", o.tile_rows,
        ")");
  check(o.tile_rows == 0 || o.tile_rows >= o.group, "plan_prefill: tile_rows (", o.tile_rows,
        ") must be >= group (", o.group, ") so that a tile holds a whole query token");
}

void validate_lengths(std::span<const int64_t> qo_lens, std::span<const int64_t> kv_lens) {
  check(qo_lens.size() == kv_lens.size(), "plan_prefill: qo_lens has ", qo_lens.size(),
        " entries but kv_lens has ", kv_lens.size(), "; one of each per request");
  check(qo_lens.size() <= static_cast<size_t>(INT_MAX), "plan_prefill: batch of ", qo_lens.size(),
        " requests exceeds the int32 request index of PrefillWorkItem");
  for (size_t i = 0; i < qo_lens.size(); ++i) {
    for (const auto& [lens, name] :
         {std::pair{qo_lens, "qo_lens"}, std::pair{kv_lens, "kv_lens"}}) {
      check(lens[i] >= 0, "plan_prefill: ", name, "[", i, "] = ", lens[i], " is negative");
      check(lens[i] <= INT32_MAX, "plan_prefill: ", name, "[", i, "] = ", lens[i],
            " does not fit the int32 token positions of PrefillWorkItem (max ", INT32_MAX, ")");
    }
  }
}

// One KV chunk of one (request, query tile), shared by all its KV heads: the work items of the
// chunk are this piece once per kv_head.
struct Piece {
  int request;
  int q_start, q_end;
  int kv_start, kv_end;
  int chunk;        // index of the chunk within its tile
  int tile_chunks;  // chunks of its tile; 1 means write-through (no slot)
  int first_slot;   // slot of chunk 0 of the tile's kv_head 0 (head h: + h * tile_chunks); or -1
  int first_merge;  // merge item of the tile's kv_head 0 (head h: + h); or -1
  double cost;
};

// Appends the chunks of one tile that sees [begin, begin + v) to `pieces`.
void cut_tile(const Piece& tile, int64_t begin, int64_t v, int64_t n,
              const PrefillScheduleOptions& o, std::vector<Piece>& pieces) {
  const int64_t rows = int64_t{tile.q_end - tile.q_start} * o.group;
  Piece p = tile;
  p.tile_chunks = static_cast<int>(n);
  int64_t start = 0;  // relative to begin
  for (int64_t k = 0; k < n; ++k) {
    int64_t len;
    if (n == 1) {
      len = v;  // whole (or empty: one item written as zeros / -inf)
    } else if (o.fixed_split_size > 0) {
      // [0, fs), [fs, 2 fs), ...: edges depend on this tile alone (batch invariance).
      len = std::min<int64_t>(o.fixed_split_size, v - start);
    } else {
      // Near-equal in units of split_align tokens (1: tokens, as without alignment, the first
      // v % n chunks one longer): the last units % n chunks get one unit more, since the last
      // chunk ends at v, within its last unit, so no chunk is a short tail. With
      // n = ceil(v / bound), bound = m a: units <= n m, so no chunk is longer than bound.
      const int64_t a = o.split_align, units = ceil_div(v, a);
      const bool extra = a == 1 ? k < units % n : k >= n - units % n;
      len = std::min<int64_t>((units / n + (extra ? 1 : 0)) * a, v - start);
    }
    p.chunk = static_cast<int>(k);
    p.kv_start = static_cast<int>(begin + start);
    p.kv_end = static_cast<int>(begin + start + len);
    p.cost = o.cost.cost(rows, len);
    pieces.push_back(p);
    start += len;
  }
}

// Everything plan_prefill needs besides its result. One per thread, kept (as the decode
// scheduler's): a plan then allocates nothing once the buffers have grown. Per-call vectors cost
// time in every plan, and most in a one-off plan, where the allocator maps a fresh vector and
// faults it in (NOTES "Scheduler", plan time). Up to kKeptScratchItems work items' worth is kept.
struct PlanScratch {
  std::vector<Piece> pieces;
  std::vector<size_t> request_pieces;
  std::vector<uint32_t> order, rank;
  std::vector<int> cta_of, next;
  std::vector<CostRun> runs;
  GreedyLpt lpt;
};
constexpr int64_t kKeptScratchItems = int64_t{1} << 20;

void plan_prefill_into(std::span<const int64_t> qo_lens, std::span<const int64_t> kv_lens,
                       const PrefillScheduleOptions& o, PrefillSchedule& s, PlanScratch& sc) {
  validate_options(o);
  validate_lengths(qo_lens, kv_lens);
  const int batch = static_cast<int>(qo_lens.size());
  const int heads = o.num_kv_heads;
  const int ctas = o.num_ctas;
  const int tile_rows = o.tile_rows > 0 ? o.tile_rows : choose_query_tile_rows(qo_lens, o.group);
  const int tile_tokens = tile_rows / o.group;

  // Every tile has >= 1 work item: fail before walking an impossible number of tiles.
  int64_t num_tiles = 0;
  for (int r = 0; r < batch; ++r) {
    num_tiles = saturating_add(num_tiles, saturating_mul(ceil_div(qo_lens[r], tile_tokens), heads));
  }
  check(num_tiles <= o.max_work_items, "plan_prefill: the schedule needs at least ", num_tiles,
        " work items (one per query tile and KV head, ", tile_rows,
        "-row tiles) but the workspace has max_work_items = ", o.max_work_items);

  // T (visible KV over all tiles and heads) and the longest visible range; then L_kv.
  __int128 total = 0;  // up to 2^31 tiles x 2^31 tokens x 2^31 heads: int64 could overflow
  int64_t longest = 0;
  for (int r = 0; r < batch; ++r) {
    for (int64_t q = 0; q < qo_lens[r]; q += tile_tokens) {
      const int64_t q_end = std::min<int64_t>(q + tile_tokens, qo_lens[r]);
      const int64_t end = visible_end(qo_lens[r], kv_lens[r], q_end, o.causal);
      const int64_t v = end - visible_begin(qo_lens[r], kv_lens[r], q, end, o);
      total += static_cast<__int128>(v) * heads;
      longest = std::max(longest, v);
    }
  }
  int64_t bound;
  bool slot_limited = false;
  if (o.fixed_split_size > 0) {
    bound = o.fixed_split_size;
  } else if (o.disable_split_kv) {
    bound = longest;
  } else {
    // Clamping at INT32_MAX changes no chunk: no tile sees more.
    const __int128 per_cta = (total + ctas - 1) / ctas;
    bound = std::max<int64_t>(o.min_chunk_tokens,
                              static_cast<int64_t>(std::min<__int128>(per_cta, INT32_MAX)));
    // A multiple of split_align, so aligned near-equal chunks (cut_tile) never exceed it.
    bound = ceil_div(bound, o.split_align) * o.split_align;
    // A workspace with fewer slots than this bound may need: longer chunks, fewer splits.
    const int64_t fitted =
        fit_chunk_bound_to_slots(bound, longest, o.split_align, o.max_slots, [&](int64_t b) {
          int64_t slots = 0;
          for (int r = 0; r < batch; ++r) {
            for (int64_t q = 0; q < qo_lens[r]; q += tile_tokens) {
              const int64_t end = visible_end(
                  qo_lens[r], kv_lens[r], std::min<int64_t>(q + tile_tokens, qo_lens[r]), o.causal);
              const int64_t v = end - visible_begin(qo_lens[r], kv_lens[r], q, end, o);
              if (v > b) slots = saturating_add(slots, saturating_mul(ceil_div(v, b), heads));
            }
          }
          return slots;
        });
    slot_limited = fitted != bound;
    bound = fitted;
  }

  // Count items and slots before building anything, so an impossible plan fails fast.
  int64_t num_items = 0, num_slots = 0;
  for (int r = 0; r < batch; ++r) {
    for (int64_t q = 0; q < qo_lens[r]; q += tile_tokens) {
      const int64_t q_end = std::min<int64_t>(q + tile_tokens, qo_lens[r]);
      const int64_t end = visible_end(qo_lens[r], kv_lens[r], q_end, o.causal);
      const int64_t n =
          num_chunks(end - visible_begin(qo_lens[r], kv_lens[r], q, end, o), bound, o);
      num_items = saturating_add(num_items, saturating_mul(n, heads));
      if (n > 1) num_slots = saturating_add(num_slots, saturating_mul(n, heads));
    }
  }
  const char* advice = o.fixed_split_size > 0
                           ? "use a larger fixed_split_size or a larger workspace"
                           : "size the workspace with max_split_slots / max_prefill_work_items, "
                             "or use a larger fixed_split_size";
  check(num_slots <= o.max_slots, "plan_prefill: the schedule needs ", num_slots,
        " partial-state slots but the workspace has max_slots = ", o.max_slots, "; ", advice);
  check(num_items <= o.max_work_items, "plan_prefill: the schedule needs ", num_items,
        " work items but the workspace has max_work_items = ", o.max_work_items, "; ", advice);

  // Cut every tile into pieces, in (request, q_start, kv_start) order. A split tile's kv_head h
  // takes slots first_slot + h * n + [0, n) (consecutive, in KV order) and merge first_merge + h.
  std::vector<Piece>& pieces = sc.pieces;
  pieces.clear();
  pieces.reserve(static_cast<size_t>(num_items / heads));
  std::vector<size_t>& request_pieces = sc.request_pieces;  // request r's: [r], [r+1])
  request_pieces.assign(static_cast<size_t>(batch) + 1, 0);
  int next_slot = 0, next_merge = 0;
  for (int r = 0; r < batch; ++r) {
    request_pieces[r] = pieces.size();
    for (int64_t q = 0; q < qo_lens[r]; q += tile_tokens) {
      const int64_t q_end = std::min<int64_t>(q + tile_tokens, qo_lens[r]);
      const int64_t end = visible_end(qo_lens[r], kv_lens[r], q_end, o.causal);
      const int64_t begin = visible_begin(qo_lens[r], kv_lens[r], q, end, o);
      const int64_t v = end - begin;
      const int64_t n = num_chunks(v, bound, o);
      Piece tile{r, static_cast<int>(q), static_cast<int>(q_end), 0, 0, 0, 1, -1, -1, 0.0};
      if (n > 1) {
        tile.first_slot = next_slot;
        tile.first_merge = next_merge;
        next_slot += static_cast<int>(n) * heads;  // <= num_slots <= max_slots: no overflow
        next_merge += heads;
      }
      cut_tile(tile, begin, v, n, o, pieces);
    }
  }
  request_pieces[batch] = pieces.size();

  // Costliest first; ties in piece order, i.e. by (request, q_start, kv_start). The heads of a
  // piece follow one another (equal cost), so the order of chunks is total and deterministic.
  std::vector<uint32_t>& order = sc.order;
  order.resize(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    if (pieces[a].cost != pieces[b].cost) return pieces[a].cost > pieces[b].cost;
    return a < b;
  });

  // Greedy LPT: each chunk, in that order, goes to the least-loaded CTA (ties to the lower index).
  // With any order, when the last chunk c of the most loaded CTA was given its load was the
  // minimum, <= (total - c) / C: so max <= mean + max chunk.
  // The chunks go to GreedyLpt (greedy_lpt.h, the decode scheduler's) as runs of equal cost: a
  // piece's num_kv_heads chunks, and consecutive pieces of one cost (causal tiles at the same
  // position in equal requests), so a run costs one update of its queue of CTA groups, not a
  // tree walk per chunk (the batch 16 x 1024 causal plan: 4096 chunks in ~32 runs).
  // CTA of the k-th chunk assigned: request-major, chunk k is head k % heads of piece
  // order[k / heads]; head-major, head k / P of piece order[k % P] (P pieces).
  std::vector<int>& cta_of = sc.cta_of;
  cta_of.resize(static_cast<size_t>(num_items));
  s.cta_work_indptr.assign(static_cast<size_t>(ctas) + 1, 0);
  // Piece p is order[rank[p]].
  std::vector<uint32_t>& rank = sc.rank;
  rank.resize(pieces.size());
  for (size_t k = 0; k < order.size(); ++k) rank[order[k]] = static_cast<uint32_t>(k);
  const size_t num_pieces = pieces.size();
  const auto chunk_index = [&](size_t p, int h) {
    return o.head_major ? h * num_pieces + rank[p] : static_cast<size_t>(rank[p]) * heads + h;
  };
  // Head-major: head by head (each head's chunks in `order`), so the costs rise again at every
  // head, which GreedyLpt's groups do not allow: its chunk-by-chunk form, exact for any order.
  // (A std::priority_queue of (load, CTA) gives the same schedules, slower:
  // PrefillScheduler.HeadMajorMatchesPlainPriorityQueueGreedy; NOTES "Scheduler", plan time.)
  std::vector<CostRun>& runs = sc.runs;
  runs.clear();
  for (int h = 0; h < (o.head_major ? heads : 1); ++h) {
    for (uint32_t p : order) {
      const int64_t items = o.head_major ? 1 : heads;
      if (!runs.empty() && runs.back().cost == pieces[p].cost) {
        runs.back().items += items;
      } else {
        runs.push_back({pieces[p].cost, items});
      }
    }
  }
  GreedyLpt& lpt = sc.lpt;
  if (o.head_major) {
    lpt.assign_any_order(ctas, runs, cta_of.data(), s.cta_work_indptr.data() + 1);
  } else {
    lpt.assign(ctas, runs, cta_of.data(), s.cta_work_indptr.data() + 1);
  }
  s.cta_cost = lpt.loads();
  for (int c = 0; c < ctas; ++c) s.cta_work_indptr[c + 1] += s.cta_work_indptr[c];

  // Group by CTA (a counting sort), each CTA's items in (request, kv_head, q_start, kv_start)
  // order. The loads are fixed by now; the order is for the L2: the CTAs sweep the batch's
  // (request, KV head) pairs together, so the KV of a pair is read by all the CTAs that need it
  // at about the same time. (In assignment order every CTA started on the costliest tile of
  // every request at once: P1, 16 x 1024 causal, read its 67 MB of KV 13 times from DRAM.)
  // Head-major: each CTA's items in the order they were assigned (a CTA's k-th item then runs at
  // about the time the others run theirs, on the same head).
  std::vector<int>& next = sc.next;
  next.assign(s.cta_work_indptr.begin(), s.cta_work_indptr.end() - 1);
  s.work.resize(static_cast<size_t>(num_items));
  const auto write_item = [&](int h, size_t p) {
    const Piece& piece = pieces[p];
    // Every field is written, so a reused schedule keeps nothing stale; page_base, q_base,
    // diag and the lengths are the op's.
    PrefillWorkItem item{};
    item.request = piece.request;
    item.kv_head = h;
    item.q_start = piece.q_start;
    item.q_end = piece.q_end;
    item.kv_start = piece.kv_start;
    item.kv_end = piece.kv_end;
    const bool split = piece.first_slot >= 0;
    item.slot = split ? piece.first_slot + h * piece.tile_chunks + piece.chunk : -1;
    item.merge = split ? piece.first_merge + h : -1;
    item.page_base = 0;
    item.q_base = 0;
    item.diag = 0;
    item.qo_len = 0;
    item.kv_len = 0;
    s.work[next[cta_of[chunk_index(p, h)]]++] = item;
  };
  if (o.head_major) {
    for (int h = 0; h < heads; ++h)
      for (uint32_t p : order) write_item(h, p);
  } else {
    for (int r = 0; r < batch; ++r)
      for (int h = 0; h < heads; ++h)
        for (size_t p = request_pieces[r]; p < request_pieces[r + 1]; ++p) write_item(h, p);
  }

  // One merge item per split tile and head, in (request, q_start, kv_head) order.
  s.merge.clear();
  s.merge.reserve(static_cast<size_t>(next_merge));
  for (const Piece& piece : pieces) {
    if (piece.first_slot < 0 || piece.chunk != 0) continue;
    for (int h = 0; h < heads; ++h) {
      const int begin = piece.first_slot + h * piece.tile_chunks;
      s.merge.push_back({piece.request, h, piece.q_start, piece.q_end, begin,
                         begin + piece.tile_chunks, 0, 0, 0});
    }
  }
  s.num_ctas = ctas;
  s.tile_rows = tile_rows;
  s.tile_tokens = tile_tokens;
  s.num_slots = next_slot;
  s.chunk_bound = bound;
  s.slot_limited = slot_limited;
}

}  // namespace

int choose_query_tile_rows(std::span<const int64_t> qo_lens, int group) {
  check_group(group, "choose_query_tile_rows");
  __int128 sum = 0;
  int64_t non_empty = 0;
  for (size_t i = 0; i < qo_lens.size(); ++i) {
    check(qo_lens[i] >= 0, "choose_query_tile_rows: qo_lens[", i, "] = ", qo_lens[i],
          " is negative");
    sum += qo_lens[i];
    non_empty += qo_lens[i] > 0;
  }
  const int floor_rows = smallest_tile_rows(group);
  if (non_empty == 0) return floor_rows;
  // rows >= average * group  <=>  rows * non_empty >= sum * group (exact, no rounding).
  for (int rows : kPrefillTileRows) {
    if (static_cast<__int128>(rows) * non_empty >= sum * group) return std::max(rows, floor_rows);
  }
  return kMaxPrefillTileRows;
}

void plan_prefill(std::span<const int64_t> qo_lens, std::span<const int64_t> kv_lens,
                  const PrefillScheduleOptions& opts, PrefillSchedule* out) {
  check(out != nullptr, "plan_prefill: out is null");
  // Everything that can throw does so before `out` is first written.
  thread_local PlanScratch scratch;
  plan_prefill_into(qo_lens, kv_lens, opts, *out, scratch);
  if (static_cast<int64_t>(out->work.size()) > kKeptScratchItems) scratch = PlanScratch{};
}

PrefillSchedule plan_prefill(std::span<const int64_t> qo_lens, std::span<const int64_t> kv_lens,
                             const PrefillScheduleOptions& opts) {
  PrefillSchedule s;
  plan_prefill(qo_lens, kv_lens, opts, &s);
  return s;
}

int max_prefill_tiles(int max_batch, int64_t max_qo_tokens, int num_kv_heads, int group,
                      int tile_rows) {
  check(max_batch > 0 && num_kv_heads > 0 && max_qo_tokens >= 0,
        "max_prefill_tiles: max_batch and num_kv_heads must be > 0 and max_qo_tokens >= 0 (got ",
        max_batch, ", ", num_kv_heads, ", ", max_qo_tokens, ")");
  check_group(group, "max_prefill_tiles");
  check(tile_rows == 0 || (is_tile_rows(tile_rows) && tile_rows >= group),
        "max_prefill_tiles: tile_rows must be 0 (any the heuristic picks) or one of 16, 32, 64, "
        "128 and >= group (got ",
        tile_rows, ", group ", group, ")");
  const int64_t t = (tile_rows > 0 ? tile_rows : smallest_tile_rows(group)) / group;
  const int64_t non_empty = std::min<int64_t>(max_batch, max_qo_tokens);
  const __int128 per_head = (static_cast<__int128>(max_qo_tokens) + non_empty * (t - 1)) / t;
  const __int128 tiles = per_head * num_kv_heads;
  check(tiles <= INT_MAX,
        "max_prefill_tiles: ", static_cast<int64_t>(std::min<__int128>(tiles, kCountSaturation)),
        " tiles overflow int (max_batch ", max_batch, ", max_qo_tokens ", max_qo_tokens,
        ", num_kv_heads ", num_kv_heads, ")");
  return static_cast<int>(tiles);
}

int max_prefill_work_items(int max_tiles, int num_ctas) {
  check(max_tiles >= 0 && num_ctas > 0,
        "max_prefill_work_items: max_tiles must be >= 0 and num_ctas > 0 (got ", max_tiles, ", ",
        num_ctas, ")");
  const int64_t items = int64_t{max_tiles} + num_ctas;
  check(items <= INT_MAX, "max_prefill_work_items: ", max_tiles, " + ", num_ctas, " = ", items,
        " overflows int");
  return static_cast<int>(items);
}

}  // namespace flashkv::scheduler
