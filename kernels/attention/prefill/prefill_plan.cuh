// The prefill/append plan's plain-struct layout: written by the CPU scheduler (src/scheduler,
// prefill_scheduler.h), read by the prefill and merge kernels. It includes nothing, so NVRTC and
// the host compiler both read it as it is.
//
// A query tile is (request, kv_head, query tokens [q_start, q_end)): with GQA head-group fusion its
// rows are the (query token, head-in-group) pairs, (q_end - q_start) * group <= tile_rows of them.
#pragma once

namespace flashkv {

// One unit of prefill work: one query tile over the KV tokens [kv_start, kv_end) of its request.
// kv_start == kv_end marks a tile no row of which sees any KV (kv_len 0, or causal rows before
// the first visible position): its rows are written as zeros with lse = -inf.
struct PrefillWorkItem {
  int request;    // index into the batch
  int kv_head;    // KV head; the query heads served are kv_head * group .. + group - 1
  int q_start;    // first query token of the tile (position within the request's queries)
  int q_end;      // one past the last query token of the tile
  int kv_start;   // first KV token (position within the request's KV)
  int kv_end;     // one past the last KV token
  int slot;       // -1: write the final output directly; else the partial-state slot to write
  int merge;      // slot >= 0: index of the tile's PrefillMergeItem; else -1
  int page_base;  // kv_indptr[request] (filled by the op): the request's first entry in
                  // kv_indices (paged KV) or its first KV token (ragged KV)
  int q_base;     // qo_indptr[request] (filled by the op): the request's first query row
  int diag;       // kv_len - qo_len of the request (filled by the op): with a causal mask query
                  // token i sees KV positions <= diag + i
  int qo_len;     // the request's query and KV lengths (filled by the op): the positions the
  int kv_len;     // attention variant's hooks see (kernels/variants/variant.cuh)
};

// One split query tile: its partial states live in slots [slot_begin, slot_end), in KV order
// (a slot holds tile_rows rows); the merge stage contracts them with ⊕ into the output.
struct PrefillMergeItem {
  int request;
  int kv_head;
  int q_start;
  int q_end;
  int slot_begin;
  int slot_end;
  int q_base;  // qo_indptr[request] (filled by the op)
  int qo_len;  // the request's lengths (filled by the op; the variant's output_transform sees them)
  int kv_len;
};

// The plan region starts with this header. Only the used bytes of the region are copied to the
// device at each plan() (one copy): the merge items follow the used work items, at merge_offset.
struct PrefillPlanHeader {
  int num_merge_items;
  int merge_offset;  // bytes from the start of the plan region to the first PrefillMergeItem
  int num_work_items;
  int tile_rows;  // rows of a query tile; the kernel specialization must match
};

// Device pointers into the workspace, fixed for the life of a prefill object (so a captured CUDA
// graph stays valid after a later plan()). Counts are read from device memory for the same reason.
struct PrefillPlanPtrs {
  const PrefillPlanHeader* header;  // at the start of the plan region
  const int* cta_work_indptr;       // [num_ctas + 1]
  const PrefillWorkItem* work;      // [num_work_items]
  float* partial_o;                 // [max_slots, tile_rows, head_dim], normalized outputs
  float* partial_lse;               // [max_slots, tile_rows], base-2 LSE
  int* merge_arrivals;              // [max_merge_items], zero between runs
};

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)  // device code only; the host writes the bytes
__device__ __forceinline__ const PrefillMergeItem* prefill_merge_items(const PrefillPlanPtrs& p) {
  return reinterpret_cast<const PrefillMergeItem*>(reinterpret_cast<const char*>(p.header) +
                                                   p.header->merge_offset);
}
#endif

}  // namespace flashkv
