// flashkv bench sparse: B1-B4 (sparse_workloads.h) on the GPU beside dense flashkv, timed and
// checked against a double-precision host reference on sampled rows, as JSON rows. The torch
// peers (FlexAttention, SDPA with a dense mask) run in `python -m flashkv.bench --kinds sparse`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"

namespace flashkv::cli {

struct SparseBenchOptions {
  std::vector<std::string> workloads;  // B1-B4; empty: all
  int reps = 30;
  int ctas_per_sm = 0;  // B1 / B2: BlockSparseConfig.ctas_per_sm (0: the prefill default)
};

// Rows {workload, kind "sparse", system (flashkv, flashkv-hnd, flashkv-dense, ...), time_us,
// tflops (B1 / B2, the visible pairs) or tbps (B3 / B4, the selected bytes), rel_err, ref_ok}.
nlohmann::json bench_sparse(const SparseBenchOptions& opts, const Ceilings& ceil, Stream s);

}  // namespace flashkv::cli
