// Greedy (LPT) assignment of chunks, in order of non-increasing cost, to the least-loaded CTA
// (or block of CTAs): the decode scheduler's assignment step (decode_scheduler.cpp), exact and
// cheap enough to run at every decode step. Pure C++, internal to the scheduler.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace flashkv::scheduler {

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
// Chunk by chunk (pop_each): where most costs are distinct (block mode over distinct request
// lengths: one greedy chunk per cost), groups are single CTAs and each costs the index's erase and
// insert besides the tree walk; a loser tree over the CTAs themselves, ties broken by index, is
// then cheaper. ("CTA" here is whatever the greedy assigns to: a block of CTAs in block mode.)
//
// Measured (264 CTAs, 8 KV heads, batch 256 = 2048 chunks): ~2.5 ns per chunk, against ~18 ns
// for a walk of a tournament tree over the CTAs per chunk (55 ns for a binary heap of
// (double, int) pairs). Over 33 blocks, 256 chunks of distinct costs: ~8 ns per chunk chunk by
// chunk (loser tree), ~13 ns by groups.
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
    if (prefer_each(runs.subspan(r))) {
      pop_each(runs.subspan(r), done, cta_of + i, count);
      return;
    }

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

  // The same greedy for costs in any order (they may rise again: the prefill scheduler's
  // head-major order, cost-descending within each KV head): chunk by chunk over the loser tree,
  // from all-zero loads, so every chunk gets the CTA a min-heap of (load, cta) would give it. The
  // groups of assign() need non-increasing costs (a group that rises past another would never be
  // merged into it) and are not used.
  void assign_any_order(int num_ctas, std::span<const CostRun> runs, int* cta_of, int* count) {
    load_.assign(static_cast<size_t>(num_ctas), 0.0);
    pop_each(runs, 0, cta_of, count);
  }

  const std::vector<double>& loads() const { return load_; }

 private:
  static constexpr uint64_t kNone = ~uint64_t{0};  // a free slot's leaf: above every load

  // Whether chunk by chunk (pop_each) is the cheaper way to assign `runs`: when runs are mostly
  // single chunks (distinct lengths in block mode), groups are single CTAs and moving one costs
  // the load index's erase and insert on top of the same tree walk.
  static bool prefer_each(std::span<const CostRun> runs) {
    int64_t items = 0;
    for (const CostRun& run : runs) items += run.items;
    return items < 2 * static_cast<int64_t>(runs.size());
  }

  // The greedy after filling, one chunk at a time: a loser tree over the CTAs themselves (each
  // node holds the loser of its match, (load, CTA) pairs compare lexicographically, so ties go
  // to the lower CTA and need no groups). The chunk goes to the overall winner, whose load grows;
  // it then replays only its own path, against the losers stored there (one load per level, a
  // store only where it loses). Hands the chunks of `runs`, but the first `done`.
  void pop_each(std::span<const CostRun> runs, int64_t done, int* cta_of, int* count) {
    const size_t ctas = load_.size();
    const size_t leaves = std::bit_ceil(ctas);
    // Build: winners bottom-up in the leaves' slots of `up`, losers into losers_.
    std::vector<Entry>& up = up_;
    up.resize(2 * leaves);
    losers_.resize(leaves);
    for (size_t c = 0; c < leaves; ++c) {
      up[leaves + c] = {c < ctas ? std::bit_cast<uint64_t>(load_[c]) : kNone, static_cast<int>(c)};
    }
    for (size_t n = leaves - 1; n >= 1; --n) {
      const Entry& l = up[2 * n];
      const Entry& r = up[2 * n + 1];
      const bool right_wins = before(r, l);
      up[n] = right_wins ? r : l;
      losers_[n] = right_wins ? l : r;
    }
    Entry win = up[1];
    for (size_t r = 0; r < runs.size(); ++r, done = 0) {
      const double cost = runs[r].cost;
      for (int64_t k = done; k < runs[r].items; ++k) {
        const int cta = win.cta;
        const double load = std::bit_cast<double>(win.load) + cost;
        load_[cta] = load;
        ++count[cta];
        *cta_of++ = cta;
        win = {std::bit_cast<uint64_t>(load), cta};
        for (size_t n = (leaves + static_cast<size_t>(cta)) >> 1; n >= 1; n >>= 1) {
          if (before(losers_[n], win)) std::swap(losers_[n], win);
        }
      }
    }
  }

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
  // pop_each's loser tree.
  struct Entry {
    uint64_t load;  // bits of the CTA's load (kNone: a leaf past the last CTA)
    int cta;
  };
  static bool before(const Entry& a, const Entry& b) {
    return a.load < b.load || (a.load == b.load && a.cta < b.cta);
  }
  std::vector<Entry> losers_;  // [leaves] node n's loser; node 0 unused
  std::vector<Entry> up_;      // [2 * leaves] scratch of the build
};

}  // namespace flashkv::scheduler
