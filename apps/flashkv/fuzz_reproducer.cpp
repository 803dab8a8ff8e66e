#include "fuzz_reproducer.h"

#include <exception>

#include "flashkv/error.h"

namespace flashkv::cli {
namespace {

bool can_drop_requests(const FuzzConfig& c) {
  return c.op != FuzzOp::kCascade && c.op != FuzzOp::kBlockSparse &&
         c.op != FuzzOp::kVariableBlockSparse && c.op != FuzzOp::kMerge;
}

// Smaller neighbours of c, most shrinking first.
std::vector<FuzzConfig> candidates(const FuzzConfig& c) {
  std::vector<FuzzConfig> out;
  if (can_drop_requests(c) && c.batch() > 1) {
    for (int i = 0; i < c.batch(); ++i) {
      FuzzConfig d = c;
      d.kv_lens.erase(d.kv_lens.begin() + i);
      if (!d.qo_lens.empty()) d.qo_lens.erase(d.qo_lens.begin() + i);
      out.push_back(d);
    }
  }
  for (auto lens : {&FuzzConfig::kv_lens, &FuzzConfig::qo_lens}) {
    for (size_t i = 0; i < (c.*lens).size(); ++i) {
      if ((c.*lens)[i] <= 1) continue;
      FuzzConfig d = c;
      (d.*lens)[i] /= 2;
      if (d.op == FuzzOp::kBlockSparse) {  // keep M, N multiples of R, C
        const int64_t unit = lens == &FuzzConfig::qo_lens ? d.block_r : d.block_c;
        (d.*lens)[i] = std::max<int64_t>(unit, (d.*lens)[i] / unit * unit);
      }
      out.push_back(d);
    }
  }
  auto with = [&](auto&& change) {
    FuzzConfig d = c;
    change(d);
    out.push_back(d);
  };
  if (c.cuda_graph) with([](FuzzConfig& d) { d.cuda_graph = false; });
  if (c.split != SplitMode::kAuto)
    with([](FuzzConfig& d) { d.split = SplitMode::kAuto, d.fixed_split_size = 0; });
  if (c.variant.any()) with([](FuzzConfig& d) { d.variant = {}; });
  if (c.causal) with([](FuzzConfig& d) { d.causal = false; });
  if (c.num_kv_heads > 1) with([](FuzzConfig& d) { d.num_kv_heads = 1; });
  return out;
}

}  // namespace

FuzzOutcome run_guarded(const FuzzRunner& run, const FuzzConfig& c) {
  try {
    return run(c);
  } catch (const std::exception& e) {
    FuzzOutcome o;
    o.fail(std::string("error: ") + e.what());
    return o;
  }
}

FuzzConfig shrink_failure(const FuzzRunner& run, const FuzzConfig& c, int max_runs) {
  FuzzConfig best = c;
  int runs = 0;
  for (bool smaller = true; smaller && runs < max_runs;) {
    smaller = false;
    for (const FuzzConfig& d : candidates(best)) {
      if (!config_problem(d).empty()) continue;
      if (++runs > max_runs) break;
      if (!run_guarded(run, d).pass) {
        best = d;
        smaller = true;
        break;
      }
    }
  }
  return best;
}

std::string reproduce_command(const FuzzConfig& c, bool cpu_only, const std::string& ops_arg) {
  std::string s = "flashkv fuzz --seed " + std::to_string(c.seed) + " --count 1";
  if (cpu_only) s += " --cpu-only";
  if (!ops_arg.empty()) s += " --ops " + ops_arg;
  return s;
}

nlohmann::json regression_json(const FuzzConfig& shrunk, const FuzzConfig& original, bool cpu_only,
                               const std::string& detail, const std::string& command) {
  return {{"config", to_json(shrunk)},
          {"cpu_only", cpu_only},
          {"detail", detail},
          {"reproduce", command},
          {"original", to_json(original)}};
}

}  // namespace flashkv::cli
