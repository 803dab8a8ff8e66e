// `flashkv fuzz`: what a failure leaves behind. The failing configuration is shrunk (requests
// dropped, lengths halved, options turned off, as long as it still fails) and written as a
// regression file, tests/fuzz_regressions/*.json's format, which the GPU test
// FuzzRegressionsGpu replays; the printed command line redraws the original from its seed.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_check.h"
#include "fuzz_config.h"

namespace flashkv::cli {

// Runs one configuration: its outcome, an op's exception (flashkv::Error, a CUDA error) counted
// as a failure naming it.
using FuzzRunner = std::function<FuzzOutcome(const FuzzConfig&)>;
FuzzOutcome run_guarded(const FuzzRunner& run, const FuzzConfig& c);

// The smallest configuration found, within `max_runs` runs, that still fails: c itself when
// nothing smaller does.
FuzzConfig shrink_failure(const FuzzRunner& run, const FuzzConfig& c, int max_runs = 40);

// `flashkv fuzz --seed S --count 1 [--cpu-only] [--ops ...]`: redraws configuration S.
std::string reproduce_command(const FuzzConfig& c, bool cpu_only, const std::string& ops_arg);

// The regression file: {"config": ..., "cpu_only": ..., "detail": ..., "reproduce": ...,
// "original": the unshrunk configuration}.
nlohmann::json regression_json(const FuzzConfig& shrunk, const FuzzConfig& original, bool cpu_only,
                               const std::string& detail, const std::string& command);

}  // namespace flashkv::cli
