// The load-balanced decode schedule: KV chunking, greedy (LPT) assignment of chunks to CTAs,
// partial-state slots and merge items. Contract in decode_scheduler.h; the algorithm is the
// FlashInfer paper's (docs/design.md "Layers", "Workspace") with tiles = (request, kv_head).
//
// Workspace bounds for dynamic splitting (max_split_slots, max_decode_work_items), proved:
// let tile i have l_i KV tokens, T = sum_i l_i, C = num_ctas and L = max(min_chunk_tokens,
// ceil(T / C)); so L >= T / C, i.e. T / L <= C. Tile i gets n_i = max(1, ceil(l_i / L)) chunks.
//  * Work items. For every tile n_i <= 1 + l_i / L: an empty tile has n_i = 1, and for l_i >= 1,
//    ceil(l_i / L) = floor((l_i + L - 1) / L) <= 1 + (l_i - 1) / L. Summing over the tiles,
//    sum_i n_i <= #tiles + T / L <= #tiles + C = max_batch * num_kv_heads + num_ctas.
//  * Slots. Only split tiles (n_i >= 2, i.e. l_i > L) use slots, n_i of them. For such a tile
//    n_i = ceil(l_i / L) < l_i / L + 1 < 2 * l_i / L, the last step because l_i / L > 1.
//    (Equivalently: its n_i near-equal chunks each hold >= floor(l_i / n_i) > L / 2 tokens.)
//    Summing over split tiles, slots < 2 * T / L <= 2 * C, so slots <= 2 * num_ctas - 1.
//  * Merge items: each owns >= 2 slots, so merges <= slots / 2 < num_ctas.
// The slot bound is tight up to a constant: C - 1 equal tiles of l > C tokens each give
// L = ceil((C - 1) * l / C) < l, so every tile splits in two: 2 * C - 2 slots.
// If L is clamped to INT32_MAX below, no tile (l_i <= INT32_MAX) splits and both bounds are
// trivial. fixed_split_size has no bound in terms of C (its chunks follow the lengths alone) and
// disable_split_kv uses no slots and exactly #tiles work items.
//
// Plan time: plan() runs plan_decode on the host at every decode step, so it is built to be cheap
// while computing exactly the schedule above. A request is cut once, not once per KV head (its
// heads share its length); the cut pieces are ordered by a radix sort on their chunk length; the
// greedy assignment (GreedyLpt, greedy_lpt.h) moves groups of equally loaded CTAs through its
// priority queue, or goes chunk by chunk where the chunks' costs are mostly distinct; when
// num_kv_heads divides num_ctas it assigns request chunks to blocks of num_kv_heads CTAs and
// stores one head-0 item per request chunk, which each CTA of the block expands for its head
// (decode_plan.cuh "Units"); items are written once, into the caller's buffer (plan() passes its
// pinned plan image). What each of these saved (DecodeScheduler.PlanTimeMicroBenchmark): NOTES
// "Scheduler", plan time.
#include "scheduler/decode_scheduler.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "flashkv/error.h"
#include "scheduler/decode_schedule_state.h"
#include "scheduler/greedy_lpt.h"
#include "scheduler/split_options.h"
#include "tuning/policy.cuh"

