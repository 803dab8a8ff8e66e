// The load-balanced decode schedule (FlashInfer paper; docs/design.md "Layers",
// "Workspace").
// Pure C++: no CUDA. Unit-tested on the CPU.
//
// Tiles are (request, kv_head) pairs: with GQA head-group fusion one CTA serves every query head
// of a KV head, so a tile is one query row-block of `group` rows over the request's whole KV.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "attention/decode/decode_plan.cuh"
#include "scheduler/plan_image.h"
#include "scheduler/split_bounds.h"
#include "tuning/policy.cuh"

namespace flashkv::scheduler {

// cost(l_q, l_kv) = alpha * l_q + beta * l_kv, in arbitrary units (only ratios matter): beta is
// the unit (one KV token streamed), alpha a work item's fixed cost in tokens. alpha matters
// little: with the balanced chunk bound the chunking sets the makespan and alpha only breaks
// near-ties. (The defaults are the policy's, tuning/policy.cuh; the sweep behind them is in
// tuning/sm90.cuh and NOTES "Scheduler", α calibration.)
struct CostModel {
  // Fixed cost of a work item (launch of the tile, q load, epilogue), in KV-token units.
  double alpha = tuning::Policy::kDecodeWorkItemCostTokens;
  double beta = tuning::Policy::kDecodeTokenCost;  // per KV token; must be > 0
  double cost(int64_t l_q, int64_t l_kv) const { return alpha * l_q + beta * l_kv; }
};

// Chunking: dynamic (the default) cuts a tile of l tokens into n = ceil(l / L_kv) chunks whose
// sizes differ by at most one token, L_kv = max(min_chunk_tokens, ceil(sum of tile lengths /
// num_ctas)) or, with balance_chunk_bound, a larger bound whose greedy makespan is smaller;
// fixed_split_size cuts it into [0, fs), [fs, 2 fs), ...; disable_split_kv keeps it
// whole. An empty tile gets one empty work item. Chunks are assigned, longest (= costliest, as
// cost.beta > 0) first, ties by (request, kv_start, kv_head), to the least-loaded CTA (ties to the
// lower CTA index); so no CTA's cost exceeds the mean CTA cost plus the largest chunk cost.
//
// Block mode (block_units, and num_kv_heads > 1 divides num_ctas): the greedy runs over blocks of
// num_kv_heads CTAs, each request chunk (its num_kv_heads tiles' chunks) to one block, head h on
// the block's CTA h; each block's items are stored once, as head-0 templates (decode_plan.cuh,
// "Units"). For positive costs this is exactly the CTA greedy above (decode_scheduler.cpp); a
// zero-cost chunk (alpha 0 and an empty request) goes to the least-loaded block where the CTA
// greedy would put it on the least-loaded CTA alone.
struct DecodeScheduleOptions {
  int num_ctas = 0;  // fixed grid size (k x #SM); > 0 required
  int num_kv_heads = 1;
  int fixed_split_size = 0;       // > 0: split every tile into chunks of exactly this many tokens
                                  // (last one shorter), independent of the rest of the batch
  bool disable_split_kv = false;  // never split: one work item per tile; not with fixed_split_size
  // Dynamic splitting never makes chunks shorter than this.
  int min_chunk_tokens = tuning::Policy::kDecodeMinChunkTokens;
  // Dynamic splitting: when a few chunks per CTA are at stake, also try the bounds > L_kv that
  // cut the longest tile into fewer pieces and keep the one with the smallest greedy makespan
  // (decode_scheduler.cpp, balanced_chunk_bound). false: always L_kv.
  bool balance_chunk_bound = tuning::Policy::kDecodeBalanceChunkBound;
  // Dynamic splitting, units of one greedy chunk per request chunk (block mode, or one KV head):
  // the chunks that would overflow the average load (the last, partial round of the greedy) are
  // cut to fill the least-loaded units up to a common level instead of landing whole on some of
  // them (decode_scheduler.cpp, "Tail balancing"); kept only when its makespan is smaller. A
  // tile's chunks may then differ in length (each still <= chunk_bound; cut pieces have >=
  // min_chunk_tokens). false: the plain greedy's schedule, exactly. (BatchDecode leaves it off
  // unless DecodePlanOptions::balance_tail asks: measured slower on the H200, NOTES.md.)
  bool balance_tail = true;
  // Block mode where num_kv_heads divides num_ctas (above). false: one unit per CTA, final items
  // (for tests and A/B runs; plan() always uses blocks where it can).
  bool block_units = true;
  // Capacity of the partial-state buffer (>= 0). Dynamic splitting fits it: where the chunk bound
  // above would need more slots, the bound grows until the chunks fit (fit_chunk_bound_to_slots,
  // split_options.h; DecodeSchedule::slot_limited says so), down to no splitting at 0 slots.
  // fixed_split_size cannot give way (its chunks are the contract): it throws instead.
  int max_slots = 0;
  int max_work_items = 0;  // capacity of the work-item array (items stored); > 0 required
  CostModel cost{};
  // The op's fields of each work item, filled in the same pass that writes the items (a second
  // pass over thousands of items is a good part of plan()'s time). Empty spans: page_base 0,
  // kv_len the scheduled length. Otherwise [batch] each: page_base[r] (kv_indptr[r]) and
  // full_kv_lens[r] >= kv_lens[r], the request's length when only its last kv_lens[r] keys are
  // scheduled (a sliding window): items then cover [full - scheduled, full) in request positions.
  std::span<const int32_t> page_base;
  std::span<const int64_t> full_kv_lens;
  // Where the work items go: null, DecodeSchedule::work; else work_out[0, num_work_items)
  // (max_work_items capacity), and DecodeSchedule::work stays empty. plan() points it into the
  // pinned plan image, so the items are written once, where the copy to the device reads them.
  DecodeWorkItem* work_out = nullptr;
};

// CTA c belongs to unit c / ctas_per_unit and runs that unit's stored items, expanded for its
// head (decode_plan.cuh "Units"; expand_work_item below gives them on the host).
struct DecodeSchedule {
  int num_ctas = 0;
  int ctas_per_unit = 1;                     // num_kv_heads in block mode, else 1
  int num_units = 0;                         // num_ctas / ctas_per_unit
  std::vector<int> unit_work_indptr;         // [num_units + 1] into the stored items
  std::vector<DecodeWorkItem> work;          // stored items, grouped by unit (empty with work_out)
  int num_work_items = 0;                    // items stored in work or work_out
  const DecodeWorkItem* work_out = nullptr;  // where the items are when `work` is empty
  std::vector<DecodeMergeItem> merge;        // one per split tile, in (request, kv_head) order
  int num_slots = 0;                         // partial slots used
  int64_t chunk_bound = 0;                   // L_kv: no chunk is longer (tokens); with
                                             // disable_split_kv, the longest request
  bool slot_limited = false;                 // dynamic splitting took a longer chunk bound
                                             // than the balance wanted: max_slots was short
  std::vector<double> cta_cost;              // [num_ctas] total cost assigned to each CTA

