// Batch decode attention over a paged KV cache: plan on the CPU, run on the GPU.
//
//   BatchDecodeConfig cfg{.max_batch = 256, .num_qo_heads = 32, .head_dim = 128};
//   DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
//   BatchDecode dec(cfg, ws.data(), ws.size());
//   dec.plan({.kv_indptr = indptr_host, .kv_last_page_len = last_page_len_host,
//             .batch_size = batch, .page_size = 16},
//            {.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128},  // f16 q, KV and out
//            {}, stream);
//   dec.run(q, paged_kv, out, lse, stream);  // allocates nothing, never synchronizes
//
// The workspace is sized once for the worst case, so its pointers never move: a CUDA graph that
// captured run() (after a plan() with enable_cuda_graph) replays correctly after any later plan()
// with a batch of at most max_batch requests. LSE outputs are natural-log (attention.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "flashkv/attention.h"
#include "flashkv/paged_kv.h"
#include "flashkv/rope.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"
#include "flashkv/variant_spec.h"

namespace flashkv {

struct BatchDecodeConfig {
  int max_batch = 256;    // requests per plan(), at most
  int num_qo_heads = 32;  // at most (sizes the partial-state buffer)
  int head_dim = 128;     // at most
  int device = 0;
  int num_sms_to_use = 0;  // 0: all SMs; fewer leaves room for overlapped work
  // Persistent CTAs per SM (the paper's k). 0 (auto): each plan picks 2 CTAs of 4 warps per SM,
  // or, for batches with >= 896 KV tokens per CTA (no splitting needed), 4 CTAs of 2 warps, whose
  // item ramps hide behind each other (BatchDecode::plan; the workspace is sized for 4). With
  // enable_cuda_graph or fixed_split_size auto keeps 2 x 4 warps: a captured graph holds its kernel
  // and grid, and batch invariance needs one kernel whatever the batch.
  int ctas_per_sm = 0;
  // For plans with DecodePlanOptions::fixed_split_size (batch-invariant output), whose chunk
  // count follows the KV lengths instead of the grid: the most KV tokens a batch holds in all
  // (the sum of its kv lengths) and the smallest fixed_split_size plan() will be given. The
  // workspace then also holds ceil(max_kv_tokens / min_fixed_split_size) + max_batch chunks per
  // KV head. 0 and 0: sized for dynamic splitting only (a fixed_split_size plan that needs more
  // partial states than that fails with an error naming these fields). Each chunk costs
  // (head_dim + 1) * 4 bytes per query head of device memory, and ~90 bytes per query head of
  // the pinned host memory plan() writes its plans to.
  int64_t max_kv_tokens = 0;
  int min_fixed_split_size = 0;
};

// Which decode kernel runs. kAuto picks tensor cores wherever their accumulators fit in
// registers (head_dim 64 with groups up to 32, head_dim 128 with groups up to 16; see
// decode_tc.cuh) and CUDA cores otherwise (head_dim 256, larger groups).
enum class DecodeBackend : uint8_t { kAuto, kCudaCores, kTensorCores };

struct DecodePlanOptions {
  float sm_scale = 0.0f;     // 0: 1/sqrt(head_dim)
  int fixed_split_size = 0;  // > 0: split each request's KV in chunks of this many tokens,
                             // independent of the rest of the batch (batch-invariant output);
                             // size the workspace for it (BatchDecodeConfig.max_kv_tokens)
  bool disable_split_kv = false;
  // Scheduler tuning (0: the defaults of scheduler/decode_scheduler.h): the fixed cost of a work
  // item in KV-token units (the cost model's alpha) and the shortest chunk dynamic splitting makes.
  double work_item_cost_tokens = 0.0;
  int min_chunk_tokens = 0;
  // Dynamic splitting picks, among chunk bounds >= the paper's L_kv (total work / #CTAs), the one
  // with the smallest greedy makespan when some CTAs would run two chunks (scheduler/
  // decode_scheduler.h). false: always L_kv, the paper's rule.
  bool balance_chunk_bound = true;
  // Dynamic splitting with num_kv_heads dividing the CTA count: cut the last, partial round of
  // whole chunks and pour it over the least-loaded CTAs so all end near the mean load
  // (scheduler/decode_scheduler.h, balance_tail). Off by default: on the H200 the extra split
  // items and merges cost more than the ragged round (GQA D5 92.8 -> 90.9 % of the read
  // ceiling, D6 unchanged; NOTES.md), and plan() takes a few us more.
  bool balance_tail = false;
  bool enable_cuda_graph = false;  // fixed grids, so run() may be captured and replayed
  // Programmatic dependent launch (sm_90+): run() launches the kernel so its CTAs start, and read
  // this plan, while the previous kernel in the stream drains; it waits for that kernel before
  // touching q, the cache, page ids, outputs or the workspace's split state, so any predecessor is
  // safe. Saves a few us of launch and first-byte latency per call when decode layers run back to
  // back (a CUDA graph of 32 layers: NOTES.md). false: ordinary stream order.
  bool enable_pdl = true;
  DecodeBackend backend = DecodeBackend::kAuto;
  // The tensor-core kernel's shape (0: the defaults: 2 stages at head_dim 128, and the warps that
  // BatchDecodeConfig::ctas_per_sm, or with 0 there the batch, picks):
  // KV pipeline stages (2-8) and warps per CTA (2, 4 or 8; a warp takes 16 tokens of each stage).
  // Deeper or wider CTAs need more shared memory: with BatchDecodeConfig.ctas_per_sm CTAs that
  // do not fit one SM together the grid runs in waves (correct, slower). A benchmark knob.
  int tc_stages = 0;
  int tc_warps = 0;
  // Optional host copy of kv_indices (kv_indptr[batch] entries; read during plan() only), checked
  // at no GPU cost (plan_checks.h): plan() names the first page id < 0 (or >= num_pages when
  // num_pages > 0) and keeps the largest; run() / run_step() compare it with the page count of the
  // cache they are given and throw, naming the entry, before anything is launched. Without it
  // the kernel still never reads outside the cache: an out-of-range id reads as zeros (and is
  // reported with check_page_ids below).
  const int32_t* kv_indices_host = nullptr;
  int64_t num_pages = 0;  // 0: compare with the cache at run()
  // The kernel also reports a device page id outside [0, num_pages) through check_device_errors()
  // (device_errors.h), naming the entry and its request. A kernel variant that costs 1-6 % on
  // the H200, so off by default; FLASHKV_CHECK_DEVICE_ERRORS=1 turns it on for every plan.
  bool check_page_ids = false;
  // How the errors of plan() and run() name the page-table arrays (the Python wrappers pass
  // FlashInfer's argument names). Read during plan() only; the strings are copied.
  PageTableNames names;
  // The attention variant (variant_spec.h): a built-in (window, soft-cap, ALiBi, sinks, sigmoid,
  // custom mask, fused RoPE) or a user's source; compiled into the kernel at plan().
  Variant variant;
};

// The fused decode step (BatchDecode::run_step): how q and the new keys rotate, with rope.h's
// conventions. Rope::kNone appends and attends without rotating (q and new_k already rotated).
struct DecodeStepOptions {
  enum class Rope : uint8_t { kNone, kLlama, kLlama31, kCosSinCache };
  Rope rope = Rope::kNone;
  RopeOptions llama;           // Rope::kLlama
  Llama31RopeOptions llama31;  // Rope::kLlama31
  TensorView cos_sin_cache;    // Rope::kCosSinCache: f32 [max_position, rotary_dim] on the device
  bool is_neox = true;         // Rope::kCosSinCache: half-split pairs (false: interleaved)
  // Optional i32 [batch] on the device: the RoPE position of each request's new token. Default:
  // kv_len - 1, the position the token is appended at. A position < 0 (or >= max_position with a
  // cos_sin_cache) is reported through check_device_errors() (device_errors.h); that request's
  // new token is not written to the cache and its q is not rotated (its output is meaningless).
  TensorView pos_ids;
};

// The batch a decode plan() schedules: its page table on the host (paged_kv.h conventions).
struct DecodeBatch {
  const int32_t* kv_indptr = nullptr;         // [batch_size + 1] pages per request
  const int32_t* kv_last_page_len = nullptr;  // [batch_size] tokens in each request's last page
  int batch_size = 0;
  int page_size = 16;
};

class BatchDecode {
 public:
  // The workspace that never limits splitting: 2 partial states per CTA (the paper's bound), or
  // what max_kv_tokens / min_fixed_split_size ask for.
  static size_t workspace_bytes(const BatchDecodeConfig& cfg);
  // The least a workspace may have: the plan arrays of max_batch requests and no partial states
  // (plans then never split KV).
  static size_t min_workspace_bytes(const BatchDecodeConfig& cfg);
  // The KV chunks per KV head a plan of `batch` with DecodePlanOptions::fixed_split_size cuts
  // (each takes a partial-state slot): sum over requests of ceil(kv_len / fixed_split_size). A
  // config holds them with max_kv_tokens = this count and min_fixed_split_size = 1. Reads the
  // page table unchecked (negative lengths count 0): for sizing before plan() checks it.
  static int64_t fixed_split_chunks(const DecodeBatch& batch, int fixed_split_size);

