// The load-balanced prefill/append schedule (FlashInfer paper; docs/design.md "Layers"
// and "Workspace"). Pure C++: no CUDA. Unit-tested on the CPU.
//
// Queries are ragged: request i has qo_lens[i] >= 0 query tokens and kv_lens[i] >= 0 KV tokens.
// With GQA head-group fusion the `group` = num_qo_heads / num_kv_heads query heads of one KV head
// share a CTA, so a query tile's tile_rows rows are (query token, head-in-group) pairs: a tile
// holds tile_tokens = tile_rows / group whole query tokens. Tiles are (request, kv_head, query
// tile); the tiles of a request cut its queries into [0, t), [t, 2 t), ... (t = tile_tokens).
//
// Visible KV. Non-causal: every row sees [0, kv_len). Causal, with the queries aligned to the
// END of the KV: query token i sees KV positions <= kv_len - qo_len + i. A tile sees the union of
// its rows' ranges, [0, kv_len - qo_len + q_end) clipped to [0, kv_len]; each row's own range is
// a prefix of it (the kernel masks the rest), so KV that no row of a tile sees is never assigned.
// With a sliding window (window_left) the range starts at the first row's window instead of 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "attention/prefill/prefill_plan.cuh"
#include "scheduler/plan_image.h"
#include "scheduler/split_bounds.h"
#include "tuning/policy.cuh"

