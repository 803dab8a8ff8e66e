// The decode plan's plain-struct layout: written by the CPU scheduler (src/scheduler), read by the
// decode and merge kernels. This is the only type the kernels share with the host; it includes
// nothing, so NVRTC and the host compiler both read it as it is.
#pragma once

namespace flashkv {

// One unit of decode work: the query heads of one KV head of one request, over the KV tokens
// [kv_start, kv_end) of that request. kv_start == kv_end marks an empty request, whose output
// row is written as zeros with lse = -inf.
struct DecodeWorkItem {
  int request;   // index into the batch
  int kv_head;   // KV head; the query heads served are kv_head * group .. + group - 1
  int kv_start;  // first KV token (position within the request)
  int kv_end;    // one past the last KV token
  int slot;      // -1: write the final output directly; else the partial-state slot to write
  int page_base; // kv_indptr[request]: the request's first entry in kv_indices (filled by the op)
  int merge;     // slot >= 0: index of the tile's DecodeMergeItem (filled by the op); else -1
  int kv_len;    // the request's KV length (filled by the op): the fused step appends at kv_len - 1
};

// One split (request, kv_head) tile: its partial states live in slots [slot_begin, slot_end),
// in KV order; the merge stage contracts them with ⊕ into the output.
struct DecodeMergeItem {
  int request;
  int kv_head;
  int slot_begin;
  int slot_end;
  int kv_len;  // the request's KV length (filled by the op; the variant's output_transform sees it)
};

// The plan region starts with this header. Only the used bytes of the region are copied to the
// device at each plan() (one copy): the merge items follow the used work items, at merge_offset.
struct DecodePlanHeader {
  int num_merge_items;
  int merge_offset;  // bytes from the start of the plan region to the first DecodeMergeItem
  int num_work_items;
  int reserved;
};

// Device pointers into the workspace, fixed for the life of a BatchDecode object (so a captured
// CUDA graph stays valid after a later plan()). Counts are read from device memory for the same
// reason: the grids never change.
struct DecodePlanPtrs {
  const DecodePlanHeader* header;      // at the start of the plan region
  const int* cta_work_indptr;          // [num_ctas + 1]: work of CTA c is [indptr[c], indptr[c+1])
  const DecodeWorkItem* work;          // [num_work_items]
  float* partial_o;                    // [max_slots, group, head_dim], normalized outputs
  float* partial_lse;                  // [max_slots, group], base-2 LSE
  int* merge_arrivals;                 // [max_merge_items] zero between runs: partial states of
                                       // each split tile written so far (the last one merges)
};

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)  // device code only; the host writes the bytes
__device__ __forceinline__ const DecodeMergeItem* decode_merge_items(const DecodePlanPtrs& p) {
  return reinterpret_cast<const DecodeMergeItem*>(reinterpret_cast<const char*>(p.header) +
                                                 p.header->merge_offset);
}
#endif

}  // namespace flashkv
