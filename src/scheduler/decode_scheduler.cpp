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
#include "scheduler/decode_scheduler.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flashkv/error.h"

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
// each run as (kv_head, chunk) gives every chunk in (cost desc, request, kv_head, kv_start) order
// while sorting ~batch keys instead of ~batch * num_kv_heads chunks.
struct ChunkRun {
  int request;
  int kv_start;     // first token of the run's first chunk
  int len;          // tokens in each chunk of the run
  int count;        // chunks in the run
  int first_chunk;  // index of the run's first chunk within its tile
  int tile_chunks;  // chunks per tile of this request; 1 means write-through (no slot)
  int slot_base;    // slot of chunk 0 of the request's kv_head 0 tile; -1 when not split
};

// Greedy assignment to the least-loaded CTA, ties to the lower CTA index.
//
// While some CTA is still empty, the least-loaded CTA is simply the next empty one: chunk k goes
// to CTA k as long as every cost so far is > 0 (a zero cost would leave its CTA at load 0, and
// the lowest-index CTA at load 0 wins again). After that the CTAs live in a tournament (winner)
// tree: each node holds the smaller of its children's keys, the root the global minimum. A key is
// (bits of the load) << 64 | cta: loads are non-negative, non-NaN doubles, whose bit patterns
// order like their values, so one branch-free integer compare orders by load and breaks ties by
// the lower CTA index, exactly the order of a min-heap of (load, cta).
// Measured (264 CTAs, 1784 assignments): a binary heap of (double, int) pairs with short-circuit
// compares took 55 ns per chunk (120 us for plan_decode at batch 256 x 8 heads); the same heap on
// packed keys 19 ns; this tree 18 ns, as its leaf-to-root walk has no data-dependent branch.
// One walk per chunk is then most of plan_decode's time: going faster needs assigning a run's
// equal-cost chunks together, not a faster structure.
class LeastLoadedCta {
 public:
  explicit LeastLoadedCta(int num_ctas) : load_(num_ctas, 0.0) {
    while (leaves_ < load_.size()) leaves_ *= 2;
  }

  // Adds `cost` (>= 0) to the least-loaded CTA and returns that CTA.
  int assign(double cost) {
    if (filled_ < load_.size()) {
      if (cost > 0) {
        const size_t cta = filled_++;
        load_[cta] = cost;
        if (filled_ == load_.size()) build_tree();
        return static_cast<int>(cta);
      }
      build_tree();
    }
    const int cta = static_cast<int>(static_cast<uint32_t>(tree_[1]));
    load_[cta] += cost;
    // The CTA's key won every node on its leaf-to-root path; exactly that path changes.
    size_t node = leaves_ + cta;
    Key k = key(load_[cta], cta);
    tree_[node] = k;
    for (; node > 1; node >>= 1) {
      const Key sibling = tree_[node ^ 1];
      k = sibling < k ? sibling : k;
      tree_[node >> 1] = k;
    }
    return cta;
  }

  const std::vector<double>& loads() const { return load_; }

 private:
  using Key = unsigned __int128;
  static constexpr Key kPadding = ~Key{0};  // above every real key: padding leaves never win

  static Key key(double load, int cta) {
    return (Key{std::bit_cast<uint64_t>(load)} << 64) | static_cast<uint32_t>(cta);
  }

  void build_tree() {
    tree_.assign(2 * leaves_, kPadding);
    for (size_t c = 0; c < load_.size(); ++c) {
      tree_[leaves_ + c] = key(load_[c], static_cast<int>(c));
    }
    for (size_t n = leaves_ - 1; n >= 1; --n) tree_[n] = std::min(tree_[2 * n], tree_[2 * n + 1]);
    filled_ = load_.size();
  }

  std::vector<double> load_;  // [num_ctas]
  size_t filled_ = 0;      // CTAs [0, filled_) got the first chunks; the tree exists once all did
  size_t leaves_ = 1;      // num_ctas rounded up to a power of two
  std::vector<Key> tree_;  // [2 * leaves_]: root at 1, leaf of CTA c at leaves_ + c
};

