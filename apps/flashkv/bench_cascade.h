// flashkv bench cascade: parallel generation, n requests sharing a prompt, each with its own
// suffix; one decode step, MultiLevelCascade (forced on) vs plain batch decode, both checked
// against the CPU reference; bandwidth counts the prefix bytes once.
//
// For each configuration it reports the two measured times, the cost model's two estimates
// (scheduler/cascade_cost.h) and the automatic choice, and it fails (after all configurations,
// naming each one) where the automatic choice is more than `auto_tolerance` slower than the faster
// of the two measured paths (scheduler::check_cascade_choice) or an output misses the reference.
// The default grid is the one the cost model is fitted on (bench/results/cascade-2026-12-02-*).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"

namespace flashkv::cli {

// One block of the grid: a head shape and a suffix range, over n x prompt.
struct CascadeBenchCase {
  std::string shape;  // its name in the output, e.g. "gqa-32-8-d128"
  int num_qo_heads = 32, num_kv_heads = 8, head_dim = 128;
  // Request r of n has its own suffix_tokens(r, n) tokens after the shared prompt: evenly spread
  // over [suffix_min, suffix_max] (r = 0 the shortest, r = n - 1 the longest; n = 1: suffix_min).
  int suffix_min = 128, suffix_max = 1024;
  std::vector<int> groups;       // n: requests sharing the prompt
  std::vector<int64_t> prompts;  // shared prompt tokens
  int64_t suffix_tokens(int r, int n) const {
    return suffix_min + int64_t{suffix_max - suffix_min} * r / (n > 1 ? n - 1 : 1);
  }
};

// GQA 32/8 d128 over n in {1..64} x prompts {1k..32k} with suffixes 128-1024, 16-128 and
// 2048-4096; MHA 32/32 d128 and GQA 32/8 d64 / d256 on parts of it.
std::vector<CascadeBenchCase> default_cascade_grid();

struct CascadeBenchOptions {
  std::vector<CascadeBenchCase> cases = default_cascade_grid();
  DType dtype = DType::f16;
  int page_size = 16;
  int reps = 30;
  double auto_tolerance = 0.03;  // auto may be this much slower than the faster path
};

// Rows (one per configuration) as described above. Throws flashkv::Error after the last
// configuration if any failed; the rows are then printed as JSON first (the caller's --json is
// not written when the command fails).
nlohmann::json bench_cascade(const CascadeBenchOptions& opts, const Ceilings& ceil, Stream s);
// Rows where auto was more than 3 % slower than the faster path, or an answer was wrong (the
// command fails on them, after writing its JSON).
int count_cascade_failures(const nlohmann::json& rows);

}  // namespace flashkv::cli
