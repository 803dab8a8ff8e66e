// The load-balanced decode schedule: KV chunking, greedy (LPT) assignment of chunks to CTAs,
// partial-state slots and merge items. Contract in decode_scheduler.h; the algorithm is the
// FlashInfer paper's (DESIGN.md "The load-balanced schedule") with tiles = (request, kv_head).
//
// Workspace bounds for dynamic splitting (max_decode_slots, max_decode_work_items), proved:
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
// pinned plan image). Measured on the 2-vCPU dev VM, 8 KV heads, 264 CTAs, lengths 1024 +
// rng() % 2048: batch 256 (2048 chunks) went from 43 us (a tournament-tree walk per chunk) to
// ~15 us, then ~10 us (blocks, sequential item writes), then ~5 us (256 items stored instead of
// 2048, the greedy chunk by chunk over the 33 blocks).
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
#include "scheduler/greedy_lpt.h"
#include "scheduler/split_options.h"

namespace flashkv::scheduler {
namespace {

// Counts saturate here instead of overflowing; a saturated count always fails a capacity check
// (capacities are ints) and the message still says "needs >= this many".
constexpr int64_t kCountSaturation = int64_t{1} << 62;

int64_t saturating_add(int64_t a, int64_t b) { return std::min(a + b, kCountSaturation); }

// A run of equal-length, adjacent chunks of one request: chunk indices
// [first_chunk, first_chunk + count) of each of its num_kv_heads tiles. All heads of a request
// share its KV length, so a request is cut once and expanded per head; and because every chunk in
// a run has the same cost, one sort of the runs by (length desc, request) followed by expanding
// each run as (chunk, kv_head) gives every chunk in (cost desc, request, kv_start, kv_head) order
// while sorting ~batch keys instead of ~batch * num_kv_heads chunks.
struct ChunkRun {
  int request;
  int kv_start;     // first token of the run's first chunk
  int len;          // tokens in each chunk of the run
  int count;        // chunks in the run
  int first_chunk;  // index of the run's first chunk within its tile
  int tile_chunks;  // chunks per tile of this request; 1 means write-through (no slot)
  int slot_base;    // split: slot of (kv_head 0, chunk 0); (h, k)'s is slot_base + k * heads + h.
                    // -1 when not split
  int merge_base;   // split: merge item of the request's kv_head 0 tile (+ h for head h)
};

// Everything plan_decode needs besides its result. One per thread, kept: a plan at every decode
// step then allocates nothing. The buffers grow to the largest plan made on the thread, up to
// kKeptScratchItems work items' worth (a larger one is released after its plan).
struct PlanScratch {
  std::vector<ChunkRun> runs;
  std::vector<uint64_t> order, sort_tmp;
  std::vector<CostRun> costs;
  std::vector<int> unit_of, cursor, unit_count;
  GreedyLpt lpt;
  // balanced_chunk_bound's probes.
  std::vector<std::pair<int64_t, int64_t>> probe_lens;
  std::vector<CostRun> probe_costs;
  std::vector<int> probe_cta_of, probe_count;
  GreedyLpt probe_lpt;
  // Tail balancing (balance_tail).
  struct TailChunk {
    int request, kv_start, len, chunk;  // chunk: its index in the tile before any tail cut
    int tile_chunks;                    // the request's chunks per tile before any tail cut
  };
  struct TailPiece {
    int request, kv_start, len, chunk, unit;  // chunk: its index in the tile after the cuts
    double cost;
  };
  std::vector<double> head_load, tail_load;
  std::vector<int> head_count, unit_order, added, touched;
  std::vector<TailChunk> tail_chunks;
  std::vector<TailPiece> pieces, best_pieces;
  std::vector<int> tile_chunks, req_slot_base, req_merge_base;
};
constexpr int64_t kKeptScratchItems = int64_t{1} << 20;

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
constexpr int kBalanceCandidates = 4;

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

// Tail balancing (balance_tail). The greedy hands chunks, longest first, to the least-loaded unit;
// when the chunks are of similar length its last round is partial: 256 x 2048-token request
// chunks on 33 blocks give 25 blocks 8 chunks and 8 blocks 7 (makespan 8 chunks, mean 7.76).
// Cutting every chunk shorter does not help (the rounds stay whole). Instead, water-filling:
//  1. A = W / U, W the total cost of the greedy chunks, U the units. The greedy's assignment of
//     a prefix of the chunks does not depend on the rest, so it is replayed from the plain
//     greedy's: the head is the chunks before the first one that, on the least-loaded unit the
//     greedy gives it, ends above A; they keep their units (the full rounds, whole chunks).
//  2. The tail (that chunk and every later one: the shortest) is poured, in the same order and
//     each chunk in KV order, into the units in order of increasing head load (ties by index),
//     McNaughton's wrap-around rule: a unit takes whole chunks while they fit under a level M;
//     the first that does not is cut, its first piece filling the unit up to M (a piece costs
//     alpha + beta * tokens, so alpha counts for every piece) and the rest going on to the next
//     unit. No cut piece is shorter than min_chunk_tokens (a piece that would be, or leave a
//     rest that would be, is not cut: that unit's gap stays unused). Whatever is left when the
//     units are exhausted goes whole to the least-loaded unit.
//  3. M: the water level M0 of the tail alone (sum over units of max(0, M0 - head load) = tail
//     cost), raised for the pieces' alpha and the gaps left unused. Each unit is left with an
//     unused gap below alpha + beta * (2 min_chunk + 1) (the rest of a chunk of < 2 min_chunk
//     tokens that does not fit, or a gap below one min_chunk piece), and starts with at most one
//     piece cut from a chunk the previous unit began (one extra alpha); so at M0 + S, S =
//     2 alpha + beta * (2 min_chunk + 1), each unit takes >= M0 - its head load of the tail's
//     original cost, and the tail is placed before the units run out: makespan <= M0 + S <=
//     A + S, A the mean load of the plain schedule (M0 = A when, as here, every head load is
//     <= A). Lower levels are tried first (step 3 below).
//  4. The result is kept only if its makespan is below the plain greedy's (so never worse).
// Items: a unit runs its head chunks in greedy order, then its tail pieces by cost descending;
// head chunks cost >= the first tail chunk >= every piece, so each unit's list stays in
// non-increasing cost order.
// Slots and chunk indices: a request's chunks enter the greedy order in KV order (its longer
// chunks come first in KV order and in cost order), so its tail chunks are a KV suffix of its
// tile: head chunks keep their indices, and the pieces of tail chunk j become chunks j + (pieces
// added by the request's earlier tail cuts) onward. Tile chunk counts (the same for every head:
// a greedy chunk is a request chunk in block mode, and with one KV head a tile is a request),
// slot bases and merge items are then recomputed in request order, so the layout of
// decode_plan.cuh "Slots" holds unchanged, with chunks of one tile of different lengths.
// Workspace bounds: a cut makes one more greedy chunk (one stored item; num_kv_heads CTA items in
// block mode) and adds num_kv_heads slots (2 num_kv_heads when it splits a tile that was whole).
// A cut is made only while the schedule's totals stay within min(capacity, bound): stored items
// <= batch + U (= (batch * num_kv_heads + num_ctas) / ctas_per_unit: max_decode_work_items) and
// slots <= 2 * num_ctas (max_decode_slots). The plain schedule satisfies both (the proof at the
// top of the file), and each admitted cut keeps them, so they hold for the result. (The wrap
// makes at most one cut per unit it leaves, so at most U cuts: <= num_ctas more CTA items; the
// explicit check is still needed, as the plain schedule may already use most of the room.)
// Returns the head length (greedy chunks, in greedy order, kept where the plain greedy put them),
// with sc.head_load / sc.head_count the units' head loads and item counts and sc.best_pieces the
// tail's pieces; or -1 where the plain schedule stays.
int64_t balance_tail(const DecodeScheduleOptions& o, const std::vector<ChunkRun>& runs,
                     const std::vector<uint64_t>& order, const int* unit_of,
                     const std::vector<double>& plain_loads, int units, int batch,
                     int64_t num_items, int64_t num_slots, PlanScratch& sc) {
  const double alpha = o.cost.alpha, beta = o.cost.beta, inv_beta = 1 / beta;
  const int heads = o.num_kv_heads;
  const int64_t min_chunk = o.min_chunk_tokens;
  double total = 0;
  for (const uint64_t key : order) {
    const ChunkRun& run = runs[key & 0xffffffffu];
    total += run.count * o.cost.cost(1, run.len);
  }
  const double limit = total / units * (1 + 1e-12);  // A (rounding: equal fills count as fits)
  // The wrap's first level is M0 + alpha = A + alpha (step 3): a plain makespan already within
  // alpha of the mean is left as it is (most random batches: LPT is tight there; this skips
  // the tail's cost).
  const double plain_makespan = *std::max_element(plain_loads.begin(), plain_loads.end());
  if (plain_makespan <= total / units + alpha) return -1;
  // 1. Replay the greedy up to the first chunk that would end above A.
  sc.head_load.assign(static_cast<size_t>(units), 0.0);
  sc.head_count.assign(static_cast<size_t>(units), 0);
  int64_t head = -1, i = 0;
  size_t pos = 0;
  int k0 = 0;
  for (; pos < order.size() && head < 0; ++pos) {
    const ChunkRun& run = runs[order[pos] & 0xffffffffu];
    const double c = o.cost.cost(1, run.len);
    for (int k = 0; k < run.count; ++k, ++i) {
      const int u = unit_of[i];
      if (sc.head_load[u] + c > limit) {
        head = i;
        k0 = k;
        break;
      }
      sc.head_load[u] += c;
      ++sc.head_count[u];
    }
  }
  // Everything fits under A (nothing to balance), or the longest chunk alone exceeds it (only
  // cutting it would help: not the tail's business).
  if (head <= 0) return -1;
  --pos;  // the run holding the first tail chunk
  sc.tail_chunks.clear();
  double tail_total = 0;
  for (size_t p = pos; p < order.size(); ++p) {
    const ChunkRun& run = runs[order[p] & 0xffffffffu];
    for (int k = p == pos ? k0 : 0; k < run.count; ++k) {
      sc.tail_chunks.push_back(
          {run.request, run.kv_start + k * run.len, run.len, run.first_chunk + k, run.tile_chunks});
      tail_total += o.cost.cost(1, run.len);
    }
  }
  // 2. Units by head load, ties by index; the tail's water level M0.
  sc.unit_order.resize(static_cast<size_t>(units));
  for (int u = 0; u < units; ++u) sc.unit_order[u] = u;
  std::sort(sc.unit_order.begin(), sc.unit_order.end(), [&](int a, int b) {
    return sc.head_load[a] != sc.head_load[b] ? sc.head_load[a] < sc.head_load[b] : a < b;
  });
  double prefix = 0, level0 = 0;
  for (int j = 0; j < units; ++j) {
    prefix += sc.head_load[sc.unit_order[j]];
    level0 = (tail_total + prefix) / (j + 1);
    if (j + 1 == units || level0 <= sc.head_load[sc.unit_order[j + 1]]) break;
  }
  // Room for cuts within min(capacity, workspace bound) (comment above).
  const int64_t item_room =
      std::min<int64_t>(o.max_work_items, int64_t{batch} + units) - num_items;
  const int64_t slot_room = std::min<int64_t>(o.max_slots, 2 * int64_t{o.num_ctas}) - num_slots;
  sc.added.assign(static_cast<size_t>(batch), 0);
  sc.touched.clear();
  bool leftover = false;
  // The wrap at level M; returns its makespan (sc.pieces, sc.tail_load: the result). Without
  // `place_leftover`, running out of units ends it at once (leftover, makespan +inf).
  const auto wrap = [&](double level, bool place_leftover) {
    for (const int r : sc.touched) sc.added[r] = 0;
    sc.touched.clear();
    sc.pieces.clear();
    sc.tail_load = sc.head_load;
    leftover = false;
    int64_t items = 0, slots = 0;
    int at = 0;  // the unit being filled, in unit_order
    for (const PlanScratch::TailChunk& t : sc.tail_chunks) {
      const int base = t.chunk + sc.added[t.request];  // index of its first piece
      int start = t.kv_start, rest = t.len, cut = 0;
      for (;;) {
        const double c = o.cost.cost(1, rest);
        if (at == units) {  // out of units: whole, to the least-loaded one
          leftover = true;
          if (!place_leftover) return std::numeric_limits<double>::infinity();
          int u = 0;
          for (int v = 1; v < units; ++v) u = sc.tail_load[v] < sc.tail_load[u] ? v : u;
          sc.pieces.push_back({t.request, start, rest, base + cut, u, c});
          sc.tail_load[u] += c;
          break;
        }
        const int u = sc.unit_order[at];
        const double gap = level - sc.tail_load[u];
        if (c <= gap) {
          sc.pieces.push_back({t.request, start, rest, base + cut, u, c});
          sc.tail_load[u] += c;
          break;
        }
        const double fit = std::floor((gap - alpha) * inv_beta);  // tokens of a piece filling the gap
        if (fit >= static_cast<double>(min_chunk)) {
          const int64_t piece = std::min<int64_t>(static_cast<int64_t>(fit), rest - min_chunk);
          const int64_t more_slots =
              int64_t{heads} * (t.tile_chunks + sc.added[t.request] == 1 ? 2 : 1);
          if (piece >= min_chunk && items < item_room && slots + more_slots <= slot_room) {
            const double pc = o.cost.cost(1, piece);
            sc.pieces.push_back({t.request, start, static_cast<int>(piece), base + cut, u, pc});
            sc.tail_load[u] += pc;
            start += static_cast<int>(piece);
            rest -= static_cast<int>(piece);
            ++cut;
            ++items;
            slots += more_slots;
            if (sc.added[t.request]++ == 0) sc.touched.push_back(t.request);
          }
        }
        ++at;
      }
    }
    return *std::max_element(sc.tail_load.begin(), sc.tail_load.end());
  };
  // 3. The level: M0 + alpha first (about one cut per unit, each adding alpha to some unit: the
  // usual case), then M0 + 1.5 alpha, M0 + 2 alpha (D5 and D6 need ~1-1.3 alpha), then M0 + S,
  // which always places the tail (leftovers only where the room
  // for cuts ran out). A wrap costs ~30 cycles per tail chunk and unit: a search by halving
  // would cost a few microseconds of plan time for a few tokens of makespan.
  double best = plain_makespan;
  bool improved = false;
  const auto attempt = [&](double level, bool place_leftover) {
    const double makespan = wrap(level, place_leftover);
    if (makespan < best) {
      best = makespan;
      sc.best_pieces.swap(sc.pieces);
      improved = true;
    }
    return !leftover;
  };
  const double slack = 2 * alpha + beta * (2.0 * static_cast<double>(min_chunk) + 1);
  if (!attempt(level0 + alpha, false) && !attempt(level0 + 1.5 * alpha, false) &&
      !attempt(level0 + 2 * alpha, false)) {
    attempt(level0 + slack, true);
  }
  return improved ? head : -1;
}

void plan_decode_into(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& opts,
                      DecodeSchedule& s, PlanScratch& scratch) {
  validate_options(opts);
  check(kv_lens.size() <= static_cast<size_t>(INT_MAX), "plan_decode: batch of ", kv_lens.size(),
        " requests exceeds the int32 request index of DecodeWorkItem");
  const int batch = static_cast<int>(kv_lens.size());
  const int heads = opts.num_kv_heads;
  check(opts.page_base.empty() || opts.page_base.size() == kv_lens.size(),
        "plan_decode: page_base has ", opts.page_base.size(), " entries; expected ",
        kv_lens.size(), " (one per request) or none");
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
          ? "use a larger fixed_split_size or a larger workspace"
          : "size the workspace with max_decode_slots / max_decode_work_items, or use a larger "
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
  const int per_chunk = by_block ? 1 : heads;         // greedy chunks per request chunk
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
  std::vector<int>& unit_of = scratch.unit_of;  // unit of each greedy chunk, in cost order
  unit_of.resize(static_cast<size_t>(num_items));
  std::vector<int>& unit_count = scratch.unit_count;
  unit_count.assign(static_cast<size_t>(units), 0);
  scratch.lpt.assign(units, costs, unit_of.data(), unit_count.data());
  const std::vector<double>& loads = scratch.lpt.loads();
  // Tail balancing, where a greedy chunk is a whole request chunk (so the heads of a request keep
  // one chunk count): block mode, or one KV head.
  const int64_t tail_head =
      opts.balance_tail && opts.fixed_split_size == 0 && !opts.disable_split_kv &&
              per_chunk == 1 && units > 1
          ? balance_tail(opts, runs, scratch.order, unit_of.data(), loads, units, batch, num_items,
                         num_slots, scratch)
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
    const int kv_len = static_cast<int>(fill_lens ? opts.full_kv_lens[run.request]
                                                  : kv_lens[run.request]);
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

int max_decode_slots(int num_ctas) {
  check(num_ctas > 0, "max_decode_slots: num_ctas must be > 0 (got ", num_ctas, ")");
  check(num_ctas <= INT_MAX / 2,
        "max_decode_slots: 2 * num_ctas overflows int (num_ctas = ", num_ctas, ")");
  return 2 * num_ctas;
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

int max_decode_merge_items(int max_slots) {
  check(max_slots >= 0, "max_decode_merge_items: max_slots must be >= 0 (got ", max_slots, ")");
  return max_slots / 2;
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
