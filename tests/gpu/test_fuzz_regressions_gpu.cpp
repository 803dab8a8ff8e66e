// Replays tests/fuzz_regressions/*.json (`flashkv fuzz`'s reproducers: each a configuration that
// once failed, shrunk) on the GPU against the CPU reference, as `flashkv fuzz` ran it. Skips
// without a GPU. FLASHKV_FUZZ_REGRESSIONS_DIR (the environment) names another directory.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/gpu_util.h"
#include "fuzz_config.h"
#include "fuzz_ops.h"
#include "fuzz_reproducer.h"

namespace flashkv::test {
namespace {

class FuzzRegressionsGpu : public GpuTest {};

std::filesystem::path regressions_dir() {
  if (const char* env = std::getenv("FLASHKV_FUZZ_REGRESSIONS_DIR")) return env;
  if (std::filesystem::is_directory(FLASHKV_FUZZ_REGRESSIONS_DIR))
    return FLASHKV_FUZZ_REGRESSIONS_DIR;
  return "tests/fuzz_regressions";  // a carried binary, run from the repository root
}

TEST_F(FuzzRegressionsGpu, EveryRegressionPasses) {
  int replayed = 0;
  for (const auto& e : std::filesystem::directory_iterator(regressions_dir())) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    const nlohmann::json j = nlohmann::json::parse(in);
    const cli::FuzzConfig c = cli::config_from_json(j.at("config"));
    const bool cpu_only = j.at("cpu_only").get<bool>();
    const cli::FuzzOutcome o =
        cli::run_guarded(cpu_only ? cli::FuzzRunner(cli::run_on_cpu) : cli::run_on_gpu, c);
    EXPECT_TRUE(o.pass) << e.path() << " (" << c.str() << "): " << o.detail;
    ++replayed;
  }
  EXPECT_GT(replayed, 0) << "no regression files in " << regressions_dir();
}

}  // namespace
}  // namespace flashkv::test