namespace flashkv::scheduler {
namespace {
using namespace detail;  // the plan's scratch state and tail balancing (decode_schedule_state.h)

void validate_options(const DecodeScheduleOptions& o) { validate_split_options("plan_decode", o); }

// The chunk bound L_kv of the batch (see the proof at the top of the file for the dynamic case),
// and in `longest` the longest length. Also validates the lengths, whatever the mode.
int64_t chunk_bound(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& o,
                    int64_t& longest) {
  int64_t sum = 0;  // <= INT_MAX requests * INT32_MAX tokens < 2^62: no overflow
  longest = 0;
  for (size_t i = 0; i < kv_lens.size(); ++i) {
    const int64_t l = kv_lens[i];
    check(l >= 0, "plan_decode: kv_lens[", i, "] = ", l, " is negative");
    check(l <= INT32_MAX, "plan_decode: kv_lens[", i, "] = ", l,
          " does not fit the int32 token positions of DecodeWorkItem (max ", INT32_MAX, ")");
    sum += l;
    longest = std::max(longest, l);
  }
  if (o.fixed_split_size > 0) return o.fixed_split_size;
  if (o.disable_split_kv) return longest;
  // T = sum * num_kv_heads may exceed int64; no l exceeds INT32_MAX, so clamping L there changes
  // no chunk.
  const __int128 total = static_cast<__int128>(sum) * o.num_kv_heads;
  const __int128 per_cta = (total + o.num_ctas - 1) / o.num_ctas;
  const int64_t bound = static_cast<int64_t>(std::min<__int128>(per_cta, INT32_MAX));
  return std::max<int64_t>(o.min_chunk_tokens, bound);
}

// Greedy (LPT) makespan of dynamic splitting with chunk bound `bound`, from the chunk costs
// alone (no work items are built; chunk lengths follow cut_request): the greedy itself
// (GreedyLpt) run on the runs of equal cost. (A closed form for at most 2 C chunks is tempting
// but wrong: the greedy can put three chunks on one CTA, e.g. costs 3, 1, 1, 1 on two CTAs.)
// The greedy runs over the plan's units (ctas_per_unit CTAs each: blocks, or CTAs), as the plan
// itself does.
double greedy_makespan(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& o,
                       int ctas_per_unit, int64_t bound, PlanScratch& scratch) {
  const int units = o.num_ctas / ctas_per_unit;
  const int per_chunk = o.num_kv_heads / ctas_per_unit;  // greedy chunks per request chunk
  // (chunk length, count) of every request's near-equal chunks, longest first.
  std::vector<std::pair<int64_t, int64_t>>& lens = scratch.probe_lens;
  lens.clear();
  for (const int64_t l : kv_lens) {
    const int64_t n = l <= bound ? 1 : (l + bound - 1) / bound;
    if (l % n > 0) lens.push_back({l / n + 1, l % n});
    lens.push_back({l / n, n - l % n});
  }
  std::sort(lens.begin(), lens.end(), std::greater<>());
  std::vector<CostRun>& costs = scratch.probe_costs;
  costs.clear();
  int64_t items = 0;
  for (const auto& [len, count] : lens) {
    const double c = o.cost.cost(1, len);
    if (costs.empty() || costs.back().cost != c) costs.push_back({c, 0});
    costs.back().items += count * per_chunk;
    items += count * per_chunk;
  }
  scratch.probe_cta_of.resize(static_cast<size_t>(items));
  scratch.probe_count.assign(static_cast<size_t>(units), 0);
  scratch.probe_lpt.assign(units, costs, scratch.probe_cta_of.data(), scratch.probe_count.data());
  const std::vector<double>& loads = scratch.probe_lpt.loads();
  return *std::max_element(loads.begin(), loads.end());
}

// Dynamic splitting's bound L = max(min_chunk_tokens, ceil(T / C)) balances tokens, but chunks
// are indivisible: 128 tiles of 1024 tokens on 264 CTAs give L = 497, three chunks of 341-342
// per tile, 384 chunks, so 120 CTAs run two (682 tokens) while the mean is 497; with L = 512
// every CTA runs at most one chunk of 512. So when some CTAs would run two chunks and none more
// (C < chunks at L <= 2 C), the bounds that cut the longest tile into fewer pieces (up to
// kBalanceCandidates of them, all > L, so the workspace bounds above still hold) are tried too,
// and the one with the smallest greedy makespan (ties: the larger bound, fewer chunks) wins.
// With at most C chunks a larger bound only lengthens the longest; with more than 2 C every CTA
// runs several and the greedy balances them anyway.
constexpr int kBalanceCandidates = tuning::Policy::kDecodeBalanceCandidates;

int64_t balanced_chunk_bound(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& o,
                             int ctas_per_unit, int64_t bound, PlanScratch& scratch) {
  int64_t longest = 0, chunks = 0;
  for (const int64_t l : kv_lens) {
    longest = std::max(longest, l);
    chunks += l <= bound ? 1 : (l + bound - 1) / bound;
  }
  chunks *= o.num_kv_heads;
  if (longest <= bound || chunks <= o.num_ctas || chunks > 2 * int64_t{o.num_ctas}) return bound;
  const int64_t n0 = (longest + bound - 1) / bound;  // pieces of the longest tile at `bound`
  int64_t best = bound;
  double best_makespan = greedy_makespan(kv_lens, o, ctas_per_unit, bound, scratch);
  for (int64_t n = n0 - 1; n >= std::max<int64_t>(1, n0 - kBalanceCandidates); --n) {
    const int64_t candidate = (longest + n - 1) / n;  // > bound, as n < longest / bound
    // Its chunk count and longest chunk. The makespan is at least the longest chunk's cost,
    // which only grows with the bound: once that reaches the best, no larger bound can win.
    // With at most one chunk per CTA the makespan is exactly that cost (no greedy to run).
    int64_t count = 0, chunk = 0;
    for (const int64_t l : kv_lens) {
      const int64_t pieces = l <= candidate ? 1 : (l + candidate - 1) / candidate;
      count += pieces;
      chunk = std::max(chunk, (l + pieces - 1) / pieces);
    }
    const double floor = o.cost.cost(1, chunk);
    if (floor > best_makespan) break;
    const double makespan = count * o.num_kv_heads <= o.num_ctas
                                ? floor
                                : greedy_makespan(kv_lens, o, ctas_per_unit, candidate, scratch);
    if (makespan <= best_makespan) {
      best = candidate;
      best_makespan = makespan;
    }
  }
  return best;
}

// Cuts request `r` of length `l` into runs (appended to `runs`) and returns its chunks per tile.
// The runs are in KV order, so the first holds the request's longest chunks and the last its
// shortest. Runs go to *out, which moves past them (the caller sized the buffer: at most two per
// request; a plain store, as a push_back per request was a tenth of plan time at batch 256).
int64_t cut_request(int r, int64_t l, int64_t bound, const DecodeScheduleOptions& o,
                    ChunkRun*& out) {
  const int len = static_cast<int>(l);
  if (l == 0 || o.disable_split_kv || l <= bound) {
    // l == 0: one empty item, written as zeros / -inf.
    *out++ = ChunkRun{r, 0, len, 1, 0, 1, -1, -1};
    return 1;
  }
  if (o.fixed_split_size > 0) {
    // [0, fs), [fs, 2 fs), ...: chunk edges depend on this request alone (batch invariance).
    const int fs = o.fixed_split_size;
    const int full = len / fs;
    const int tail = len % fs;
    *out++ = ChunkRun{r, 0, fs, full, 0, full + (tail > 0), -1, -1};
    if (tail > 0) *out++ = ChunkRun{r, full * fs, tail, 1, full, full + 1, -1, -1};
    return full + (tail > 0);
  }
  // Dynamic: n = ceil(l / L) chunks whose sizes differ by at most one token (the first l % n get
  // one more), so no chunk is a short tail and every chunk is <= L.
  const int n = static_cast<int>((l + bound - 1) / bound);
  const int q = len / n;
  const int rem = len % n;
  if (rem > 0) *out++ = ChunkRun{r, 0, q + 1, rem, 0, n, -1, -1};
  *out++ = ChunkRun{r, rem * (q + 1), q, n - rem, rem, n, -1, -1};
  return n;
}

// Orders the runs by chunk length descending, ties by run index (= request order): `order` gets
// (longest - len) << 32 | index, ascending, where longest / shortest bound the runs' lengths. A
// stable LSD radix sort on the bits in which the lengths differ, split evenly over the fewest
// passes of <= 8 bits (lengths < 2^31: at most 4 passes; a batch's usually span a few thousand:
// two, of 6 bits each for 1024 + rng() % 2048, whose 64-bucket histograms are cheaper to clear
// and sum than 256-bucket ones).
void sort_runs(const std::vector<ChunkRun>& runs, int longest, int shortest,
               std::vector<uint64_t>& order, std::vector<uint64_t>& tmp) {
  const size_t n = runs.size();
  order.resize(n);
  if (n <= 64) {
    for (size_t i = 0; i < n; ++i) {
      order[i] = static_cast<uint64_t>(longest - runs[i].len) << 32 | i;
    }
    std::sort(order.begin(), order.end());
    return;
  }
  tmp.resize(n);
  const int bits = std::bit_width(static_cast<uint32_t>(longest - shortest));
  const int passes = (bits + 7) / 8;
  const int digit = passes > 0 ? (bits + passes - 1) / passes : 0;
  const size_t buckets = size_t{1} << digit;
  const uint64_t mask = buckets - 1;
  uint32_t count[4][256];  // every pass's histogram, counted as the keys are made
  for (int p = 0; p < passes; ++p) std::fill_n(count[p], buckets, 0u);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t k = static_cast<uint64_t>(longest - runs[i].len) << 32 | i;
    order[i] = k;
    for (int p = 0; p < passes; ++p) ++count[p][(k >> (32 + digit * p)) & mask];
  }
  for (int p = 0; p < passes; ++p) {
    uint32_t sum = 0;
    for (size_t b = 0; b < buckets; ++b) sum += std::exchange(count[p][b], sum);
    const int shift = 32 + digit * p;
    for (uint64_t k : order) tmp[count[p][(k >> shift) & mask]++] = k;
    order.swap(tmp);
  }
}

void plan_decode_into(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& opts,
                      DecodeSchedule& s, PlanScratch& scratch) {
  validate_options(opts);
  check(kv_lens.size() <= static_cast<size_t>(INT_MAX), "plan_decode: batch of ", kv_lens.size(),
        " requests exceeds the int32 request index of DecodeWorkItem");
  const int batch = static_cast<int>(kv_lens.size());
  const int heads = opts.num_kv_heads;
  check(opts.page_base.empty() || opts.page_base.size() == kv_lens.size(),
        "plan_decode: page_base has ", opts.page_base.size(), " entries; expected ", kv_lens.size(),
        " (one per request) or none");
  check(opts.full_kv_lens.empty() || opts.full_kv_lens.size() == kv_lens.size(),
        "plan_decode: full_kv_lens has ", opts.full_kv_lens.size(), " entries; expected ",
        kv_lens.size(), " (one per request) or none");
  for (size_t r = 0; r < opts.full_kv_lens.size(); ++r) {
    check(opts.full_kv_lens[r] >= kv_lens[r] && opts.full_kv_lens[r] <= INT32_MAX,
          "plan_decode: full_kv_lens[", r, "] = ", opts.full_kv_lens[r], " must lie in [kv_lens[",
          r, "] = ", kv_lens[r], ", 2^31 - 1]");
  }
  const int ctas = opts.num_ctas;
  // Block mode (decode_scheduler.h): units of num_kv_heads CTAs, items stored once per unit.
  // With one KV head a block is one CTA: the same schedule, so the plain CTA path.
  const bool by_block = opts.block_units && heads > 1 && ctas % heads == 0;
  int64_t longest = 0;
  int64_t bound = chunk_bound(kv_lens, opts, longest);
  // (When no tile splits, there is nothing to balance: skip the pass over the lengths.)
  if (opts.fixed_split_size == 0 && !opts.disable_split_kv && opts.balance_chunk_bound &&
      longest > bound) {
    bound = balanced_chunk_bound(kv_lens, opts, by_block ? heads : 1, bound, scratch);
  }
  // A workspace with fewer slots than the bound above may need: longer chunks, fewer splits.
  bool slot_limited = false;
  if (opts.fixed_split_size == 0 && !opts.disable_split_kv && longest > bound) {
    const int64_t fitted =
        fit_chunk_bound_to_slots(bound, longest, 1, opts.max_slots, [&](int64_t b) {
          int64_t chunks = 0;
          for (const int64_t l : kv_lens) chunks += l > b ? (l + b - 1) / b : 0;
          return chunks * heads;
        });
    slot_limited = fitted != bound;
    bound = fitted;
  }

  // Cut every request; count work items and slots before building anything, so an impossible
  // plan fails fast and never allocates for its (possibly enormous) size.
  std::vector<ChunkRun>& runs = scratch.runs;
  runs.resize(2 * static_cast<size_t>(batch));
  ChunkRun* runs_end = runs.data();
  int64_t num_chunks = 0;  // request chunks: a chunk of each of the request's heads
  int64_t num_slots = 0;
  int64_t num_merges = 0;
  int longest_chunk = 0, shortest_chunk = INT_MAX;  // for sort_runs
  for (int r = 0; r < batch; ++r) {
    ChunkRun* const first_run = runs_end;
    const int64_t n = cut_request(r, kv_lens[r], bound, opts, runs_end);
    num_chunks = saturating_add(num_chunks, n);
    // A request's first run has its longest chunks, its last run its shortest (cut_request).
    longest_chunk = std::max(longest_chunk, first_run->len);
    shortest_chunk = std::min(shortest_chunk, runs_end[-1].len);
    if (n > 1) {
      // Slot of (head h, chunk k) is slot_base + k * heads + h (decode_plan.cuh "Slots"); the
      // requests' slot ranges follow one another like their merge items (merge_base + h).
      const int slot_base = static_cast<int>(std::min<int64_t>(num_slots, INT_MAX));
      const int merge_base = static_cast<int>(std::min<int64_t>(num_merges, INT_MAX));
      for (ChunkRun* run = first_run; run < runs_end; ++run) {
        run->slot_base = slot_base;
        run->merge_base = merge_base;
      }
      num_slots = saturating_add(num_slots, n * heads);
      num_merges = saturating_add(num_merges, heads);
    }
  }
  runs.resize(static_cast<size_t>(runs_end - runs.data()));
  // (num_chunks <= 2^62 and heads < 2^31: the product saturates instead of overflowing.)
  int64_t num_items =
      by_block ? num_chunks
               : (num_chunks > kCountSaturation / heads ? kCountSaturation : num_chunks * heads);
  const char* advice =
      opts.fixed_split_size > 0
          ? "use a larger fixed_split_size, or size the workspace for it "
            "(BatchDecodeConfig.max_kv_tokens and min_fixed_split_size)"
          : "size the workspace with max_split_slots / max_decode_work_items, or use a larger "
            "fixed_split_size";
  check(num_slots <= opts.max_slots, "plan_decode: the schedule needs ", num_slots,
        " partial-state slots but the workspace has max_slots = ", opts.max_slots, "; ", advice);
  check(num_items <= opts.max_work_items, "plan_decode: the schedule needs ", num_items,
        " work items but the workspace has max_work_items = ", opts.max_work_items, "; ", advice);

  // Runs by chunk length descending (= cost descending, as beta > 0), ties by request; runs of
  // one cost are one CostRun (the greedy sees only costs).
  sort_runs(runs, longest_chunk, shortest_chunk, scratch.order, scratch.sort_tmp);
  // In block mode the greedy over CTAs would hand the heads of a request chunk, which are
  // adjacent in the order and of equal cost, to one aligned block of num_kv_heads CTAs (every
  // group of equally loaded CTAs stays a union of such blocks: filling takes whole blocks, and a
  // run's chunk count is a multiple of num_kv_heads). So the greedy runs over num_ctas /
  // num_kv_heads blocks and num_kv_heads times fewer chunks, with the same result. A zero cost
  // (alpha 0, an empty request) piles chunks on one block instead of one CTA, as valid a
  // schedule (every load is unchanged by them); so would a positive cost below a load's rounding
  // step, ~1e-16 of it.
  const int units = by_block ? ctas / heads : ctas;  // what the greedy assigns to
  const int per_chunk = by_block ? 1 : heads;        // greedy chunks per request chunk
  std::vector<CostRun>& costs = scratch.costs;
  costs.clear();
  int last_len = -1;
  for (uint64_t key : scratch.order) {
    const ChunkRun& run = runs[key & 0xffffffffu];
    const int64_t items = int64_t{run.count} * per_chunk;
    if (run.len == last_len) {
      costs.back().items += items;
    } else {
      costs.push_back({opts.cost.cost(1, run.len), items});
      last_len = run.len;
    }
  }

  // Greedy LPT: each chunk, in cost order, goes to the least-loaded CTA (or block of CTAs).
  s.num_ctas = ctas;
  s.ctas_per_unit = by_block ? heads : 1;
  s.num_units = units;
  s.num_slots = static_cast<int>(num_slots);
  s.chunk_bound = bound;
  s.slot_limited = slot_limited;
  std::vector<int>& unit_of = scratch.unit_of;  // unit of each greedy chunk, in cost order
  unit_of.resize(static_cast<size_t>(num_items));
  std::vector<int>& unit_count = scratch.unit_count;
  unit_count.assign(static_cast<size_t>(units), 0);
  scratch.lpt.assign(units, costs, unit_of.data(), unit_count.data());
  const std::vector<double>& loads = scratch.lpt.loads();
  // Tail balancing, where a greedy chunk is a whole request chunk (so the heads of a request keep
  // one chunk count): block mode, or one KV head.
  const int64_t tail_head = opts.balance_tail && opts.fixed_split_size == 0 &&
                                    !opts.disable_split_kv && per_chunk == 1 && units > 1
                                ? balance_tail(opts, runs, scratch.order, unit_of.data(), loads,
                                               units, batch, num_items, num_slots, scratch)
                                : -1;
  std::vector<PlanScratch::TailPiece>& pieces = scratch.best_pieces;
  if (tail_head >= 0) {
    // Chunks per tile after the cuts (a tail piece's index + 1 at most), then the slot bases and
    // merge items in request order, as cut_request's pass made them.
    std::vector<int>& tile_chunks = scratch.tile_chunks;
    tile_chunks.resize(static_cast<size_t>(batch));
    for (const ChunkRun& run : runs) {
      if (run.first_chunk == 0) tile_chunks[run.request] = run.tile_chunks;
    }
    for (const PlanScratch::TailPiece& p : pieces) {
      tile_chunks[p.request] = std::max(tile_chunks[p.request], p.chunk + 1);
    }
    scratch.req_slot_base.resize(static_cast<size_t>(batch));
    scratch.req_merge_base.resize(static_cast<size_t>(batch));
    num_slots = 0;
    num_merges = 0;
    for (int r = 0; r < batch; ++r) {
      const bool split = tile_chunks[r] > 1;
      scratch.req_slot_base[r] = split ? static_cast<int>(num_slots) : -1;
      scratch.req_merge_base[r] = split ? static_cast<int>(num_merges) : -1;
      if (split) {
        num_slots += int64_t{tile_chunks[r]} * heads;
        num_merges += heads;
      }
    }
    for (ChunkRun& run : runs) {
      run.tile_chunks = tile_chunks[run.request];
      run.slot_base = scratch.req_slot_base[run.request];
      run.merge_base = scratch.req_merge_base[run.request];
    }
    s.num_slots = static_cast<int>(num_slots);
    num_items = tail_head + static_cast<int64_t>(pieces.size());
    // Each unit's pieces by cost descending (ties by request, then KV position), after its head.
    std::sort(pieces.begin(), pieces.end(),
              [](const PlanScratch::TailPiece& a, const PlanScratch::TailPiece& b) {
                if (a.unit != b.unit) return a.unit < b.unit;
                if (a.len != b.len) return a.len > b.len;
                if (a.request != b.request) return a.request < b.request;
                return a.kv_start < b.kv_start;
              });
    unit_count = scratch.head_count;
    scratch.tail_load = scratch.head_load;
    for (const PlanScratch::TailPiece& p : pieces) {
      ++unit_count[p.unit];
      scratch.tail_load[p.unit] += p.cost;  // in the order the items are written
    }
  }
  const std::vector<double>& unit_load = tail_head >= 0 ? scratch.tail_load : loads;
  s.unit_work_indptr.resize(static_cast<size_t>(units) + 1);
  s.unit_work_indptr[0] = 0;
  for (int u = 0; u < units; ++u) s.unit_work_indptr[u + 1] = s.unit_work_indptr[u] + unit_count[u];
  s.cta_cost.resize(static_cast<size_t>(ctas));
  for (int u = 0, c = 0; u < units; ++u) {
    for (int h = 0; h < s.ctas_per_unit; ++h) s.cta_cost[c++] = unit_load[u];
  }

  // Work item h of chunk k of a run (h = 0: a block's template). Every field is written, so a
  // reused schedule keeps nothing stale.
  const bool fill_pages = !opts.page_base.empty();
  const bool fill_lens = !opts.full_kv_lens.empty();
  const auto make_item = [&](const ChunkRun& run, int k, int h) {
    DecodeWorkItem item;
    item.request = run.request;
    item.kv_head = h;
    const int64_t scheduled = kv_lens[run.request];
    const int64_t full = fill_lens ? opts.full_kv_lens[run.request] : scheduled;
    const int skip = static_cast<int>(full - scheduled);  // keys left of a window
    item.kv_start = skip + run.kv_start + k * run.len;
    item.kv_end = item.kv_start + run.len;
    const bool split = run.slot_base >= 0;
    item.slot = split ? run.slot_base + (run.first_chunk + k) * heads + h : -1;
    item.page_base = fill_pages ? opts.page_base[run.request] : 0;
    item.merge = split ? run.merge_base + h : -1;
    item.kv_len = static_cast<int>(full);
    return item;
  };
  s.work_out = opts.work_out;
  if (opts.work_out != nullptr) {
    s.work.clear();
  } else {
    s.work.resize(static_cast<size_t>(num_items));
  }
  s.num_work_items = static_cast<int>(num_items);
  DecodeWorkItem* const work = opts.work_out != nullptr ? opts.work_out : s.work.data();
  // Group by unit (a counting sort keeps each unit's items in assignment order), building each
  // item in the traversal order of the greedy's chunks. In block mode a chunk is one template.
  scratch.cursor.assign(s.unit_work_indptr.begin(), s.unit_work_indptr.end() - 1);
  int* const next = scratch.cursor.data();
  const int* unit = unit_of.data();
  if (tail_head >= 0) {
    // The head (greedy chunks, one per request chunk), then each unit's tail pieces.
    const int* const head_end = unit + tail_head;
    for (uint64_t key : scratch.order) {
      const ChunkRun& run = runs[key & 0xffffffffu];
      for (int k = 0; k < run.count && unit < head_end; ++k) {
        work[next[*unit++]++] = make_item(run, k, 0);
      }
      if (unit == head_end) break;
    }
    for (const PlanScratch::TailPiece& p : pieces) {
      const int r = p.request;
      const int64_t scheduled = kv_lens[r];
      const int64_t full = fill_lens ? opts.full_kv_lens[r] : scheduled;
      DecodeWorkItem item;
      item.request = r;
      item.kv_head = 0;
      item.kv_start = static_cast<int>(full - scheduled) + p.kv_start;
      item.kv_end = item.kv_start + p.len;
      const int slot_base = scratch.req_slot_base[r];
      item.slot = slot_base >= 0 ? slot_base + p.chunk * heads : -1;
      item.page_base = fill_pages ? opts.page_base[r] : 0;
      item.merge = scratch.req_merge_base[r];
      item.kv_len = static_cast<int>(full);
      work[next[p.unit]++] = item;
    }
  } else {
    for (uint64_t key : scratch.order) {
      const ChunkRun& run = runs[key & 0xffffffffu];
      if (by_block) {
        for (int k = 0; k < run.count; ++k) work[next[*unit++]++] = make_item(run, k, 0);
      } else {
        // Chunks in (kv_start, kv_head) order: the heads of a request chunk are adjacent.
        for (int k = 0; k < run.count; ++k, unit += heads) {
          for (int h = 0; h < heads; ++h) work[next[unit[h]]++] = make_item(run, k, h);
        }
      }
    }
  }

  // One merge item per split tile, in (request, kv_head) order: runs are still in request order
  // and a request's first run starts at chunk 0.
  s.merge.clear();
  if (num_merges == 0) return;
  s.merge.reserve(static_cast<size_t>(num_merges));
  for (const ChunkRun& run : runs) {
    if (run.slot_base < 0 || run.first_chunk != 0) continue;
    const int kv_len =
        static_cast<int>(fill_lens ? opts.full_kv_lens[run.request] : kv_lens[run.request]);
    for (int h = 0; h < heads; ++h) {
      s.merge.push_back({run.request, h, run.slot_base + h, run.tile_chunks, heads, kv_len});
    }
  }
}

}  // namespace

