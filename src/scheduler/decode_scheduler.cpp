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
// greedy assignment moves groups of equally loaded CTAs through its priority queue, not single
// chunks (GreedyLpt), and when num_kv_heads divides num_ctas it assigns request chunks to blocks
// of num_kv_heads CTAs; items are written once, CTA by CTA, into the caller's buffer (plan()
// passes its pinned plan image). Measured on the 2-vCPU dev VM, 8 KV heads, 264 CTAs, lengths
// 1024 + rng() % 2048: batch 256 (2048 chunks) went from 43 us (a tournament-tree walk per
// chunk) to ~15 us, then ~10 us (blocks, sequential item writes).
#include "scheduler/decode_scheduler.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "flashkv/error.h"
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
  int slot_base;    // slot of chunk 0 of the request's kv_head 0 tile; -1 when not split
  int merge_base;   // split: merge item of the request's kv_head 0 tile (+ h for head h)
};

// `items` consecutive chunks (in assignment order) of cost `cost`.
struct CostRun {
  double cost;
  int64_t items;
};

// Greedy assignment (LPT): each chunk, in order of non-increasing cost, goes to the least-loaded
// CTA, ties to the lower CTA index. Exact: every chunk gets the CTA that popping a min-heap of
// (load, cta) would give it, and every load is the same sum, in the same order, as that heap's.
//
// Groups. CTAs with equal loads form a group: a slice of pool_, sorted by CTA index. Greedy hands
// chunks of equal cost c > 0 to the least-loaded group G (load L) one per CTA in index order: once
// a CTA takes one, its key (L + c, cta) is above (L, next CTA of G). So with k chunks of cost c
// left, t = min(|G|, k) go to the first t CTAs of G, which become a group at L + c, and the other
// CTAs of G stay a group at L. Only groups enter the priority queue, so a run of chunks costs one
// queue update, not one per chunk: the num_kv_heads chunks of a request have one cost, and a
// group of CTAs that took such chunks together usually takes the next ones together (when
// num_kv_heads divides num_ctas, every group stays a multiple of num_kv_heads CTAs). No two
// groups share a load: a group reaching another's load merges into it (greedy then interleaves
// their CTAs by index), found through a hash index of the groups' loads.
//
// The priority queue is a tournament (winner) tree over group slots: a slot's leaf holds its
// group's load (+inf when free); each node holds the smaller load of its two children and the slot
// it came from, so the root holds the least-loaded group. Loads are compared as bit patterns
// (non-negative, non-NaN doubles order like their bits); as groups have distinct loads, no ties
// need breaking, and a group's slot is arbitrary: the CTAs that stay at L keep G's slot and leaf,
// so every popped group costs at most one leaf update, log2(#slots) steps to the root (slots are
// reused, so there are about as many as groups: num_ctas / num_kv_heads or a few times that).
//
// Filling: while some CTA is empty, chunk k goes to CTA k. A zero cost (alpha = 0, empty request)
// leaves the least-loaded CTA where it is for good, as every later cost is zero too.
//
// Measured (264 CTAs, 8 KV heads, batch 256 = 2048 chunks): ~2.5 ns per chunk, against ~18 ns
// for a walk of a tournament tree over the CTAs per chunk (55 ns for a binary heap of
// (double, int) pairs).
class GreedyLpt {
 public:
  // Assigns the chunks of `runs` (costs non-increasing) to num_ctas CTAs: cta_of[i] gets the
  // CTA of chunk i, count[c] (zeroed by the caller) the number of chunks of CTA c.
  void assign(int num_ctas, std::span<const CostRun> runs, int* cta_of, int* count) {
    const size_t ctas = static_cast<size_t>(num_ctas);
    load_.assign(ctas, 0.0);
    pool_.resize(ctas);
    start_.resize(ctas);
    size_.resize(ctas);
    slots_ = 0;
    int64_t i = 0;     // the next chunk
    size_t r = 0;      // its run
    int64_t done = 0;  // chunks of run r assigned in filling

    // Filling: a run's chunks go to the next empty CTAs, which form a group (with the previous
    // run's, when its cost is the same). Group g takes slot g.
    size_t filled = 0;
    while (r < runs.size() && filled < ctas) {
      const double cost = runs[r].cost;
      if (!(cost > 0)) {
        give_all(runs.subspan(r), 0, static_cast<int>(filled), cta_of + i, count);
        return;
      }
      const int64_t t = std::min<int64_t>(runs[r].items, static_cast<int64_t>(ctas - filled));
      if (slots_ == 0 || load_[filled - 1] != cost) {
        start_[slots_] = static_cast<int>(filled);
        size_[slots_++] = 0;
      }
      size_[slots_ - 1] += static_cast<int>(t);
      for (int64_t k = 0; k < t; ++k, ++filled) {
        pool_[filled] = static_cast<int>(filled);
        load_[filled] = cost;
        ++count[filled];
        cta_of[i++] = static_cast<int>(filled);
      }
      if (t < runs[r].items) {
        done = t;
        break;
      }
      ++r;
    }
    if (r == runs.size()) return;  // every chunk placed: no queue needed

    // The queue and the index, for the groups the filling made.
    index_.reset(ctas);
    free_.clear();
    leaves_ = 0;
    grow_tree(std::bit_ceil(static_cast<size_t>(slots_)));
    for (int g = 0; g < slots_; ++g) index_.insert(tree_[leaves_ + g], g);
    pop_groups(runs.subspan(r), done, cta_of + i, count);
    // Every CTA of a group has the group's load.
    for (int g = 0; g < slots_; ++g) {
      if (tree_[leaves_ + g] == kNone) continue;
      const double load = std::bit_cast<double>(tree_[leaves_ + g]);
      for (int k = start_[g]; k < start_[g] + size_[g]; ++k) load_[pool_[k]] = load;
    }
  }

