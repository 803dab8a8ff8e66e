// flashkv bench decode: D1-D6 on the GPU, timed, checked against the reference, as JSON rows.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "flashkv/decode.h"
#include "workloads.h"

namespace flashkv::cli {

struct DecodeBenchOptions {
  std::vector<std::string> workloads;  // ids to run; empty: every decode workload
  std::vector<std::string> shapes;     // empty: gqa-32-8 and mha-32-32
  std::vector<DType> dtypes = {DType::f16, DType::bf16};  // q and out
  // The cache's dtype: e4m3 / e5m2 (an fp8 cache under each q dtype); any other value: q's.
  DType kv_dtype = DType::f32;
  int head_dim = 128;
  int page_size = 16;
  KVLayout layout = KVLayout::NHD;
  int reps = 30;
  int ctas_per_sm = 0;                 // BatchDecodeConfig.ctas_per_sm (0: auto)
  std::string backend = "auto";        // auto, cuda, tc
  std::vector<double> alphas = {0.0};  // DecodePlanOptions.work_item_cost_tokens (0: default)
  std::vector<int> min_chunks = {0};   // DecodePlanOptions.min_chunk_tokens (0: default)
  std::vector<int> balance = {1};      // DecodePlanOptions.balance_chunk_bound (1 / 0)
  // DecodePlanOptions.balance_tail (1 / 0); default: the library's default.
  std::vector<int> tail = {DecodePlanOptions{}.balance_tail ? 1 : 0};
  // DecodePlanOptions.tc_stages / tc_warps to sweep (0: the defaults).
  std::vector<int> stages = {0};
  std::vector<int> warps = {0};
  // Workspace sizes to compare, in MB (0: BatchDecode::workspace_bytes, which never limits
  // splitting; FlashInfer users pass one fixed buffer, 32 MB in its decode tests).
  std::vector<int> workspace_mb = {0};
  std::string workloads_file;
  std::string timeline_file;  // non-empty: per-CTA phase timestamps of each configuration (JSON)
};

// Runs the decode benchmark; prints one line per configuration; returns the result rows.
nlohmann::json bench_decode(const DecodeBenchOptions& opts, const Ceilings& ceil, Stream s);

// plan() CPU time at batch 1, 64, 256, 1024 (kv 2048 each, GQA 32/8): rows {batch, plan_us}.
nlohmann::json bench_plan_time(Stream s);

}  // namespace flashkv::cli
