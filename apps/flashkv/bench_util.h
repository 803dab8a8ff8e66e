// Benchmark plumbing shared by the bench subcommands: device random fill, median timing with
// CUDA events, and the ceilings of ../shared/BENCHMARKS.md.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/runtime.h"

namespace flashkv::cli {

// Fills n elements of `dtype` at `ptr` (device) with uniform values in [lo, hi).
void device_fill_uniform(void* ptr, DType dtype, size_t n, uint64_t seed, float lo, float hi,
                         Stream stream = nullptr);

// Median (and min) of `reps` timed calls of `fn` after `warmup` untimed ones, CUDA events around
// each call. `before` runs outside the timed region before each call (e.g. rotate inputs).
struct Timing {
  double median_us = 0, min_us = 0;
  int reps = 0;
};
Timing time_on_stream(Stream s, const std::function<void(int rep)>& fn, int warmup = 5,
                      int reps = 30);

struct Ceilings {
  double read_tbps = 0, copy_tbps = 0, gemm_f16_tflops = 0, gemm_bf16_tflops = 0;
  nlohmann::json to_json() const;
};
// Measures the read and copy bandwidth (>= 2 GiB) and the 8192^3 cuBLAS GEMM rates.
Ceilings measure_ceilings(Stream s);

}  // namespace flashkv::cli
