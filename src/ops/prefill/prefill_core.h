// The plan/run machinery BatchPrefillPaged and BatchPrefillRagged share: validation, the
// scheduler, the plan copy into the workspace, the CUDA-graph bookkeeping, and the launch. The two
// wrappers differ only in where KV comes from (a page table or kv_indptr over contiguous rows).
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

#include "attention/prefill/prefill_key.h"
#include "attention/prefill/prefill_params.cuh"
#include "flashkv/plan_checks.h"
#include "flashkv/prefill.h"
#include "ops/common/kernel_memo.h"
#include "ops/common/plan_lifecycle.h"
#include "ops/common/run_checks.h"
#include "ops/prefill/prefill_kernel.h"
#include "ops/prefill/prefill_tma.h"
#include "ops/prefill/prefill_workspace.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::detail {

struct PrefillCore {
  PrefillCore(const BatchPrefillConfig& cfg, void* workspace, size_t bytes, bool paged,
              const char* name);

  // batch.kv_last_page_len and batch.page_size are the paged wrapper's (null / 0 for ragged KV).
  void plan(const PrefillBatch& batch, const AttentionShape& shape, const PrefillPlanOptions& opts,
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
  std::string arch;         // the device's compile target ("sm_90a"), read at the first plan()
  int max_smem = 0;         // and its opt-in shared memory per block, bytes
  ops::PlanLifecycle life;  // plan/run guards and the plan's copy into the workspace

  // The plan in force.
  int batch = 0, page_size = 0;
  AttentionShape shape;
  PrefillPlanOptions opts;      // opts.causal: the effective mask (the variant's causal included)
  ops::VariantJit variant_jit;  // the plan's variant (its arguments: opts.variant)
  VariantArgsBlock variant_args{};  // opts.variant's arguments, packed at plan()
  float sm_scale = 0.f;
  int64_t nnz_qo = 0;
  int64_t nnz_kv = 0;  // paged: kv_indptr[batch] page ids; ragged: KV rows
  PageIdMax page_ids;  // paged, with PrefillPlanOptions::kv_indices_host: the largest page id
  std::string kv_indices_name = "kv_indices";  // how run() names them (PrefillPlanOptions::names)
  unsigned grid = 0;
  PrefillPlanInfo info;

  // The kernel of the plan in force (memoized: every step usually keeps it). The Hopper kernel's
  // functions: [0] KV by TMA, [1] KV by the producer's cp.async.
  ops::KernelMemo<PrefillKernelKey> kernel;
  // What the loaded kernel allows, found when it is loaded: CTAs per SM (persistent CTAs, as many
  // as fit, up to the config's), and for the Hopper kernel whether its register split holds.
  struct KernelFit {
    std::string id;
    int ctas_per_sm = 0;
    bool runnable = false;
  } kernel_fit;

  // What a CUDA graph captured by run() holds fixed: later plans must fit it.
  struct Captured : ops::CapturedRun {
    bool causal = false;
    int num_qo_heads = 0, num_kv_heads = 0, page_size = 0;
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
    PrefillParams params{};         // the tensor maps as encoded
  } tma_maps;
  // The Hopper kernel: sets p's query map, and p.kv_tma (and the KV maps) where the plan and the
  // tensors allow KV by TMA, else 0 (the producer's cp.async). Other kernels: kv_tma 0.
  void set_tma(PrefillParams& p, const TensorView& q, const ops::PrefillKVTensors& kv);

  std::vector<int64_t> qo_lens, kv_lens;
  scheduler::PrefillSchedule schedule;  // reused across plans

 private:
  // plan()'s steps, in order.
  void check_arguments(const PrefillBatch& b, const AttentionShape& sh,
                       const PrefillPlanOptions& o);
  // The kernel: the query tile (the paper's heuristic unless the caller fixes it), mma.sync or
  // wgmma, and the variant (plain attention unless opts.variant says otherwise), JIT-compiled here
  // (first use only) so run() never compiles.
  void select_kernel(const PrefillBatch& b, const AttentionShape& sh, const PrefillPlanOptions& o,
                     ops::VariantJit& vj);
  // Loads `key`'s kernel and what it allows; false where the wgmma kernel was asked for and
  // cannot run (its register count).
  bool load_kernel(const PrefillKernelKey& key);
  void check_captured_graph_fits(const AttentionShape& sh, int64_t qo_total, int64_t kv_total,
                                 bool causal, float scale, int page_sz,
                                 const VariantArgsBlock& args) const;
  // The schedule (the op's part of each item filled in); whether every item starts on a KV tile.
  bool prefer_head_major(const AttentionShape& sh) const;
  bool schedule_work(const PrefillBatch& b, const AttentionShape& sh, const PrefillPlanOptions& o,
                     bool causal, int rows);
};

}  // namespace flashkv::detail