  // The stored items (work, or work_out's first num_work_items).
  std::span<const DecodeWorkItem> stored_work() const {
    return work_out != nullptr
               ? std::span<const DecodeWorkItem>(work_out, static_cast<size_t>(num_work_items))
               : std::span<const DecodeWorkItem>(work);
  }
  // The items the CTAs run, all together (PlanInfo::num_work_items).
  int64_t num_cta_work_items() const { return int64_t{num_work_items} * ctas_per_unit; }
};

// The items CTA `cta` runs: cta_work_count of them; the i-th is expand_work_item(s, cta, i), with
// its final kv_head, slot and merge (what the kernel derives from the unit's template).
int cta_work_count(const DecodeSchedule& s, int cta);
DecodeWorkItem expand_work_item(const DecodeSchedule& s, int cta, int i);
// The same schedule with one unit per CTA (ctas_per_unit 1): every CTA's items written out, in
// work (work_out null), all else as in `s`.
DecodeSchedule expand_to_ctas(const DecodeSchedule& s);

// kv_lens[i] is the KV length of request i (0 allowed). Throws flashkv::Error if the schedule
// would need more work items than max_work_items, or (fixed_split_size only: dynamic splitting
// fits max_slots) more slots than max_slots (naming which, and how many).
// Deterministic: the same inputs always give the same schedule.
DecodeSchedule plan_decode(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& opts);
// The same, refilling `out` and reusing its vectors' capacity (plan() calls this every step).
// On an error `out` is left unchanged.
void plan_decode(std::span<const int64_t> kv_lens, const DecodeScheduleOptions& opts,
                 DecodeSchedule* out);

// Upper bounds used to size the workspace (docs/design.md "Workspace"): with dynamic splitting the
// number of partial slots never exceeds 2 * num_ctas and the number of work items never exceeds
// max_batch * num_kv_heads + num_ctas (proof in decode_scheduler.cpp; block mode stores
// num_kv_heads times fewer). fixed_split_size has no such bound (its chunk count follows the KV
// lengths, not num_ctas): size for the longest batch, or let plan_decode throw. Both throw
// flashkv::Error on non-positive arguments or int overflow.
// Slots and merge items: max_split_slots / max_split_merge_items (split_bounds.h).
int max_decode_work_items(int max_batch, int num_kv_heads, int num_ctas);

// Serialized plan: the byte image copied to the device workspace, with the offsets of each array.
// The arrays lie one after another in this order, each starting at a 16-byte aligned offset:
//   DecodePlanHeader; int unit_work_indptr[num_ctas + 1] (num_units + 1 used);
//   DecodeWorkItem work[max_work_items]; DecodeMergeItem merge[max_merge_items].
using DecodePlanLayout = PlanLayout;  // plan_image.h
DecodePlanLayout decode_plan_layout(int num_ctas, int max_work_items, int max_merge_items);
// Writes `s` into `dst` (layout.bytes long) compactly: header, unit indptr, the stored work
// items, then the used merge items at header.merge_offset. A schedule planned with work_out =
// the image's work array (dst + layout.work) has its items in place already. Returns the number
// of bytes written, so plan() copies only those. Throws flashkv::Error if `s` does not fit the
// layout.
size_t serialize_decode_schedule(const DecodeSchedule& s, const DecodePlanLayout& layout,
                                 std::byte* dst);

}  // namespace flashkv::scheduler
