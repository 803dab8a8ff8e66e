// flashkv bench step: the per-token attention work of a 32-layer Llama-3.1-8B decode step (RoPE,
// KV append, decode per layer), unfused (3 launches per layer) vs the fused decode step (1), eager
// and inside a CUDA graph; checked (fused == unfused bitwise, and against the CPU reference). The
// graph modes run with programmatic dependent launch (the default) and without it ("-nopdl"), and
// "decode+graph" is 32 plain decode calls in one graph: the per-layer time of decode as engines
// run it, against the read ceiling.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"

namespace flashkv::cli {

struct StepBenchOptions {
  std::vector<int> batches = {1, 16, 64};
  std::vector<int64_t> kv_lens = {1024, 8192};
  // Decode workloads (D1-D6, workloads.cpp) run as well, with their own KV lengths.
  std::vector<std::string> workloads;
  DType dtype = DType::f16;
  DType kv_dtype = DType::f32;  // e4m3 / e5m2: an fp8 cache; any other value: `dtype`
  int page_size = 16;
  int reps = 30;
};

// Runs every (batch, kv_len) and every workload; prints a line per mode; returns the result rows.
nlohmann::json bench_step(const StepBenchOptions& opts, const Ceilings& ceil, Stream s);

}  // namespace flashkv::cli
