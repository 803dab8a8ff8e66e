// The decode plan's plain-struct layout: written by the CPU scheduler (src/scheduler), read by the
// decode and merge kernels. This is the only type the kernels share with the host; it includes
// nothing, so NVRTC and the host compiler both read it as it is.
//
// Units. The grid's CTAs are cut into units of ctas_per_unit consecutive CTAs (DecodePlanPtrs):
// CTA c belongs to unit u = c / ctas_per_unit and runs the work items
// [unit_work_indptr[u], unit_work_indptr[u + 1]). With ctas_per_unit == num_kv_heads > 1 (the
// scheduler's block mode, whenever num_kv_heads divides the CTA count) the items of a unit are
// head-0 templates, stored once for the whole unit: CTA c runs them for KV head h = c %
// ctas_per_unit, which adds h to kv_head (0 in a template), to slot (if >= 0) and to merge (if
// >= 0); see decode_cta_work_item. With ctas_per_unit == 1 every CTA is its own unit and its
// items are final. Block mode writes and copies num_kv_heads times fewer items per plan.
//
// Slots (the same in both modes). A split request r with n chunks per tile (= per KV head) and H
// KV heads owns the slots [slot_base_r, slot_base_r + n * H): chunk k (in KV order) of head h
// writes slot slot_base_r + k * H + h. So the H CTAs of a unit, running the same template for
// heads 0..H-1, write H adjacent slots, and tile (r, h)'s states lie at slot_base_r + h + j * H.
#pragma once

namespace flashkv {

// One unit of decode work: the query heads of one KV head of one request, over the KV tokens
// [kv_start, kv_end) of that request. kv_start == kv_end marks an empty request, whose output
// row is written as zeros with lse = -inf. In a unit of ctas_per_unit > 1 CTAs this is head 0's
// item (kv_head 0; slot and merge of head 0): see the file comment.
struct DecodeWorkItem {
  int request;    // index into the batch
  int kv_head;    // KV head; the query heads served are kv_head * group .. + group - 1
  int kv_start;   // first KV token (position within the request)
  int kv_end;     // one past the last KV token
  int slot;       // -1: write the final output directly; else the partial-state slot to write
  int page_base;  // kv_indptr[request]: the request's first entry in kv_indices
  int merge;      // slot >= 0: index of the tile's DecodeMergeItem; else -1
  int kv_len;     // the request's KV length: the fused step appends at kv_len - 1
};

// One split (request, kv_head) tile: its num_slots (>= 2) partial states lie in the slots
// slot_begin + j * slot_stride, j in [0, num_slots), in KV order (slot_stride = the number of KV
// heads: see the file comment); the merge stage contracts them with ⊕ into the output. Merge
// items are in (request, kv_head) order, so tile (r, h)'s index is tile (r, 0)'s + h.
struct DecodeMergeItem {
  int request;
  int kv_head;
  int slot_begin;   // slot of the tile's first chunk
  int num_slots;    // chunks of the tile; its last partial state to arrive merges them
  int slot_stride;  // between the slots of consecutive chunks
  int kv_len;       // the request's KV length (the variant's output_transform sees it)
};

// The plan region starts with this header. Only the used bytes of the region are copied to the
// device at each plan() (one copy): the merge items follow the used work items, at merge_offset.
struct DecodePlanHeader {
  int num_merge_items;
  int merge_offset;    // bytes from the start of the plan region to the first DecodeMergeItem
  int num_work_items;  // items stored (templates in block mode), not items run
  int ctas_per_unit;   // the plan's; the kernels use DecodePlanPtrs::ctas_per_unit (known before
                       // any load), this copy lets a check compare the two
};

// Device pointers into the workspace, fixed for the life of a BatchDecode object (so a captured
// CUDA graph stays valid after a later plan()). Counts are read from device memory for the same
// reason: the grids never change. ctas_per_unit is set by the host at each launch from the plan
// in force; a captured CUDA graph freezes it, so plan() refuses a plan with another value then.
struct DecodePlanPtrs {
  const DecodePlanHeader* header;  // at the start of the plan region
  const int* unit_work_indptr;     // [num_units + 1] used of [num_ctas + 1]: the work of
                                   // unit u is [indptr[u], indptr[u + 1]) (file comment)
  const DecodeWorkItem* work;      // [num_work_items]
  float* partial_o;                // [max_slots, group, head_dim], normalized outputs
  float* partial_lse;              // [max_slots, group], base-2 LSE
  int* merge_arrivals;             // [max_merge_items] zero between runs: partial states of
                                   // each split tile written so far (the last one merges)
  int ctas_per_unit;               // >= 1; num_units = num_ctas / ctas_per_unit
};

// The item CTA `cta` runs for the item `w` of its unit's list. A plain inline function: NVRTC
// compiles it as device code (-default-device), the host compiler as host code (the scheduler's
// expand_work_item and the tests go through it too).
inline DecodeWorkItem decode_cta_work_item(DecodeWorkItem w, int cta, int ctas_per_unit) {
  if (ctas_per_unit > 1) {
    const int h = cta % ctas_per_unit;
    w.kv_head = h;  // (0 in a template)
    if (w.slot >= 0) w.slot += h;
    if (w.merge >= 0) w.merge += h;
  }
  return w;
}

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)  // device code only; the host writes the bytes
__device__ __forceinline__ const DecodeMergeItem* decode_merge_items(const DecodePlanPtrs& p) {
  return reinterpret_cast<const DecodeMergeItem*>(reinterpret_cast<const char*>(p.header) +
                                                  p.header->merge_offset);
}
#endif

}  // namespace flashkv