// Refills *out, reusing the capacity of its vectors: a caller that plans every step can keep one
// DecodeSchedule and skip the allocations. On an exception *out is unchanged if the inputs are
// invalid or the capacities too small (everything is checked before *out is written).
void plan_decode(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& opts,
                 DecodeSchedule* out) {
  check(out != nullptr, "plan_decode: out is null");
  thread_local PlanScratch scratch;
  plan_decode_into(kv_lens, opts, *out, scratch);
  if (out->num_work_items > kKeptScratchItems) scratch = PlanScratch{};
}

DecodeSchedule plan_decode(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& opts) {
  DecodeSchedule s;
  plan_decode(kv_lens, opts, &s);
  return s;
}

int max_decode_work_items(int max_batch, int num_kv_heads, int num_ctas) {
  check(max_batch > 0 && num_kv_heads > 0 && num_ctas > 0,
        "max_decode_work_items: max_batch, num_kv_heads and num_ctas must be > 0 (got ", max_batch,
        ", ", num_kv_heads, ", ", num_ctas, ")");
  const int64_t items = int64_t{max_batch} * num_kv_heads + num_ctas;
  check(items <= INT_MAX, "max_decode_work_items: ", max_batch, " * ", num_kv_heads, " + ",
        num_ctas, " = ", items, " overflows int");
  return static_cast<int>(items);
}

