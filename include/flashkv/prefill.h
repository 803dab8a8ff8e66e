// Batch prefill / append attention on tensor cores: plan on the CPU, run on the GPU.
//
// Queries are ragged (qo_indptr, no padding): request i has query rows
// [qo_indptr[i], qo_indptr[i+1]) of q[nnz_qo, H_qo, D]. KV is either a paged cache
// (BatchPrefillPaged) or ragged contiguous tensors k, v [nnz_kv, H_kv, D] split by kv_indptr
// (BatchPrefillRagged). With causal masks the queries are aligned to the END of the KV: query i of
// a request with qo_len < kv_len (append, chunked prefill, speculative verification) sees KV
// positions <= kv_len - qo_len + i (attention.h).
//
//   BatchPrefillConfig cfg{.max_batch = 64, .max_qo_tokens = 32768, .num_qo_heads = 32,
//                          .head_dim = 128};
//   DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
//   BatchPrefillPaged pf(cfg, ws.data(), ws.size());
//   pf.plan({.qo_indptr = qo_indptr_h, .kv_indptr = kv_indptr_h,
//            .kv_last_page_len = last_page_len_h, .batch_size = batch, .page_size = 16},
//           {.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128},  // f16 q, KV and out
//           {.causal = true}, stream);
//   pf.run(q, paged_kv, out, lse, stream);  // allocates nothing, never synchronizes
//
// Requests may have qo_len 0 or kv_len 0; a query row that sees no key gets out = 0, lse = -inf.
// q, kv and out share one dtype (f16 or bf16); head_dim 64, 128 or 256; GQA groups up to 128.
//
// The workspace is sized once for the worst case, so its pointers never move. CUDA graphs: plan
// with enable_cuda_graph, capture run() once with q/out/lse views of max_qo_tokens rows (run()
// then accepts views with more rows than the plan's) and the full KV buffers, then re-plan and
// replay. A captured graph pins the kernel (dtypes, head_dim, query tile: fix tile_rows),
// sm_scale, causal, the head counts and page_size; plan() refuses a batch or configuration the
// graph cannot run (forget_captured_graphs() lifts that once the graph is destroyed). A plan()
// that throws leaves the object unplanned: an eager run() then throws too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "flashkv/attention.h"
#include "flashkv/paged_kv.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"
#include "flashkv/variant_spec.h"

