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
//   pf.plan(qo_indptr_h, kv_indptr_h, last_page_len_h, batch, 32, 8, 128, 16, DType::f16,
//           DType::f16, DType::f16, {.causal = true}, stream);
//   pf.run(q, paged_kv, out, lse, stream);  // allocates nothing, never synchronizes
//
// The workspace is sized once for the worst case, so its pointers never move: a CUDA graph that
// captured run() (after a plan() with enable_cuda_graph) replays correctly after later plans that
// keep the kernel (dtypes, head_dim, query tile, sm_scale) and fit the captured tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "flashkv/attention.h"
#include "flashkv/paged_kv.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"

namespace flashkv {

struct BatchPrefillConfig {
  int max_batch = 64;            // requests per plan(), at most
  int64_t max_qo_tokens = 32768; // query tokens per plan() (nnz_qo), at most
  int num_qo_heads = 32;         // at most
  int head_dim = 128;            // at most
  int device = 0;
  int num_sms_to_use = 0;  // 0: all SMs
  int ctas_per_sm = 2;     // persistent CTAs per SM (the paper's k; fewer where shared memory
                           // does not fit that many, e.g. head_dim 256)
};

struct PrefillPlanOptions {
  bool causal = false;
  float sm_scale = 0.0f;     // 0: 1/sqrt(head_dim)
  int fixed_split_size = 0;  // > 0: KV chunks of this many tokens (batch-invariant with tile_rows)
  bool disable_split_kv = false;
  bool enable_cuda_graph = false;  // fixed grid, so run() may be captured and replayed
  int tile_rows = 0;  // query-tile rows (16, 32, 64, 128); 0: the paper's heuristic (the smallest
                      // tile >= the average query length x GQA group)
  // Optional host copy of kv_indices (paged only) and the cache's page count: when given, plan()
  // checks every page id and names the first out-of-range one. Without it the kernel still never
  // reads outside the cache: out-of-range ids read as zeros.
  const int32_t* kv_indices_host = nullptr;
  int64_t num_pages = 0;
};

// Statistics of the last plan (benchmarks and tests).
struct PrefillPlanInfo {
  int num_ctas = 0;
  int num_work_items = 0;
  int num_split_tiles = 0;
  int tile_rows = 0;
  int64_t chunk_bound = 0;
  double plan_us = 0.0;  // CPU time of the last plan()
};

namespace detail {
struct PrefillCore;  // the shared plan/run machinery of both wrappers (src/ops/batch_prefill.cpp)
}

// Ragged queries over a paged KV cache.
class BatchPrefillPaged {
 public:
  static size_t workspace_bytes(const BatchPrefillConfig& cfg);
  // `workspace`: device memory of at least workspace_bytes(cfg) bytes, owned by the caller.
  BatchPrefillPaged(const BatchPrefillConfig& cfg, void* workspace, size_t workspace_bytes);
  ~BatchPrefillPaged();
  BatchPrefillPaged(const BatchPrefillPaged&) = delete;
  BatchPrefillPaged& operator=(const BatchPrefillPaged&) = delete;

  // Host arrays: qo_indptr[batch + 1], kv_indptr[batch + 1] (pages), kv_last_page_len[batch].
  // JIT-compiles the kernel on first use, schedules, and copies the plan to the workspace
  // asynchronously on `stream`.
  void plan(const int32_t* qo_indptr, const int32_t* kv_indptr, const int32_t* kv_last_page_len,
            int batch_size, int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
            DType q_dtype, DType kv_dtype, DType o_dtype, const PrefillPlanOptions& opts = {},
            Stream stream = nullptr);
  // q[nnz_qo, H_qo, D], out[nnz_qo, H_qo, D], lse f32[nnz_qo, H_qo] (optional: undefined view).
  // Only kv.indices is read from kv's index tensors (on the device); indptr and last_page_len are
  // those given to plan().
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
  static size_t workspace_bytes(const BatchPrefillConfig& cfg);
  BatchPrefillRagged(const BatchPrefillConfig& cfg, void* workspace, size_t workspace_bytes);
  ~BatchPrefillRagged();
  BatchPrefillRagged(const BatchPrefillRagged&) = delete;
  BatchPrefillRagged& operator=(const BatchPrefillRagged&) = delete;

  // Host arrays qo_indptr[batch + 1], kv_indptr[batch + 1] (tokens).
  void plan(const int32_t* qo_indptr, const int32_t* kv_indptr, int batch_size, int num_qo_heads,
            int num_kv_heads, int head_dim, DType q_dtype, DType kv_dtype, DType o_dtype,
            const PrefillPlanOptions& opts = {}, Stream stream = nullptr);
  // q/out [nnz_qo, H_qo, D]; k, v [nnz_kv, H_kv, D] with nnz_kv >= kv_indptr[batch].
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse, Stream stream = nullptr);
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
