// The plan/run machinery BatchPrefillPaged and BatchPrefillRagged share: validation, the
// scheduler, the plan copy into the workspace, the CUDA-graph bookkeeping, and the launch. The two
// wrappers differ only in where KV comes from (a page table or kv_indptr over contiguous rows).
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

#include "attention/prefill_params.cuh"
#include "flashkv/plan_checks.h"
#include "flashkv/prefill.h"
#include "ops/prefill_kernel.h"
#include "ops/prefill_tma.h"
#include "ops/prefill_workspace.h"
#include "runtime/plan_upload.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::detail {

struct PrefillCore {
  PrefillCore(const BatchPrefillConfig& cfg, void* workspace, size_t bytes, bool paged,
              const char* name);

  // kv_last_page_len and page_size are the paged wrapper's (null / 0 for ragged KV).
  void plan(const int32_t* qo_indptr, const int32_t* kv_indptr, const int32_t* kv_last_page_len,
            int batch_size, int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
            DType q_dtype, DType kv_dtype, DType o_dtype, const PrefillPlanOptions& opts,
            Stream stream);
  // Checks q/out/lse against the plan and fills their fields of `p`; the caller filled the KV.
  void check_io(const TensorView& q, const TensorView& out, const TensorView& lse,
                PrefillParams& p) const;
  // Launches with `p` (KV and io fields filled) and records what a capture holds.
  void launch(PrefillParams& p, const TensorView& q, const TensorView& out, const TensorView& lse,
              int64_t kv_capacity, Stream stream);

  BatchPrefillConfig cfg;
  bool paged = true;
  const char* name;  // "BatchPrefillPaged" / "BatchPrefillRagged", for messages
  ops::PrefillWorkspace ws;
  std::string arch;  // the device's compile target ("sm_90a"), read at the first plan()
  int max_smem = 0;  // and its opt-in shared memory per block, bytes
  runtime::PlanUpload upload;  // the plan's pinned buffers and copies into the workspace

  // The plan in force.
  bool planned = false;
  int batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, page_size = 0;
  DType q_dtype{}, kv_dtype{}, o_dtype{};
  PrefillPlanOptions opts;  // opts.causal: the effective mask (the variant's causal included)
  ops::VariantJit variant_jit;  // the plan's variant (its arguments: opts.variant)
  VariantArgsBlock variant_args{};  // opts.variant's arguments, packed at plan()
  float sm_scale = 0.f;
  int64_t nnz_qo = 0;
  int64_t nnz_kv = 0;  // paged: kv_indptr[batch] page ids; ragged: KV rows
  PageIdMax page_ids;  // paged, with PrefillPlanOptions::kv_indices_host: the largest page id
  unsigned grid = 0;
  PrefillPlanInfo info;

  // The kernel of the plan in force (memoized: every step usually keeps it).
  struct Kernel {
    DType dtype{};
    int head_dim = 0, rows = 0;
    ops::PrefillKV kv = ops::PrefillKV::kRagged;
    std::string variant;  // VariantJit::id
    CUfunction fn = nullptr;         // the Hopper kernel: its KV-by-TMA instantiation
    CUfunction fn_gather = nullptr;  // the Hopper kernel with KV by the producer's cp.async
    ops::PrefillGeometry geometry;
    int ctas_per_sm = 0;
    bool wgmma = false;  // the Hopper kernel (attention/prefill_hopper_ws.cuh)
    std::string id;
  } kernel;

  // What a CUDA graph captured by run() holds fixed: later plans must fit it.
  struct Captured {
    bool any = false;
    int64_t q_rows = 0, out_rows = 0, lse_rows = -1, kv_capacity = 0;
    std::string kernel_id;
    float sm_scale = 0.f;
    bool causal = false;
    int num_qo_heads = 0, num_kv_heads = 0, page_size = 0;
    VariantArgsBlock variant_args{};  // the variant's arguments, by value in the graph
    bool kv_tma = false;  // KV tiles by TMA: later plans must start every work item on a tile
  } captured;

  // The Hopper kernel's TMA loads: the query tile always (q_tile_tokens tokens), KV where the plan
  // allows it (every work item starts on a KV tile), and the tensor maps of the last tensors
  // run() saw (encoding is a driver call; most runs see the same KV cache).
  bool kv_tma_plan = false;
  int q_tile_tokens = 0;
  struct TmaMaps {
    bool kv_valid = false, q_valid = false;
    ops::PrefillKVTensors kv;
    ops::PrefillQTensor q;
    int q_tokens = 0, q_group = 0;  // the query box: tokens x group heads
    PrefillParams params{};  // the tensor maps as encoded
  } tma_maps;
  // The Hopper kernel: sets p's query map, and p.kv_tma (and the KV maps) where the plan and the
  // tensors allow KV by TMA, else 0 (the producer's cp.async). Other kernels: kv_tma 0.
  void set_tma(PrefillParams& p, const TensorView& q, const ops::PrefillKVTensors& kv);

  std::vector<int64_t> qo_lens, kv_lens;
  scheduler::PrefillSchedule schedule;  // reused across plans

 private:
  // Loads (JIT-compiles at first use) the plan's kernel; false where the wgmma kernel was asked
  // for and cannot run (its register count), nothing loaded.
  bool load_kernel(DType dtype, int head_dim, int rows, ops::PrefillKV kv,
                   const ops::VariantJit& variant, bool wgmma);
};

}  // namespace flashkv::detail
