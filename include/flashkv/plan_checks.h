// The argument checks of plan() that need no GPU, in one place for both paths: the GPU ops' plan()
// (BatchDecode, BatchPrefillPaged / BatchPrefillRagged, MultiLevelCascade) runs them first, and the
// Python wrappers run the same functions at plan() on their host path (the CPU reference), so a
// plan the GPU refuses is refused, with the same message, on a machine without one (and CI, which
// has none, covers the checks).
//
// Page ids: plan() knows the page table but not the cache (that arrives at run()), so a host
// table's ids are checked in two steps that cost no GPU work: check_page_ids() at plan() (every id
// >= 0, and < num_pages when the caller knows it) returns the largest id and its entry, and
// check_page_ids_fit() at run() compares that with the cache's page count before anything is
// launched. Device-resident tables are checked in the kernel on request
// (DecodePlanOptions::check_page_ids, FLASHKV_CHECK_DEVICE_ERRORS=1; device_errors.h).
#pragma once

#include <cstdint>
#include <utility>

#include "flashkv/cascade.h"
#include "flashkv/dtype.h"
#include "flashkv/paged_kv.h"
#include "flashkv/tensor.h"

namespace flashkv {

// Which dtypes a plan may name: the GPU kernels take f16 or bf16 (q, kv and out one dtype); the
// CPU reference (host path) also takes f32. Everything else is checked alike.
enum class PlanTarget : uint8_t { kGpu, kHost };

// The GQA groups (num_qo_heads / num_kv_heads) the GPU kernels take.
inline constexpr int kMaxDecodeGroup = 64;
inline constexpr int kMaxPrefillGroup = 128;

// BatchDecode::plan's arguments (decode.h): batch_size >= 0; kv_indptr [batch_size + 1] host array
// from 0, non-decreasing; kv_last_page_len [batch_size] in [1, page_size] for each request with
// pages; page_size >= 1; num_qo_heads and num_kv_heads positive, num_qo_heads % num_kv_heads == 0,
// a GQA group of at most kMaxDecodeGroup; head_dim 64, 128 or 256; q, kv and o one dtype (f16 or
// bf16; kHost: or f32). Throws flashkv::Error naming the argument (and the entry).
void check_decode_plan(const int32_t* kv_indptr, const int32_t* kv_last_page_len, int batch_size,
                       int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
                       DType q_dtype, DType kv_dtype, DType o_dtype,
                       PlanTarget target = PlanTarget::kGpu, const PageTableNames& names = {},
                       const KVQuantFormat& kv_format = {});

// BatchPrefillPaged::plan's arguments (paged: kv_indptr in pages, kv_last_page_len and page_size as
// decode's) or BatchPrefillRagged::plan's (paged false: kv_indptr in tokens; kv_last_page_len and
// page_size unused). qo_indptr [batch_size + 1] from 0, non-decreasing; a GQA group of at most
// kMaxPrefillGroup; the rest as check_decode_plan.
void check_prefill_plan(const int32_t* qo_indptr, const int32_t* kv_indptr,
                        const int32_t* kv_last_page_len, int batch_size, int num_qo_heads,
                        int num_kv_heads, int head_dim, int page_size, bool paged, DType q_dtype,
                        DType kv_dtype, DType o_dtype, PlanTarget target = PlanTarget::kGpu,
                        const PageTableNames& names = {}, const KVQuantFormat& kv_format = {});

// A quantized cache's format (kv_quant.h; AttentionShape::kv_format) against the plan's kv_dtype
// and head_dim (check_kv_format's named errors), then the target: no GPU kernel reads these
// formats yet, so kGpu throws NotImplementedError naming the format and issue 42; kHost (the CPU
// reference) takes them. kNone: nothing to check. The decode / prefill / cascade plan checks call
// it; `name` is the argument ("kv_format").
void check_kv_quant_plan(const KVQuantFormat& kv_format, DType kv_dtype, int head_dim,
                         PlanTarget target, const char* name = "kv_format");

// The largest page id of a host page table and the entry that holds it (entry -1: no pages).
struct PageIdMax {
  int64_t id = -1;
  int64_t entry = -1;
};

// Page ids kv_indices[0 .. n) of a host page table: each >= 0, and < num_pages when num_pages > 0
// (0: the page count is not known yet; run() compares with check_page_ids_fit). Names the first
// entry that is out of range; returns the largest id and its entry.
PageIdMax check_page_ids(const int32_t* kv_indices, int64_t n, int64_t num_pages,
                         const char* name = "kv_indices");

// run(): the plan's largest page id (check_page_ids) against the page count of the cache run() was
// given; throws naming the entry when it is not below. No-op for an empty max (entry < 0).
void check_page_ids_fit(const PageIdMax& max, int64_t num_pages, const char* name = "kv_indices");

// MultiLevelCascade::plan's arguments (cascade.h): the batch's page table as check_prefill_plan's
// (qo_indptr null: decode, one query row per request, GQA group as decode's), its kv_indices
// (every id >= 0; null: not checked here, the caller checks them with check_page_ids) and the
// shape (f16 or bf16; kHost: or f32). Returns the page table's largest id.
PageIdMax check_cascade_plan(const CascadeBatch& batch, const CascadeShape& shape,
                             PlanTarget target = PlanTarget::kGpu,
                             const PageTableNames& names = {});

// single_decode / single_prefill: the KV heads of contiguous k [kv_len, H_kv, D] (NHD) or
// [H_kv, kv_len, D] (HND) against q's num_qo_heads, with a message that names the layout and the
// shape it expects (k in the other layout by mistake reads a wrong head count). Returns
// {kv_len, num_kv_heads}.
std::pair<int64_t, int> check_contiguous_kv_heads(const TensorView& k, KVLayout layout,
                                                  int num_qo_heads);

}  // namespace flashkv