  const std::vector<double>& loads() const { return load_; }

 private:
  static constexpr uint64_t kNone = ~uint64_t{0};  // a free slot's leaf: above every load

  // The greedy after filling: hands the chunks of `runs`, but the first `done`, to the groups.
  void pop_groups(std::span<const CostRun> runs, int64_t done, int* cta_of, int* count) {
    for (size_t r = 0; r < runs.size(); ++r, done = 0) {
      const double cost = runs[r].cost;
      int64_t left = runs[r].items - done;
      while (left > 0) {
        const int g = winner_[1];
        const uint64_t bits = tree_[1];
        const double load = std::bit_cast<double>(bits);
        const double next_load = load + cost;
        const int s = start_[g];
        const int m = size_[g];
        if (next_load == load) {
          // A zero cost (or one too small to change this load): the group's first CTA stays the
          // least loaded, and every later cost is no larger.
          give_all(runs.subspan(r), runs[r].items - left, pool_[s], cta_of, count);
          return;
        }
        const int t = static_cast<int>(std::min<int64_t>(m, left));
        for (int k = 0; k < t; ++k) {
          const int cta = pool_[s + k];
          ++count[cta];
          *cta_of++ = cta;
        }
        left -= t;
        const uint64_t next_bits = std::bit_cast<uint64_t>(next_load);
        if (t == m) {  // the whole group moves to next_load
          index_.erase(bits);
          const int other = index_.find_or_insert(next_bits, g);
          if (other < 0) {
            set_leaf(g, next_bits);
          } else {  // it joins the group there, and frees its slot
            merge_into(other, s, m);
            free_.push_back(g);
            set_leaf(g, kNone);
          }
        } else {  // its first t CTAs move to next_load; the rest keep the slot, leaf and load
          start_[g] = s + t;
          size_[g] = m - t;
          const int slot = free_.empty() ? slots_ : free_.back();
          const int other = index_.find_or_insert(next_bits, slot);
          if (other >= 0) {
            merge_into(other, s, t);
            continue;
          }
          if (!free_.empty()) {
            free_.pop_back();
          } else {
            if (static_cast<size_t>(slots_) == leaves_) grow_tree(2 * leaves_);
            ++slots_;
          }
          start_[slot] = s;
          size_[slot] = t;
          set_leaf(slot, next_bits);
        }
      }
    }
  }