namespace flashkv {

struct BatchPrefillConfig {
  int max_batch = 64;             // requests per plan(), at most
  int64_t max_qo_tokens = 32768;  // query tokens per plan() (nnz_qo), at most
  int num_qo_heads = 32;          // at most
  int head_dim = 128;             // at most
  int device = 0;
  int num_sms_to_use = 0;  // 0: all SMs
  int ctas_per_sm = 2;     // persistent CTAs per SM (the paper's k; fewer where shared memory
                           // does not fit that many, e.g. head_dim 256). The sm_90 tuning
                           // policy's kPrefillCtasPerSm (kernels/tuning/sm90.cuh says why)
};

// Which kernel a plan runs. kAuto: the Hopper wgmma kernel where it applies (an sm_90a GPU,
// 128-row query tiles, plain attention), else the mma.sync kernel. kWgmma takes 128-row tiles
// unless tile_rows fixes others; where it cannot run, plan() throws, naming why.
enum class PrefillBackend : uint8_t { kAuto, kMmaSync, kWgmma };

// The order in which each CTA runs its work items (the load balance is the same; the order is for
// the L2). kRequestMajor: by (request, KV head, query tile), so the CTAs sweep the batch's
// (request, head) pairs together. kHeadMajor: all CTAs work through the KV heads together, the
// costliest tiles of a head first, so one head's KV at a time is in the L2 (long prompts whose KV
// over all heads is far larger than it: MHA at 32k read 2.5 TB/s from DRAM request-major).
// kAuto: kHeadMajor where the batch's KV exceeds the L2 and a request's per-head KV is long
// (tuning/sm90.cuh), else kRequestMajor.
enum class PrefillItemOrder : uint8_t { kAuto, kRequestMajor, kHeadMajor };

struct PrefillPlanOptions {
  bool causal = false;
  float sm_scale = 0.0f;     // 0: 1/sqrt(head_dim)
  int fixed_split_size = 0;  // > 0: KV chunks of this many tokens (batch-invariant with tile_rows).
                             // Each chunk of a split tile takes a partial-state slot; the workspace
                             // has 2 x CTAs slots, so long KV with small chunks can exceed it
                             // (plan() then throws, naming the count): size chunks to the context.
  bool disable_split_kv = false;
  bool enable_cuda_graph = false;  // fixed grid, so run() may be captured and replayed
  // Programmatic dependent launch (sm_90+): the kernel's CTAs start (barriers, shared memory,
  // plan reads) while the previous kernel in the stream drains, and wait for it before touching
  // q, KV, page ids, outputs or the workspace's split state. false: ordinary stream order.
  bool enable_pdl = true;
  int tile_rows = 0;  // query-tile rows (16, 32, 64, 128; >= the GQA group: a tile holds whole
                      // tokens); 0: the paper's heuristic (the smallest tile >= the average
                      // query length x GQA group)
  // Optional host copy of kv_indices (paged only; read during plan() only), checked at no GPU
  // cost (plan_checks.h): plan() names the first page id < 0 (or >= num_pages when num_pages > 0)
  // and keeps the largest; run() compares it with the cache's page count and throws, naming the
  // entry, before anything is launched. Without it the kernel still never reads outside the
  // cache: out-of-range ids read as zeros.
  const int32_t* kv_indices_host = nullptr;
  int64_t num_pages = 0;  // 0: compare with the cache at run()
  // How the errors of plan() and run() name the page-table arrays (the Python wrappers pass
  // FlashInfer's argument names). Read during plan() only; the strings are copied.
  PageTableNames names;
  PrefillBackend backend = PrefillBackend::kAuto;
  PrefillItemOrder item_order = PrefillItemOrder::kAuto;
  // The attention variant (variant_spec.h): a built-in (window, soft-cap, ALiBi, sinks, sigmoid,
  // custom mask, fused RoPE) or a user's source; compiled into the kernel at plan(), its
  // arguments packed at each run(). A built-in's causal / sm_scale apply when causal is false /
  // sm_scale is 0 here. Without softmax (sigmoid) run() takes no lse.
  Variant variant;
};

// Statistics of the last plan (benchmarks and tests).
struct PrefillPlanInfo {
  int num_ctas = 0;
  int num_work_items = 0;
  int num_split_tiles = 0;     // (query tile, kv head) pairs split across CTAs
  int num_partial_states = 0;  // their chunks: partial-state slots the plan uses
  int slot_capacity = 0;       // slots of tile_rows rows the workspace holds
  bool split_limited = false;  // the workspace was short: fewer, longer chunks than balance wants
  int tile_rows = 0;
  int64_t chunk_bound = 0;  // the longest KV chunk a work item may take (tokens; the split bound)
  bool wgmma = false;       // the plan runs the Hopper wgmma kernel (else mma.sync)
  bool kv_tma = false;      // the last run() loaded KV tiles by TMA (the wgmma kernel, on ragged KV
                            // or pages of >= 16 tokens, a power of two, with every work item on a
                            // KV tile: not with a fixed_split_size off the tile), else by cp.async
  double plan_us = 0.0;     // CPU time of the last plan()
};

// The batch a prefill plan() schedules, as host arrays (paged_kv.h conventions).
struct PrefillBatch {
  const int32_t* qo_indptr = nullptr;         // [batch_size + 1] query rows per request
  const int32_t* kv_indptr = nullptr;         // [batch_size + 1] pages (paged) or KV rows (ragged)
  const int32_t* kv_last_page_len = nullptr;  // [batch_size] paged; ragged: nullptr
  int batch_size = 0;
  int page_size = 0;  // paged: tokens per page (>= 1, no default: the cache's); ragged: 0
};

namespace detail {
struct PrefillCore;  // the shared plan/run machinery of both wrappers
                     // (src/ops/prefill/batch_prefill.cpp)
}

// Ragged queries over a paged KV cache.
class BatchPrefillPaged {
 public:
  // The workspace that never limits splitting, and the least one may have (the plan arrays of
  // the config, no partial states: plans then never split KV).
  static size_t workspace_bytes(const BatchPrefillConfig& cfg);
  static size_t min_workspace_bytes(const BatchPrefillConfig& cfg);
  // `workspace`: device memory of at least min_workspace_bytes(cfg) bytes, owned by the caller
  // (else throws, naming that size). With less than workspace_bytes(cfg) each plan fits its
  // split-KV into the partial states that fit (PrefillPlanInfo::split_limited says a plan had to;
  // a fixed_split_size plan that does not fit throws). A plan's need follows its query tile rows
  // (16-128, chosen from its query lengths), not the configured max_qo_tokens.
  BatchPrefillPaged(const BatchPrefillConfig& cfg, void* workspace, size_t workspace_bytes);
  ~BatchPrefillPaged();
  BatchPrefillPaged(const BatchPrefillPaged&) = delete;
  BatchPrefillPaged& operator=(const BatchPrefillPaged&) = delete;