int cta_work_count(const DecodeSchedule& s, int cta) {
  check(cta >= 0 && cta < s.num_ctas, "cta_work_count: CTA ", cta, " is outside [0, ", s.num_ctas,
        ")");
  const int u = cta / s.ctas_per_unit;
  return s.unit_work_indptr[u + 1] - s.unit_work_indptr[u];
}

DecodeWorkItem expand_work_item(const DecodeSchedule& s, int cta, int i) {
  const int n = cta_work_count(s, cta);
  check(i >= 0 && i < n, "expand_work_item: CTA ", cta, " runs ", n, " items; asked for item ", i);
  const DecodeWorkItem& w = s.stored_work()[s.unit_work_indptr[cta / s.ctas_per_unit] + i];
  return decode_cta_work_item(w, cta, s.ctas_per_unit);  // what the kernel does
}

DecodeSchedule expand_to_ctas(const DecodeSchedule& s) {
  DecodeSchedule e;
  e.num_ctas = s.num_ctas;
  e.ctas_per_unit = 1;
  e.num_units = s.num_ctas;
  e.merge = s.merge;
  e.num_slots = s.num_slots;
  e.chunk_bound = s.chunk_bound;
  e.cta_cost = s.cta_cost;
  e.unit_work_indptr.assign(1, 0);
  e.work.reserve(static_cast<size_t>(s.num_cta_work_items()));
  for (int c = 0; c < s.num_ctas; ++c) {
    const int n = cta_work_count(s, c);
    for (int i = 0; i < n; ++i) e.work.push_back(expand_work_item(s, c, i));
    e.unit_work_indptr.push_back(static_cast<int>(e.work.size()));
  }
  e.num_work_items = static_cast<int>(e.work.size());
  return e;
}

}  // namespace flashkv::scheduler