  // Group loads (as bits) -> slots: open addressing, linear probing, backward-shift deletion.
  class LoadIndex {
   public:
    void reset(size_t max_groups) {
      const size_t n = std::bit_ceil(std::max<size_t>(2 * max_groups, 16));
      keys_.assign(n, kEmpty);
      slots_.resize(n);
      mask_ = n - 1;
      shift_ = 64 - std::countr_zero(n);
    }
    // The slot at `load`; if none, enters `slot` there and returns -1.
    int find_or_insert(uint64_t load, int slot) {
      for (size_t i = home(load);; i = (i + 1) & mask_) {
        if (keys_[i] == load) return slots_[i];
        if (keys_[i] == kEmpty) {
          keys_[i] = load;
          slots_[i] = slot;
          return -1;
        }
      }
    }
    void insert(uint64_t load, int slot) { find_or_insert(load, slot); }
    void erase(uint64_t load) {  // load present
      size_t hole = home(load);
      while (keys_[hole] != load) hole = (hole + 1) & mask_;
      for (size_t j = (hole + 1) & mask_; keys_[j] != kEmpty; j = (j + 1) & mask_) {
        // Entry j may move back into the hole unless its home lies in (hole, j] (cyclically).
        if (((j - home(keys_[j])) & mask_) >= ((j - hole) & mask_)) {
          keys_[hole] = keys_[j];
          slots_[hole] = slots_[j];
          hole = j;
        }
      }
      keys_[hole] = kEmpty;
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};  // a NaN's bits: never a load
    size_t home(uint64_t load) const { return (load * 0x9E3779B97F4A7C15u) >> shift_; }
    std::vector<uint64_t> keys_;
    std::vector<int> slots_;
    size_t mask_ = 0;
    int shift_ = 0;
  };

  // Merges the CTAs pool_[s, s + n) into group g: the two sorted slices become a new one.
  void merge_into(int g, int s, int n) {
    const size_t begin = pool_.size();
    pool_.resize(begin + static_cast<size_t>(n + size_[g]));
    std::merge(pool_.begin() + s, pool_.begin() + s + n, pool_.begin() + start_[g],
               pool_.begin() + start_[g] + size_[g],
               pool_.begin() + static_cast<std::ptrdiff_t>(begin));
    start_[g] = static_cast<int>(begin);
    size_[g] += n;
  }

  // Gives every chunk of `runs`, but the first `skip`, to `cta` (whose load they do not change).
  static void give_all(std::span<const CostRun> runs, int64_t skip, int cta, int* cta_of,
                       int* count) {
    for (const CostRun& run : runs) {
      const int64_t n = run.items - skip;
      skip = 0;
      std::fill_n(cta_of, n, cta);
      cta_of += n;
      count[cta] += static_cast<int>(n);
    }
  }

  // Node n takes the smaller load of its children, and its slot. (The walks select with
  // conditional moves: which child wins is data, and a mispredicted branch per level would cost
  // more than the whole level.)
  void pull_up(size_t n) {
    const uint64_t left = tree_[2 * n], right = tree_[2 * n + 1];
    const int left_win = winner_[2 * n], right_win = winner_[2 * n + 1];
    const bool take_right = right < left;
    tree_[n] = take_right ? right : left;
    winner_[n] = take_right ? right_win : left_win;
  }

  // Makes the tree `leaves` leaves wide (a power of two >= slots_), keeping the slots' loads.
  void grow_tree(size_t leaves) {
    std::vector<uint64_t>& keys = spare_;
    keys.assign(leaves, kNone);
    for (int g = 0; g < slots_; ++g) {  // (the first time, from the groups of the filling)
      keys[g] = leaves_ > 0 ? tree_[leaves_ + g] : std::bit_cast<uint64_t>(load_[start_[g]]);
    }
    leaves_ = leaves;
    tree_.assign(2 * leaves_, kNone);
    winner_.resize(2 * leaves_);
    std::copy(keys.begin(), keys.end(), tree_.begin() + static_cast<std::ptrdiff_t>(leaves_));
    for (size_t g = 0; g < leaves_; ++g) winner_[leaves_ + g] = static_cast<int>(g);
    for (size_t n = leaves_ - 1; n >= 1; --n) pull_up(n);
  }

