// Multi-level cascade attention over a paged KV cache (docs/design.md "Kernel families", composed
// ops).
//
// When requests share a prefix (a system prompt, parallel sampling, tree search), plain batch
// attention reads the prefix's KV once per request. A cascade reads it once per group: level 0 is
// the shared prefixes, attended by all of a group's query rows at once (one large query tile of
// the tensor-core prefill kernel, no causal mask: every row sees the whole prefix), deeper levels
// nested shared prefixes, the last level each request's own suffix (decode, or causal append
// aligned to the end of the KV), and the levels' states are merged with ⊕. No KV moves: only
// index arrays (pages of the same cache) are built.
//
//   MultiLevelCascadeConfig cfg{.max_batch = 256, .num_qo_heads = 32, .head_dim = 128};
//   DeviceBuffer ws(MultiLevelCascade::workspace_bytes(cfg));
//   MultiLevelCascade cascade(cfg, ws.data(), ws.size());
//   // Automatic: finds requests whose page lists start with the same pages and uses the cascade
//   // when its cost model says it is faster; otherwise it runs plain batch attention.
//   cascade.plan(table, {.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128}, {}, stream);
//   cascade.run(q, paged_kv, out, lse, stream);
//
// Results equal plain attention up to rounding: each level's output is rounded to the output
// dtype once before the ⊕ (as FlashInfer's cascade does), so an output element sees at most
// one rounding per level more than plain attention; the GPU tests hold it to the same tolerance
// rule as plain decode (STYLE.md). Safe to leave on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "flashkv/paged_kv.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"

namespace flashkv {

struct MultiLevelCascadeConfig {
  int max_batch = 256;          // requests per plan(), at most
  int64_t max_qo_tokens = 0;    // query rows per plan(), at most; 0: max_batch (decode)
  int64_t max_pages = 1 << 20;  // kv_indices entries of a plan's page table, at most
  int num_qo_heads = 32;        // at most
  int head_dim = 128;           // at most
  int max_levels = 3;           // 1..4: shared-prefix levels + the suffix level
  int device = 0;
};

// The batch's page table on the host (paged_kv.h conventions), as the plain ops take it, plus the
// host page ids (detection compares them).
struct CascadeBatch {
  const int32_t* qo_indptr = nullptr;         // [batch + 1] query rows per request; nullptr: decode
  const int32_t* kv_indptr = nullptr;         // [batch + 1]
  const int32_t* kv_indices = nullptr;        // [kv_indptr[batch]]
  const int32_t* kv_last_page_len = nullptr;  // [batch]
  int batch_size = 0;
  int page_size = 16;
};

struct CascadeShape {
  int num_qo_heads = 32, num_kv_heads = 8, head_dim = 128;
  DType dtype = DType::f16;  // q, kv and out
  // An fp8 cache (e4m3 / e5m2: every level reads it, with paged_kv.scale); any other value: the
  // cache is in `dtype`.
  DType kv_dtype = DType::f32;
  // A quantized format (kv_quant.h; kv_dtype its element dtype, u8 for INT4 / NVFP4): no GPU
  // kernel reads one yet, so MultiLevelCascade::plan refuses it (NotImplementedError).
  KVQuantFormat kv_format = {};
  DType cache_dtype() const {
    return is_fp8_dtype(kv_dtype) || kv_dtype == DType::u8 ? kv_dtype : dtype;
  }
};

struct CascadePlanOptions {
  bool causal = true;     // the last level (append / prefill rows; decode is unaffected)
  float sm_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  // Automatic use: kAuto decides by the cost model (scheduler/cascade_cost.h), kAlways cascades
  // whenever a prefix is shared, kNever runs plain attention (one level).
  enum class Use : uint8_t { kAuto, kAlways, kNever } use = Use::kAuto;
  int min_group_size = 2;          // requests that must share a prefix for it to form a group
  bool enable_cuda_graph = false;  // fixed launches and grids: run() may be captured and replayed
  // How the errors of plan() and run() name the page-table arrays (the Python wrappers pass
  // FlashInfer's argument names). Read during plan() only; the strings are copied.
  PageTableNames names;
};

struct CascadePlanInfo {
  int num_levels = 0;            // 1: plain attention
  bool cascade = false;          // whether the plan uses a shared-prefix level
  int64_t plain_kv_bytes = 0;    // KV bytes plain attention would read
  int64_t cascade_kv_bytes = 0;  // KV bytes this plan reads
  double estimated_plain_us = 0, estimated_cascade_us = 0;
  int num_split_tiles = 0;     // split-KV tiles over every level's plan
  bool split_limited = false;  // some level's workspace share was short (fewer, longer chunks)
  double plan_us = 0;          // CPU time of the last plan()
};

class MultiLevelCascade {
 public:
  // The workspace that never limits any level's splitting, and the least one may have (the
  // fixed buffers and each level's plan arrays: plans then never split KV). A buffer in between
  // gives each level a share; each level's plans fit their split-KV into it.
  static size_t workspace_bytes(const MultiLevelCascadeConfig& cfg);
  static size_t min_workspace_bytes(const MultiLevelCascadeConfig& cfg);
  MultiLevelCascade(const MultiLevelCascadeConfig& cfg, void* workspace, size_t bytes);
  ~MultiLevelCascade();
  MultiLevelCascade(const MultiLevelCascade&) = delete;
  MultiLevelCascade& operator=(const MultiLevelCascade&) = delete;

  // Detects shared prefixes in `batch` (whole pages that every query row of every member sees),
  // builds the levels, decides by the cost model (opts.use), schedules every level and copies
  // the levels' page ids and the plan to the workspace (async on `stream`).
  void plan(const CascadeBatch& batch, const CascadeShape& shape,
            const CascadePlanOptions& opts = {}, Stream stream = nullptr);

  // q / out [rows, H_qo, D] in the batch's own row order, lse f32 [rows, H_qo] optional (natural
  // log). `kv` supplies the cache tensors (k, v, layout); its index tensors are not read: the plan
  // holds device copies of every level's page ids. Allocates nothing, never synchronizes. plan()
  // refuses a negative page id and keeps the largest; run() throws, naming its entry, before
  // anything is launched when it is >= kv.num_pages() (plan_checks.h).
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
           const TensorView& lse, Stream stream = nullptr);

  CascadePlanInfo plan_info() const;
  // A captured graph holds q/out/lse and the levels' kernels fixed: plan() refuses more query rows
  // than it captured. Call this after destroying every graph that captured run().
  void forget_captured_graphs();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashkv
