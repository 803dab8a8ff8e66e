// flashkv bench cascade: parallel generation, n requests sharing a prompt (1k / 8k / 32k tokens)
// with unique suffixes of 128-1024 tokens; one decode step, MultiLevelCascade vs plain batch
// decode, both checked against the CPU reference; bandwidth counts the prefix bytes once.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "bench_util.h"

namespace flashkv::cli {

struct CascadeBenchOptions {
  std::vector<int> groups = {1, 4, 16, 64};
  std::vector<int64_t> prompts = {1024, 8192, 32768};
  DType dtype = DType::f16;
  int page_size = 16;
  int reps = 30;
};

nlohmann::json bench_cascade(const CascadeBenchOptions& opts, const Ceilings& ceil, Stream s);

}  // namespace flashkv::cli
