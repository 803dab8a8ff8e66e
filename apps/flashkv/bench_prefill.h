// flashkv bench prefill: P1-P5, A1 and S1 (causal, paged KV) through BatchPrefillPaged on the GPU,
// timed, checked against the CPU reference on sampled rows, as JSON rows (docs/benchmarks.md's
// schema).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "flashkv/dtype.h"
#include "workloads.h"

namespace flashkv::cli {

struct PrefillBenchOptions {
  std::vector<std::string> workloads;  // ids to run; empty: every prefill workload
  std::vector<std::string> shapes;     // empty: gqa-32-8 and mha-32-32
  std::vector<DType> dtypes = {DType::f16, DType::bf16};  // q and out
  DType kv_dtype = DType::f32;  // e4m3 / e5m2: an fp8 cache; any other value: the q dtype
  int head_dim = 128;
  int page_size = 16;
  int reps = 30;
  int ctas_per_sm = 2;           // BatchPrefillConfig.ctas_per_sm
  int tile_rows = 0;             // PrefillPlanOptions.tile_rows; 0: the planner's heuristic
  std::string backend = "auto";  // PrefillPlanOptions.backend: auto, mma (mma.sync) or wgmma
  std::string order = "auto";    // PrefillPlanOptions.item_order: auto, request or head
  // Workspace sizes to compare, in MB (0: workspace_bytes, which never limits splitting;
  // FlashInfer's prefill tests pass 16 MB).
  std::vector<int> workspace_mb = {0};
  std::string workloads_file;
};

// Unmasked (q, k) pairs of a causal request with queries aligned to the end of the KV: query i
// sees kv positions <= kv_len - qo_len + i.
int64_t causal_pairs(int64_t qo_len, int64_t kv_len);
// 4 * head_dim * H_qo * pairs, summed over the requests of `w` (docs/benchmarks.md).
double prefill_flops(const Workload& w, int num_qo_heads, int head_dim);

// Runs the prefill benchmark in a fixed order (workloads, then shapes, then dtypes: the card runs
// into its power cap, so the order matters) and prints one line per configuration. Every row has
// "ref_ok"; a configuration that threw is listed in `failures` ({workload, shape, dtype, error}).
nlohmann::json bench_prefill(const PrefillBenchOptions& opts, const Ceilings& ceil, Stream s,
                             nlohmann::json& failures);

// Rows whose reference check failed, plus the failures.
int count_prefill_failures(const nlohmann::json& rows, const nlohmann::json& failures);

// The prefill rows as a Markdown table, headed by the ceilings of the same run.
std::string prefill_markdown(const nlohmann::json& rows, const Ceilings& ceil,
                             const std::string& gpu, const std::string& commit);

// Without a GPU: times the CPU reference's batch_prefill_paged at a small size and checks the
// benchmark's sampled-row reference construction against the full reference. Throws
// flashkv::Error when that check fails.
nlohmann::json bench_prefill_cpu_reference();

}  // namespace flashkv::cli