namespace flashkv::scheduler {

// The query tile sizes the prefill kernels are built for (rows = query tokens x group).
inline constexpr int kPrefillTileRows[] = {16, 32, 64, 128};
inline constexpr int kMaxPrefillTileRows = 128;  // so group <= 128

// The paper's heuristic: the smallest tile of kPrefillTileRows that holds the average request,
// i.e. >= average(qo_len) * group over the non-empty requests (128 when none does), and at least
// the smallest tile that holds one whole token (>= group). All requests empty: that smallest
// tile. Throws flashkv::Error if group is not in [1, 128] or a length is negative.
int choose_query_tile_rows(std::span<const int64_t> qo_lens, int group);

// cost(chunk) = alpha * rows + beta * kv_tokens, rows = query tokens of the tile x group. Units
// are arbitrary (only ratios matter); alpha (loading Q, writing O of a row) and beta (one KV
// token through a tile) are to be measured on the GPU, not guessed: these defaults (the sm_90
// policy's, tuning/sm90.cuh) only say that a row's fixed work is about one KV token's.
struct PrefillCostModel {
  double alpha = tuning::Policy::kPrefillRowCost;   // >= 0
  double beta = tuning::Policy::kPrefillTokenCost;  // > 0
  double cost(int64_t rows, int64_t kv_tokens) const { return alpha * rows + beta * kv_tokens; }
};

// Chunking: dynamic (the default) cuts a tile with v visible KV tokens into n = ceil(v / L_kv)
// chunks whose sizes differ by at most one token, L_kv = max(min_chunk_tokens, ceil(T / num_ctas))
// with T the visible KV summed over all tiles (KV heads included); with split_align a > 1, L_kv is
// rounded up to a multiple of a and chunks are cut at multiples of a (sizes differ by one unit,
// the last ending at v); fixed_split_size cuts it into
// [0, fs), [fs, 2 fs), ...; disable_split_kv keeps it whole. A tile that sees no KV gets one
// empty work item. Chunks are assigned, costliest first, ties by (request, q_start, kv_start,
// kv_head), to the least-loaded CTA (ties to the lower CTA index); so no CTA's cost exceeds the
// mean CTA cost plus the largest chunk cost.
struct PrefillScheduleOptions {
  int num_ctas = 0;  // fixed grid size (k x #SM); > 0 required
  int num_kv_heads = 1;
  int group = 1;      // num_qo_heads / num_kv_heads, in [1, 128]
  int tile_rows = 0;  // 0: choose_query_tile_rows; else one of kPrefillTileRows, >= group
  bool causal = false;
  int fixed_split_size = 0;       // > 0: chunks of exactly this many KV tokens (last one shorter),
                                  // independent of the rest of the batch if tile_rows is fixed
                                  // (the heuristic's choice depends on the batch)
  bool disable_split_kv = false;  // never split: one work item per tile; not with fixed_split_size
  // Dynamic splitting never makes chunks shorter than this.
  int min_chunk_tokens = tuning::Policy::kPrefillMinChunkTokens;
  int split_align = 1;  // dynamic splitting cuts KV at multiples of this (<= min_chunk_tokens):
                        // the kernel's KV tile, so every chunk starts on a tile (TMA loads)
  // A sliding window (>= 0; -1: none): a query at position q_pos = kv_len - qo_len + i sees no
  // key before q_pos - window_left. A tile's chunks then cover [its first row's window start,
  // rounded down to a multiple of split_align, its visible end), so a window costs the keys it
  // sees, not the prompt; the kernel masks the rest. Chunk edges stay functions of the tile alone.
  int window_left = -1;
  // The order of each CTA's items: false, (request, kv_head, q_start, kv_start); true, the order
  // they were assigned in, with chunks assigned by (kv_head, cost descending): the CTAs work
  // through the KV heads together (PrefillItemOrder::kHeadMajor). The loads obey the same bound.
  bool head_major = false;
  // Capacity of the partial-state buffer (>= 0), in slots of tile_rows rows. Dynamic splitting fits
  // it (a longer chunk bound where space is short; PrefillSchedule::slot_limited says so; 0: no
  // splitting); fixed_split_size throws instead.
  int max_slots = 0;
  int max_work_items = 0;  // capacity of the work-item array; > 0 required
  PrefillCostModel cost{};
};

struct PrefillSchedule {
  int num_ctas = 0;
  int tile_rows = 0;                    // rows of every query tile
  int tile_tokens = 0;                  // query tokens of a full tile: tile_rows / group
  std::vector<int> cta_work_indptr;     // [num_ctas + 1]
  std::vector<PrefillWorkItem> work;    // grouped by CTA, each CTA's in (request, kv_head,
                                        // q_start, kv_start) order (the CTAs sweep the KV together)
                                        // or, head_major, in the order they were assigned
  std::vector<PrefillMergeItem> merge;  // one per split tile, in (request, q_start, kv_head) order
  int num_slots = 0;                    // partial slots used
  int64_t chunk_bound = 0;              // L_kv: no chunk is longer (tokens); with
                                        // disable_split_kv, the longest visible KV of a tile
  bool slot_limited = false;            // dynamic splitting took a longer chunk bound than
                                        // the balance wanted: max_slots was short
  std::vector<double> cta_cost;         // [num_ctas] total cost assigned to each CTA
};

// qo_lens[i], kv_lens[i]: the query and KV lengths of request i (equal sizes; 0 allowed, and
// kv_len < qo_len too). Throws flashkv::Error on invalid input, or if the schedule would need
// more work items than max_work_items, or (fixed_split_size only: dynamic splitting fits
// max_slots) more slots than max_slots (naming which, and how many).
// Deterministic: the same inputs always give the same schedule.
PrefillSchedule plan_prefill(std::span<const int64_t> qo_lens, std::span<const int64_t> kv_lens,
                             const PrefillScheduleOptions& opts);
// The same, refilling `out` and reusing its vectors' capacity. On an error `out` is unchanged.
void plan_prefill(std::span<const int64_t> qo_lens, std::span<const int64_t> kv_lens,
                  const PrefillScheduleOptions& opts, PrefillSchedule* out);

// Workspace bounds (proofs in prefill_scheduler.cpp). With dynamic splitting, a schedule uses at
// most max_split_slots(num_ctas) = 2 * num_ctas slots, max_split_merge_items(slots) merge
// items and #tiles + num_ctas work items, where #tiles <= max_prefill_tiles(...) for every batch
// of at most max_batch requests and max_qo_tokens query tokens in all. tile_rows = 0 bounds the
// tiles for whatever choose_query_tile_rows picks. disable_split_kv: #tiles items, no slots.
// fixed_split_size has no bound in terms of num_ctas (its chunks follow the KV lengths): size for
// the longest batch, or let plan_prefill throw. All throw flashkv::Error on invalid arguments or
// int overflow.
int max_prefill_tiles(int max_batch, int64_t max_qo_tokens, int num_kv_heads, int group,
                      int tile_rows);
int max_prefill_work_items(int max_tiles, int num_ctas);
// Slots and merge items: max_split_slots / max_split_merge_items (split_bounds.h).

// Serialized plan: the byte image copied to the device workspace. The arrays lie one after another
// in this order, each starting at a 16-byte aligned offset:
//   PrefillPlanHeader; int cta_work_indptr[num_ctas + 1]; PrefillWorkItem work[used];
//   PrefillMergeItem merge[used] (at header.merge_offset).
using PrefillPlanLayout = PlanLayout;  // plan_image.h
PrefillPlanLayout prefill_plan_layout(int num_ctas, int max_work_items, int max_merge_items);
// Writes `s` into `dst` (layout.bytes long) compactly and returns the number of bytes written, so
// plan() copies only those. Throws flashkv::Error if `s` does not fit the layout.
size_t serialize_prefill_schedule(const PrefillSchedule& s, const PrefillPlanLayout& layout,
                                  std::byte* dst);

}  // namespace flashkv::scheduler