void validate_options(const DecodeScheduleOptions& o) {
  check(o.num_ctas > 0, "plan_decode: num_ctas must be > 0 (got ", o.num_ctas, ")");
  check(o.num_kv_heads > 0, "plan_decode: num_kv_heads must be > 0 (got ", o.num_kv_heads, ")");
  check(o.fixed_split_size >= 0, "plan_decode: fixed_split_size must be >= 0 (0 = dynamic; got ",
        o.fixed_split_size, ")");
  check(!(o.fixed_split_size > 0 && o.disable_split_kv), "plan_decode: fixed_split_size (",
        o.fixed_split_size, ") and disable_split_kv are mutually exclusive; set one of them");
  check(o.min_chunk_tokens > 0, "plan_decode: min_chunk_tokens must be > 0 (got ",
        o.min_chunk_tokens, ")");
  check(o.max_slots > 0, "plan_decode: max_slots must be > 0 (got ", o.max_slots, ")");
  check(o.max_work_items > 0, "plan_decode: max_work_items must be > 0 (got ", o.max_work_items,
        ")");
  check(std::isfinite(o.cost.alpha) && o.cost.alpha >= 0,
        "plan_decode: cost.alpha must be finite and >= 0 (got ", o.cost.alpha, ")");
  // beta > 0 makes cost strictly increasing in chunk length, which the run sort relies on.
  check(std::isfinite(o.cost.beta) && o.cost.beta > 0,
        "plan_decode: cost.beta must be finite and > 0 (got ", o.cost.beta, ")");
}

// The chunk bound L_kv of the batch (see the proof at the top of the file for the dynamic case).
// Also validates the lengths, whatever the mode.
int64_t chunk_bound(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& o) {
  int64_t sum = 0;  // <= INT_MAX requests * INT32_MAX tokens < 2^62: no overflow
  int64_t longest = 0;
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

// Cuts request `r` of length `l` into runs (appended to `runs`) and returns its chunks per tile.
int64_t cut_request(int r, int64_t l, int64_t bound, const DecodeScheduleOptions& o,
                    std::vector<ChunkRun>& runs) {
  const int len = static_cast<int>(l);
  if (l == 0 || o.disable_split_kv || l <= bound) {
    runs.push_back({r, 0, len, 1, 0, 1, -1});  // l == 0: one empty item, written as zeros / -inf
    return 1;
  }
  if (o.fixed_split_size > 0) {
    // [0, fs), [fs, 2 fs), ...: chunk edges depend on this request alone (batch invariance).
    const int fs = o.fixed_split_size;
    const int full = len / fs;
    const int tail = len % fs;
    runs.push_back({r, 0, fs, full, 0, full + (tail > 0), -1});
    if (tail > 0) runs.push_back({r, full * fs, tail, 1, full, full + 1, -1});
    return full + (tail > 0);
  }
  // Dynamic: n = ceil(l / L) chunks whose sizes differ by at most one token (the first l % n get
  // one more), so no chunk is a short tail and every chunk is <= L.
  const int n = static_cast<int>((l + bound - 1) / bound);
  const int q = len / n;
  const int rem = len % n;
  if (rem > 0) runs.push_back({r, 0, q + 1, rem, 0, n, -1});
  runs.push_back({r, rem * (q + 1), q, n - rem, rem, n, -1});
  return n;
}

}  // namespace