  // Sets slot g's leaf to `key` and updates the path above it.
  void set_leaf(int g, uint64_t key) {
    size_t node = leaves_ + static_cast<size_t>(g);
    tree_[node] = key;
    int win = g;
    for (; node > 1; node >>= 1) {
      const uint64_t other = tree_[node ^ 1];
      const int other_win = winner_[node ^ 1];
      const bool take = other < key;  // (equal keys are both +inf: either will do)
      key = take ? other : key;
      win = take ? other_win : win;
      tree_[node >> 1] = key;
      winner_[node >> 1] = win;
    }
  }

  std::vector<double> load_;       // [num_ctas]
  std::vector<int> pool_;          // the groups' CTAs: a group is a slice, sorted by index
  std::vector<int> start_, size_;  // [num_ctas] each slot's group: its slice of pool_
  int slots_ = 0;                  // slots [0, slots_) have been used
  std::vector<int> free_;          // free slots below slots_
  LoadIndex index_;                // load -> slot of the group at that load
  size_t leaves_ = 0;              // a power of two >= slots_
  std::vector<uint64_t> tree_;     // [2 * leaves_] loads' bits: root at 1, slot g at leaves_ + g
  std::vector<uint64_t> spare_;    // scratch of grow_tree
  std::vector<int> winner_;        // [2 * leaves_] the slot each node's load came from
};

// A request chunk assigned to a block of CTAs: its head-0 work item; head h's has slot
// + h * slot_stride and merge + h when split (slot_stride > 0), else the same slot and merge (-1).
struct BlockChunk {
  DecodeWorkItem item;
  int slot_stride;
};

// Everything plan_decode needs besides its result. One per thread, kept: a plan at every decode
// step then allocates nothing. The buffers grow to the largest plan made on the thread, up to
// kKeptScratchItems work items' worth (a larger one is released after its plan).
struct PlanScratch {
  std::vector<ChunkRun> runs;
  std::vector<uint64_t> order, sort_tmp;
  std::vector<CostRun> costs;
  std::vector<int> cta_of, cursor, unit_count;
  std::vector<BlockChunk> block_chunks;
  GreedyLpt lpt;
  // balanced_chunk_bound's probes.
  std::vector<std::pair<int64_t, int64_t>> probe_lens;
  std::vector<CostRun> probe_costs;
  std::vector<int> probe_cta_of, probe_count;
  GreedyLpt probe_lpt;
};
constexpr int64_t kKeptScratchItems = int64_t{1} << 20;

void validate_options(const DecodeScheduleOptions& o) { validate_split_options("plan_decode", o); }

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

// Greedy (LPT) makespan of dynamic splitting with chunk bound `bound`, from the chunk costs
// alone (no work items are built; chunk lengths follow cut_request): the greedy itself
// (GreedyLpt) run on the runs of equal cost. (A closed form for at most 2 C chunks is tempting
// but wrong: the greedy can put three chunks on one CTA, e.g. costs 3, 1, 1, 1 on two CTAs.)
double greedy_makespan(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& o,
                       int64_t bound, PlanScratch& scratch) {
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
    costs.back().items += count * o.num_kv_heads;
    items += count * o.num_kv_heads;
  }
  scratch.probe_cta_of.resize(static_cast<size_t>(items));
  scratch.probe_count.assign(static_cast<size_t>(o.num_ctas), 0);
  scratch.probe_lpt.assign(o.num_ctas, costs, scratch.probe_cta_of.data(),
                           scratch.probe_count.data());
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
                             int64_t bound, PlanScratch& scratch) {
  int64_t longest = 0, chunks = 0;
  for (const int64_t l : kv_lens) {
    longest = std::max(longest, l);
    chunks += l <= bound ? 1 : (l + bound - 1) / bound;
  }
  chunks *= o.num_kv_heads;
  if (longest <= bound || chunks <= o.num_ctas || chunks > 2 * int64_t{o.num_ctas}) return bound;
  const int64_t n0 = (longest + bound - 1) / bound;  // pieces of the longest tile at `bound`
  int64_t best = bound;
  double best_makespan = greedy_makespan(kv_lens, o, bound, scratch);
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
                                : greedy_makespan(kv_lens, o, candidate, scratch);
    if (makespan <= best_makespan) {
      best = candidate;
      best_makespan = makespan;
    }
  }
  return best;
}

