// `flashkv fuzz`: one randomized configuration of one op, drawn from a seed alone, so that
// `flashkv fuzz --seed S --count 1` redraws configuration S of any run. A configuration is plain
// data (JSON both ways): tests/fuzz_regressions/ holds the ones that once failed.
//
// What is drawn (fuzz_config.cpp says why each range is what it is): the op; q / out dtype
// (f16, bf16) and the KV dtype (the q dtype, e4m3 or e5m2 where the op takes fp8 KV); head_dim
// 64 / 128 / 256; GQA groups 1, 4, 7, 8, 16 over 1 (MQA), 2 or 4 KV heads; page sizes 1, 3, 16,
// 64, 128; NHD / HND; per-request lengths with empty and length-1 requests and an occasional
// long one; causal; the built-in variants (window, soft-cap, ALiBi, sinks, sigmoid, custom mask,
// fused RoPE) where the op takes them; split-KV automatic, disabled or forced (fixed_split_size);
// a CUDA graph capture of run() where the op supports it; with or without LSE; fp8 scales.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/paged_kv.h"
#include "flashkv/variants.h"

namespace flashkv::cli {

enum class FuzzOp : uint8_t {
  kDecode,               // BatchDecode::run
  kDecodeStep,           // BatchDecode::run_step (RoPE + append + decode, one launch)
  kSparseDecode,         // BatchDecode over token_pages(): a selection of single tokens
  kPrefillPaged,         // BatchPrefillPaged
  kPrefillRagged,        // BatchPrefillRagged
  kAppend,               // append_paged_kv_cache
  kCascade,              // MultiLevelCascade over requests that share prefix pages
  kBlockSparse,          // BlockSparseAttention
  kVariableBlockSparse,  // VariableBlockSparseAttention
  kMerge,                // merge_state / merge_state_in_place / merge_states
};
inline constexpr FuzzOp kAllFuzzOps[] = {
    FuzzOp::kDecode,       FuzzOp::kDecodeStep,    FuzzOp::kSparseDecode,
    FuzzOp::kPrefillPaged, FuzzOp::kPrefillRagged, FuzzOp::kAppend,
    FuzzOp::kCascade,      FuzzOp::kBlockSparse,   FuzzOp::kVariableBlockSparse,
    FuzzOp::kMerge};
// "decode", "decode_step", "sparse_decode", "prefill_paged", "prefill_ragged", "append",
// "cascade", "block_sparse", "variable_block_sparse", "merge".
const char* fuzz_op_name(FuzzOp op);
FuzzOp parse_fuzz_op(const std::string& name);  // throws flashkv::Error naming the choices
std::vector<std::string> fuzz_op_names();

enum class SplitMode : uint8_t { kAuto, kDisabled, kFixed };
const char* split_mode_name(SplitMode m);  // "auto", "disabled", "fixed"

// The built-ins of variants.h a configuration turns on (their tensors are drawn from the seed
// when the inputs are built).
struct FuzzVariant {
  int window_left = -1;  // -1: no window
  float soft_cap = 0.0f;
  bool alibi = false;
  bool sinks = false;
  bool sigmoid = false;
  bool custom_mask = false;
  RopeMode rope = RopeMode::none;
  bool any() const {
    return window_left >= 0 || soft_cap > 0 || alibi || sinks || sigmoid || custom_mask ||
           rope != RopeMode::none;
  }
  std::string str() const;  // "window 7 + softcap 30", "" when none
};

struct FuzzConfig {
  uint64_t seed = 0;
  FuzzOp op = FuzzOp::kDecode;
  DType dtype = DType::f16;     // q and out (merge: the states' dtype)
  DType kv_dtype = DType::f16;  // dtype, or e4m3 / e5m2
  int head_dim = 128;
  int num_kv_heads = 1;  // merge: the heads H
  int group = 1;         // query heads per KV head
  int page_size = 16;
  KVLayout layout = KVLayout::NHD;
  // Per request. Decode, decode step: kv_lens (qo_lens empty; the step's kv_len counts the new
  // token). Sparse decode: kv_lens of the cache, qo_lens[i] tokens request i selects. Prefill,
  // block-sparse: qo_lens[i] query rows over kv_lens[i] keys (block-sparse: one "request", M =
  // qo_lens[0], N = kv_lens[0]). Append: kv_lens the lengths before the append, qo_lens the new
  // tokens. Cascade: kv_lens each request's own suffix, qo_lens its query rows (empty: decode).
  // Merge: qo_lens[0] rows of kv_lens[0] states each.
  std::vector<int64_t> qo_lens, kv_lens;
  bool causal = false;
  FuzzVariant variant;
  SplitMode split = SplitMode::kAuto;
  int fixed_split_size = 0;  // SplitMode::kFixed
  bool cuda_graph = false;   // capture run() in a CUDA graph, replay it once
  // Kernel and scheduler options. Decode: backend 0 auto, 1 CUDA cores, 2 tensor cores (where
  // their accumulators fit), balance_tail, check_page_ids (the kernel's device page-id check).
  // Prefill: backend 0 auto, 1 mma.sync; tile_rows 0 (the heuristic) or 16..128 (>= group);
  // item_order 0 auto, 1 request-major, 2 head-major.
  int backend = 0;
  bool balance_tail = false;
  bool check_page_ids = false;
  int tile_rows = 0;
  int item_order = 0;
  // Decode and prefill: programmatic dependent launch (the default) or ordinary stream order;
  // the workspace: 100 workspace_bytes (splitting never limited), else min_workspace_bytes plus
  // this percentage of the rest (plans fit their splits into it; not with a fixed split).
  bool pdl = true;
  int workspace_pct = 100;
  bool with_lse = true;
  float k_scale = 1.0f, v_scale = 1.0f;  // fp8 KV: the dequantization scales
  // Cascade: requests in groups of `share_group` that share `shared_pages` prefix pages.
  int shared_pages = 0, share_group = 1;
  bool cascade_always = false;  // CascadePlanOptions::Use::kAlways (else kAuto)
  // Block-sparse: R x C blocks; variable block-sparse: MB x NB blocks per KV head. Each block is
  // kept with probability density_pct / 100 (a block row may keep none: empty rows are part of
  // the test); an element mask inside the blocks (block-sparse only).
  int block_r = 1, block_c = 1, density_pct = 50;
  bool element_mask = false;
  // Decode step: DecodeStepOptions::rope (none, llama, llama31).
  RopeMode step_rope = RopeMode::none;
  // Merge: 0 merge_states over kv_lens[0] states, 1 merge_state, 2 merge_state_in_place (2
  // states); some states are empty (lse -inf).
  int merge_kind = 0;

