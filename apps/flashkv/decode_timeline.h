// `flashkv bench decode --decode-timeline FILE`: per-CTA timestamps of one decode run, from a
// profiling build of the decode kernels (kernels/attention/work_timeline.cuh), to see
// where a kernel's time goes: ramp to the first KV tile, streaming, the tail of split tiles.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "flashkv/dtype.h"
#include "flashkv/runtime.h"

namespace flashkv::cli {

// Makes every later decode kernel compile of this process a profiling build. Call before any
// decode kernel loads.
void enable_decode_timeline();

// Runs `run` once with the decode kernel `kernel_id` (BatchDecode::PlanInfo::kernel_id: loaded by
// the plan `run` runs) recording into a buffer of `grid` CTAs; returns
// {"kernel": id, "ctas": [[stamps in ns, relative to the earliest CTA start; -1 unset]...]}.
nlohmann::json capture_decode_timeline(const std::string& kernel_id, unsigned grid,
                                       const std::function<void()>& run, Stream s);

}  // namespace flashkv::cli