  // batch: qo_indptr, kv_indptr (pages), kv_last_page_len, batch_size, page_size. JIT-compiles
  // the kernel on first use, schedules, and copies the plan to the workspace asynchronously on
  // `stream`.
  void plan(const PrefillBatch& batch, const AttentionShape& shape,
            const PrefillPlanOptions& opts = {}, Stream stream = nullptr);
  // q[nnz_qo, H_qo, D], out[nnz_qo, H_qo, D], lse f32[nnz_qo, H_qo] (optional: undefined view).
  // Only kv.indices is read from kv's index tensors (on the device); indptr and last_page_len are
  // those given to plan(), but their views must still have the plan's batch shape (they are
  // validated with the cache). k and v must share strides (16-byte multiples).
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
           const TensorView& lse, Stream stream = nullptr);
  // See BatchDecode::forget_captured_graphs.
  void forget_captured_graphs();
  PrefillPlanInfo plan_info() const;

 private:
  std::unique_ptr<detail::PrefillCore> core_;
};

// Ragged queries over ragged contiguous KV: k, v [nnz_kv, H_kv, D], request i owns KV rows
// [kv_indptr[i], kv_indptr[i+1]).
class BatchPrefillRagged {
 public:
  static size_t workspace_bytes(const BatchPrefillConfig& cfg);      // as BatchPrefillPaged's
  static size_t min_workspace_bytes(const BatchPrefillConfig& cfg);  // as BatchPrefillPaged's
  BatchPrefillRagged(const BatchPrefillConfig& cfg, void* workspace, size_t workspace_bytes);
  ~BatchPrefillRagged();
  BatchPrefillRagged(const BatchPrefillRagged&) = delete;
  BatchPrefillRagged& operator=(const BatchPrefillRagged&) = delete;

  // batch: qo_indptr, kv_indptr (KV rows), batch_size; its kv_last_page_len must be null and
  // its page_size 0 (ragged KV has no pages).
  void plan(const PrefillBatch& batch, const AttentionShape& shape,
            const PrefillPlanOptions& opts = {}, Stream stream = nullptr);
  // q/out [nnz_qo, H_qo, D]; k, v [nnz_kv, H_kv, D] with nnz_kv >= kv_indptr[batch].
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse, Stream stream = nullptr);
  // The same over fp8 k, v (a plan with an fp8 kv_dtype) with their dequantization scales
  // (attention.h: KVScale, on k's device).
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse, const KVScale& scale, Stream stream = nullptr);
  void forget_captured_graphs();
  PrefillPlanInfo plan_info() const;

 private:
  std::unique_ptr<detail::PrefillCore> core_;
};

// One request: q[qo_len, H_qo, D]; k, v [kv_len, H_kv, D] (NHD) or [H_kv, kv_len, D] (HND);
// out[qo_len, H_qo, D]; lse f32[qo_len, H_qo] optional. Host tensors run on the CPU reference.
// On the GPU this plans on every call with a workspace the library keeps per device: convenient,
// not for CUDA-graph capture (use BatchPrefillRagged there).
void single_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const TensorView& lse, KVLayout layout = KVLayout::NHD,
                    const AttentionOptions& opts = {}, Stream stream = nullptr);

}  // namespace flashkv