  int num_qo_heads() const { return num_kv_heads * group; }
  int batch() const { return static_cast<int>(kv_lens.size()); }
  std::string str() const;  // one line: op, shapes, options
};

nlohmann::json to_json(const FuzzConfig& c);
FuzzConfig config_from_json(const nlohmann::json& j);  // throws flashkv::Error on a bad field

// How large a configuration may be: the GPU run checks against a double-precision CPU
// reference, so shapes stay small enough for it (a few ms each on 16 cores) with an occasional
// long request; the CPU-only run (CI: 2 000 configurations in under a minute on 2 cores) draws
// smaller ones still.
struct DrawLimits {
  bool cpu_only = false;
};

// Families. Each (dtype, KV dtype, head_dim, GQA group, page size, variant) is its own set of
// NVRTC kernels (docs/design.md "Kernel keys"), compiled on first use at about a second each:
// drawn per seed, a 10 000-configuration run would need ~3 600 compiles, an hour of NVRTC. So the
// configurations of 2^kFuzzFamilyBits consecutive seeds (a family) share those choices (dtype,
// KV dtype, head_dim, group, KV heads, page size) and vary everything else (op, lengths, layout,
// variant, split, graph, ...): a 10 000-seed run covers ~40 families, ~1 700 compiles. Other seed
// ranges draw other families.
inline constexpr int kFuzzFamilyBits = 8;
uint64_t fuzz_family(uint64_t seed);

// Configuration `seed`: the same seed always gives the same configuration (SplitMix64 only, no
// std:: distributions, so on every platform). `ops` (non-empty) restricts the op.
FuzzConfig draw_config(uint64_t seed, const DrawLimits& limits,
                       const std::vector<FuzzOp>& ops = {});

// "" when `c` is a configuration the op accepts (what draw_config promises and a regression
// file must satisfy), else why not.
std::string config_problem(const FuzzConfig& c);

}  // namespace flashkv::cli