DecodeSchedule plan_decode(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& opts) {
  validate_options(opts);
  check(kv_lens.size() <= static_cast<size_t>(INT_MAX), "plan_decode: batch of ", kv_lens.size(),
        " requests exceeds the int32 request index of DecodeWorkItem");
  const int batch = static_cast<int>(kv_lens.size());
  const int heads = opts.num_kv_heads;
  const int ctas = opts.num_ctas;

  DecodeSchedule s;
  s.num_ctas = ctas;
  s.chunk_bound = chunk_bound(kv_lens, opts);

  // Cut every request; count work items and slots before building anything, so an impossible
  // plan fails fast and never allocates for its (possibly enormous) size.
  std::vector<ChunkRun> runs;
  runs.reserve(2 * static_cast<size_t>(batch));
  int64_t num_items = 0;
  int64_t num_slots = 0;
  for (int r = 0; r < batch; ++r) {
    const size_t first_run = runs.size();
    const int64_t n = cut_request(r, kv_lens[r], s.chunk_bound, opts, runs);
    num_items = saturating_add(num_items, n * heads);
    if (n > 1) {
      // Slots of tile (r, h) are slot_base + h * n + [0, n): consecutive, in KV order, and
      // ordered across tiles like the merge items.
      const int slot_base = static_cast<int>(std::min<int64_t>(num_slots, INT_MAX));
      for (size_t i = first_run; i < runs.size(); ++i) runs[i].slot_base = slot_base;
      num_slots = saturating_add(num_slots, n * heads);
    }
  }
  const char* advice =
      opts.fixed_split_size > 0
          ? "use a larger fixed_split_size or a larger workspace"
          : "size the workspace with max_decode_slots / max_decode_work_items, or use a larger "
            "fixed_split_size";
  check(num_slots <= opts.max_slots, "plan_decode: the schedule needs ", num_slots,
        " partial-state slots but the workspace has max_slots = ", opts.max_slots, "; ", advice);
  check(num_items <= opts.max_work_items, "plan_decode: the schedule needs ", num_items,
        " work items but the workspace has max_work_items = ", opts.max_work_items, "; ", advice);
  s.num_slots = static_cast<int>(num_slots);

  // Runs by chunk length descending (= cost descending, as beta > 0), ties by request: the key
  // packs (INT32_MAX - len, run index), and run indices increase with the request.
  std::vector<uint64_t> order(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    order[i] = (static_cast<uint64_t>(INT32_MAX - runs[i].len) << 32) | i;
  }
  std::sort(order.begin(), order.end());

  // Greedy LPT: each chunk, in cost order, goes to the least-loaded CTA.
  LeastLoadedCta lightest(ctas);
  std::vector<int> cta_of(static_cast<size_t>(num_items));  // CTA of each chunk, in cost order
  s.cta_work_indptr.assign(ctas + 1, 0);
  size_t next = 0;
  for (uint64_t key : order) {
    const ChunkRun& run = runs[key & 0xffffffffu];
    const double cost = opts.cost.cost(1, run.len);
    for (int k = run.count * heads; k > 0; --k) {
      const int cta = lightest.assign(cost);
      cta_of[next++] = cta;
      ++s.cta_work_indptr[cta + 1];
    }
  }
  s.cta_cost = lightest.loads();
  for (int c = 0; c < ctas; ++c) s.cta_work_indptr[c + 1] += s.cta_work_indptr[c];

  // Group by CTA (a counting sort keeps each CTA's items in assignment order), regenerating each
  // item in the same traversal order rather than storing it twice.
  std::vector<int> cursor(s.cta_work_indptr.begin(), s.cta_work_indptr.end() - 1);
  s.work.resize(static_cast<size_t>(num_items));
  next = 0;
  for (uint64_t key : order) {
    const ChunkRun& run = runs[key & 0xffffffffu];
    for (int h = 0; h < heads; ++h) {
      const int slot0 =
          run.slot_base < 0 ? -1 : run.slot_base + h * run.tile_chunks + run.first_chunk;
      for (int k = 0; k < run.count; ++k) {
        const int start = run.kv_start + k * run.len;
        // page_base is the op's to fill: it knows kv_indptr, the scheduler only lengths.
        s.work[cursor[cta_of[next++]]++] = {
            run.request, h, start, start + run.len, slot0 < 0 ? -1 : slot0 + k, /*page_base=*/0};
      }
    }
  }

  // One merge item per split tile, in (request, kv_head) order: runs are still in request order
  // and a request's first run starts at chunk 0.
  s.merge.reserve(static_cast<size_t>(num_slots / 2));
  for (const ChunkRun& run : runs) {
    if (run.slot_base < 0 || run.first_chunk != 0) continue;
    for (int h = 0; h < heads; ++h) {
      const int begin = run.slot_base + h * run.tile_chunks;
      s.merge.push_back({run.request, h, begin, begin + run.tile_chunks});
    }
  }
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

}  // namespace flashkv::scheduler