  // `workspace` is device memory owned by the caller, of at least min_workspace_bytes(cfg) bytes
  // (else throws, naming that size). With less than workspace_bytes(cfg) the partial states get
  // what is left after the plan arrays and every plan fits its split-KV into them: longer chunks,
  // fewer splits (PlanInfo::split_limited says a plan did); a fixed_split_size plan that does not
  // fit throws, naming the bytes it needs. So one fixed buffer (FlashInfer's usual 128 MB, or
  // the 16-32 MB of its tests) serves any batch; the cost of a small one is measured in README.
  BatchDecode(const BatchDecodeConfig& cfg, void* workspace, size_t workspace_bytes);
  ~BatchDecode();
  BatchDecode(const BatchDecode&) = delete;
  BatchDecode& operator=(const BatchDecode&) = delete;

  // Compiles (JIT) the kernel for this configuration on first use, schedules, and copies the
  // plan into the workspace asynchronously on `stream`.
  void plan(const DecodeBatch& batch, const AttentionShape& shape,
            const DecodePlanOptions& opts = {}, Stream stream = nullptr);

  // q[batch, H_qo, D], out[batch, H_qo, D], lse f32[batch, H_qo] (optional: undefined view).
  // kv's index tensors are on the device (only kv.indices is read; indptr and last_page_len are
  // those given to plan()). Enqueued on `stream`. A page id in kv.indices outside [0, num_pages)
  // is read as zeros (that request's output is not meaningful); with check_page_ids it is also
  // reported through check_device_errors() (device_errors.h). With kv_indices_host given to
  // plan(), run() throws before launching when the plan's largest page id is >= kv.num_pages().
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
           const TensorView& lse, Stream stream = nullptr);
  // run() with other arguments for the plan's user variant (same VariantSpec).
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
           const TensorView& lse, const VariantArgs& variant_args, Stream stream = nullptr);

  // The fused decode step, one launch per layer where an engine otherwise runs three (RoPE,
  // append_paged_kv_cache, decode): every request brings one new token; its q [batch, H_qo, D]
  // and key are rotated (DecodeStepOptions), its key and value new_k / new_v [batch, H_kv, D]
  // (kv dtype, or q's dtype for an fp8 cache, which the kernel quantizes into with
  // kv.scale as append_paged_kv_cache does; last dimension contiguous, 16-byte aligned rows) are
  // written into the cache at position kv_len - 1, and out / lse are decode attention over the
  // updated cache. The plan counts the new token: it was made with the page table after the append
  // (every request has kv_len >= 1, its last page allocated). q is read, not modified. Equal to
  // apply_rope_pos_ids -> append_paged_kv_cache -> run bitwise (cache and outputs). Split-KV and
  // CUDA graphs work as with run() (the positions come from the plan, so a replay after a new
  // plan() appends where the new plan says). See kernels/attention/decode/decode_step.cuh for why
  // the append is visible to every CTA that reads the new token.
  void run_step(const TensorView& q, const TensorView& new_k, const TensorView& new_v,
                const PagedKVCache& kv, const TensorView& out, const TensorView& lse,
                const DecodeStepOptions& step, Stream stream = nullptr);

  // A CUDA graph that captured run() keeps its q/out/lse/indices pointers, kernel, sm_scale and
  // how its CTAs share work items (by num_kv_heads, when that divides the CTA count), so plan()
  // refuses a batch or configuration the captured graph cannot run. Call this after
  // destroying every graph that captured this object's run() to lift those limits.
  void forget_captured_graphs();

  // Statistics of the last plan (for benchmarks and tests).
  struct PlanInfo {
    int num_ctas = 0;
    int num_work_items = 0;      // items the CTAs run (per KV head; stored once per block)
    int num_split_tiles = 0;     // (request, kv head) tiles split across CTAs
    int num_partial_states = 0;  // their chunks: partial-state slots the plan uses
    int slot_capacity = 0;       // slots the workspace holds at this plan's GQA group
    bool split_limited = false;  // the workspace was short: fewer, longer chunks than balance wants
    int64_t chunk_bound = 0;
    double plan_us = 0.0;       // CPU time of the last plan()
    double schedule_us = 0.0;   // of which the scheduler (chunking, assignment, work items)
    bool tensor_cores = false;  // which kernel the plan runs
    int ctas_per_sm = 0;        // the grid's CTAs per SM
    int warps = 0;              // per CTA
    std::string kernel_id;      // the kernel's entry in the JIT cache (profiling tools look it up)
  };
  PlanInfo plan_info() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One request over contiguous KV: q[H_qo, D], k/v [kv_len, H_kv, D] (NHD) or [H_kv, kv_len, D]
// (HND), out[H_qo, D], lse f32[H_qo] optional. Host tensors run on the CPU reference. On the GPU
// this plans on every call and uses a workspace the library keeps per device (allocated on first
// use): convenient, but not for CUDA-graph capture — use BatchDecode there.
void single_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& lse, KVLayout layout = KVLayout::NHD,
                   const AttentionOptions& opts = {}, Stream stream = nullptr);

// Batch decode on host tensors or, for CUDA tensors, through a BatchDecode with the library's
// per-device workspace (plans on every call; index tensors must then be on the host too).
void batch_decode(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
                  const TensorView& lse, const AttentionOptions& opts = {},
                  Stream stream = nullptr);

}  // namespace flashkv
