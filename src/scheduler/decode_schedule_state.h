// The decode scheduler's working state, shared by its two source files: decode_scheduler.cpp (the
// chunking, the greedy, the items) and decode_tail_balance.cpp (tail balancing). Internal to
// src/scheduler: nothing outside it includes this.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "scheduler/decode_scheduler.h"
#include "scheduler/greedy_lpt.h"

namespace flashkv::scheduler::detail {

// Counts saturate here instead of overflowing; a saturated count always fails a capacity check
// (capacities are ints) and the message still says "needs >= this many".
constexpr int64_t kCountSaturation = int64_t{1} << 62;

inline int64_t saturating_add(int64_t a, int64_t b) { return std::min(a + b, kCountSaturation); }

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

// Tail balancing (DecodeScheduleOptions::balance_tail; the algorithm, its makespan bound and the
// workspace-bound proof: decode_tail_balance.cpp). Returns the head length (greedy chunks, in
// greedy order, kept where the plain greedy put them), with sc.head_load / sc.head_count the units'
// head loads and item counts and sc.best_pieces the tail's pieces; or -1 where the plain schedule
// stays.
int64_t balance_tail(const DecodeScheduleOptions& o, const std::vector<ChunkRun>& runs,
                     const std::vector<uint64_t>& order, const int* unit_of,
                     const std::vector<double>& plain_loads, int units, int batch,
                     int64_t num_items, int64_t num_slots, PlanScratch& sc);

}  // namespace flashkv::scheduler::detail
