// `flashkv fuzz`: the inputs of the ops beyond plain decode / prefill (fuzz_inputs.h), drawn from a
// configuration's seed, and the two runners: on the GPU against the CPU reference
// (fuzz_gpu.cpp) and, without one, the CPU-only checks (fuzz_cpu.cpp).
#pragma once

#include <memory>
#include <vector>

#include "flashkv/block_sparse.h"
#include "flashkv/host_tensor.h"
#include "fuzz_check.h"
#include "fuzz_config.h"
#include "fuzz_inputs.h"
#include "host_inputs.h"

namespace flashkv::cli {

// Sparse decode: request i selects min(qo_lens[i], slots) distinct token slots of the cache, a
// page table over token_pages() (page size 1).
struct SparseSelection {
  std::vector<int32_t> indptr, last, ids;
  PagedKVCache host;  // token_pages() views of the cache's k, v; the selection's page table
};
SparseSelection draw_token_selection(const FuzzConfig& c, const RandomPagedCache& cache);

// The decode step: each request's new token (rows in q's dtype) at position kv_len - 1.
struct StepInputs {
  HostTensor new_k, new_v;                   // [batch, H_kv, D]
  HostTensor pos, batch_indices, positions;  // i32 [batch]: kv_len - 1, 0..batch-1, kv_len - 1
};
StepInputs make_step_inputs(const FuzzConfig& c, const AttentionInputs& in);
// rope -> append (into in.cache, which it changes) -> decode, on the reference.
void step_reference(const FuzzConfig& c, const StepInputs& st, AttentionInputs& in,
                    const TensorView& out, const TensorView& lse);

// The append: a cache over the lengths after it (kv_lens + qo_lens), the new rows and where
// they go (get_batch_indices_positions).
struct AppendInputs {
  std::unique_ptr<RandomPagedCache> cache;
  HostTensor new_k, new_v;              // [nnz, H_kv, D] in q's dtype (fp8 caches quantize)
  HostTensor batch_indices, positions;  // i32 [nnz]
};
AppendInputs make_append_inputs(const FuzzConfig& c);

// The cascade: requests in groups of share_group whose page lists start with the group's
// shared_pages pages, then their own suffix pages.
struct CascadeInputs {
  std::unique_ptr<RandomPagedCache> storage;  // the prefixes, then the suffixes, as requests
  std::vector<int32_t> indptr, ids, last, qo_indptr;
  std::vector<int64_t> rows;
  HostTensor q;
  PagedKVCache host;  // the composed page table over storage's k, v
};
CascadeInputs make_cascade_inputs(const FuzzConfig& c);
// Plain attention over the composed page table (what the cascade must equal).
void cascade_plain_reference(const FuzzConfig& c, const CascadeInputs& ci, const TensorView& out,
                             const TensorView& lse);

// Block-sparse and variable block-sparse.
struct SparseInputs {
  FuzzConfig c;
  HostTensor q, k, v;  // [M, H_qo, D], [N, H_kv, D]
  HostTensor sinks, alibi;
  std::vector<int32_t> indptr, indices;  // BSR
  std::vector<uint8_t> block_mask;       // BSR element mask, [nnz, R, C]
  std::vector<uint8_t> mask_map;         // variable: [H_kv, MB, NB]
  std::vector<int32_t> row_sz, col_sz;   // variable: [H_kv, MB], [H_kv, NB]

  BlockSparseLayout bsr_layout() const;
  VariableBlockSparseLayout variable_layout() const;
  // The options of c; keep != null: its tensors copied to the device (into keep).
  BlockSparseOptions options(std::vector<DeviceBuffer>* keep) const;
};
SparseInputs make_sparse_inputs(const FuzzConfig& c);

// Merge: v [n, S, H, D], s f32 [n, S, H] (about 1 state in 8 empty: lse -inf).
struct MergeInputs {
  HostTensor v, s;
  // S = 2: the two states as [n, H, D] / [n, H] tensors.
  void split_pair(HostTensor& va, HostTensor& sa, HostTensor& vb, HostTensor& sb) const;
};
MergeInputs make_merge_inputs(const FuzzConfig& c);

// Runs c on the GPU against the CPU reference (throws what an op throws).
FuzzOutcome run_on_gpu(const FuzzConfig& c);
// The CPU-only checks of c: plan checks accept it and refuse a broken copy, the schedule's
// invariants hold, and the reference agrees with itself through a second path.
FuzzOutcome run_on_cpu(const FuzzConfig& c);

}  // namespace flashkv::cli