// Cuts request `r` of length `l` into runs (appended to `runs`) and returns its chunks per tile.
// Runs go to *out, which moves past them (the caller sized the buffer: at most two per request;
// a plain store, as a push_back per request was a tenth of plan time at batch 256).
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
// (longest - len) << 32 | index, ascending. A stable LSD radix sort on the bytes in which the
// lengths differ (lengths < 2^31: at most 4 passes; a batch's usually span a few thousand: two).
void sort_runs(const std::vector<ChunkRun>& runs, std::vector<uint64_t>& order,
               std::vector<uint64_t>& tmp) {
  const size_t n = runs.size();
  int longest = 0, shortest = INT_MAX;
  for (const ChunkRun& r : runs) {
    longest = std::max(longest, r.len);
    shortest = std::min(shortest, r.len);
  }
  order.resize(n);
  for (size_t i = 0; i < n; ++i) {
    order[i] = static_cast<uint64_t>(longest - runs[i].len) << 32 | i;
  }
  if (n <= 64) {
    std::sort(order.begin(), order.end());
    return;
  }
  tmp.resize(n);
  const int passes = (std::bit_width(static_cast<uint32_t>(longest - shortest)) + 7) / 8;
  uint32_t count[4][256] = {};  // every pass's histogram, from one read of the keys
  for (uint64_t k : order) {
    for (int p = 0; p < passes; ++p) ++count[p][(k >> (32 + 8 * p)) & 0xff];
  }
  for (int p = 0; p < passes; ++p) {
    uint32_t sum = 0;
    for (uint32_t& c : count[p]) sum += std::exchange(c, sum);
    const int shift = 32 + 8 * p;
    for (uint64_t k : order) tmp[count[p][(k >> shift) & 0xff]++] = k;
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
  int64_t bound = chunk_bound(kv_lens, opts);
  if (opts.fixed_split_size == 0 && !opts.disable_split_kv && opts.balance_chunk_bound) {
    bound = balanced_chunk_bound(kv_lens, opts, bound, scratch);
  }

  // Cut every request; count work items and slots before building anything, so an impossible
  // plan fails fast and never allocates for its (possibly enormous) size.
  std::vector<ChunkRun>& runs = scratch.runs;
  runs.resize(2 * static_cast<size_t>(batch));
  ChunkRun* runs_end = runs.data();
  int64_t num_items = 0;
  int64_t num_slots = 0;
  int64_t num_merges = 0;
  for (int r = 0; r < batch; ++r) {
    ChunkRun* const first_run = runs_end;
    const int64_t n = cut_request(r, kv_lens[r], bound, opts, runs_end);
    num_items = saturating_add(num_items, n * heads);
    if (n > 1) {
      // Slots of tile (r, h) are slot_base + h * n + [0, n): consecutive, in KV order, and
      // ordered across tiles like the merge items (merge_base + h).
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
  sort_runs(runs, scratch.order, scratch.sort_tmp);
  // Assignment per request chunk: when num_kv_heads divides num_ctas and no chunk is free, the
  // greedy over CTAs hands the heads of a request chunk, which are adjacent in the order and of
  // equal cost, to one aligned block of num_kv_heads CTAs (every group of equally loaded CTAs
  // stays a union of such blocks: filling takes whole blocks, and a run's chunk count is a
  // multiple of num_kv_heads). So the greedy runs over num_ctas / num_kv_heads blocks and
  // num_kv_heads times fewer chunks, with the same result (plan time: batch 256 x 8 heads).
  // A zero cost (alpha 0, an empty request) would pile chunks on one CTA, not one block, so it
  // takes the CTA path. (So would a positive cost below a load's rounding step, ~1e-16 of it:
  // then the blocks' schedule differs from the CTAs' but is as valid.)
  const bool by_block = ctas % heads == 0 && opts.cost.cost(1, 0) > 0;
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
  s.num_slots = static_cast<int>(num_slots);
  s.chunk_bound = bound;
  s.cta_work_indptr.assign(static_cast<size_t>(ctas) + 1, 0);
  std::vector<int>& cta_of = scratch.cta_of;  // unit of each greedy chunk, in cost order
  cta_of.resize(static_cast<size_t>(num_items / heads * per_chunk));
  std::vector<int>& unit_count = scratch.unit_count;
  unit_count.assign(static_cast<size_t>(units), 0);
  scratch.lpt.assign(units, costs, cta_of.data(), unit_count.data());
  const std::vector<double>& loads = scratch.lpt.loads();
  s.cta_cost.resize(static_cast<size_t>(ctas));
  for (int c = 0; c < ctas; ++c) {
    const int u = by_block ? c / heads : c;
    s.cta_cost[c] = loads[u];
    s.cta_work_indptr[c + 1] = s.cta_work_indptr[c] + unit_count[u];
  }

  // Work item h of chunk k of a run. Every field is written, so a reused schedule keeps nothing
  // stale.
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
    item.slot = split ? run.slot_base + h * run.tile_chunks + run.first_chunk + k : -1;
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
  if (by_block) {
    // Each block's request chunks in assignment order, as head-0 items (a counting sort), then
    // every CTA's items written in CTA order, head h derived from head 0: sequential stores and
    // little work per item. (Scattering the items into their CTAs' lists, and building each one
    // from its run, took half of plan time at batch 256.)
    std::vector<int>& end = scratch.cursor;  // [units]: where each block's next chunk goes
    end.resize(static_cast<size_t>(units));
    int sum = 0;
    for (int u = 0; u < units; ++u) {
      end[u] = sum;
      sum += unit_count[u];
    }
    std::vector<BlockChunk>& chunks = scratch.block_chunks;
    chunks.resize(cta_of.size());
    const int* unit = cta_of.data();
    for (uint64_t key : scratch.order) {
      const ChunkRun& run = runs[key & 0xffffffffu];
      for (int k = 0; k < run.count; ++k) {
        chunks[end[*unit++]++] = {make_item(run, k, 0), run.slot_base >= 0 ? run.tile_chunks : 0};
      }
    }
    DecodeWorkItem* out = work;
    for (int u = 0; u < units; ++u) {
      const BlockChunk* first = chunks.data() + (end[u] - unit_count[u]);
      const BlockChunk* last = chunks.data() + end[u];
      for (int h = 0; h < heads; ++h) {
        for (const BlockChunk* c = first; c < last; ++c, ++out) {
          *out = c->item;
          out->kv_head = h;
          if (c->slot_stride > 0) {
            out->slot += h * c->slot_stride;
            out->merge += h;
          }
        }
      }
    }
  } else {
    // Group by CTA (a counting sort keeps each CTA's items in assignment order), regenerating
    // each item in the same traversal order rather than storing it twice.
    scratch.cursor.assign(s.cta_work_indptr.begin(), s.cta_work_indptr.end() - 1);
    int* const next = scratch.cursor.data();
    const int* cta = cta_of.data();
    for (uint64_t key : scratch.order) {
      const ChunkRun& run = runs[key & 0xffffffffu];
      // Chunks in (kv_start, kv_head) order: the heads of a request chunk are adjacent.
      for (int k = 0; k < run.count; ++k, cta += heads) {
        for (int h = 0; h < heads; ++h) work[next[cta[h]]++] = make_item(run, k, h);
      }
    }
  }

  // One merge item per split tile, in (request, kv_head) order: runs are still in request order
  // and a request's first run starts at chunk 0.
  s.merge.clear();
  s.merge.reserve(static_cast<size_t>(num_slots / 2));
  for (const ChunkRun& run : runs) {
    if (run.slot_base < 0 || run.first_chunk != 0) continue;
    const int kv_len = static_cast<int>(fill_lens ? opts.full_kv_lens[run.request]
                                                  : kv_lens[run.request]);
    for (int h = 0; h < heads; ++h) {
      const int begin = run.slot_base + h * run.tile_chunks;
      s.merge.push_back({run.request, h, begin, begin + run.tile_chunks, kv_len});
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

}  // namespace flashkv::scheduler
