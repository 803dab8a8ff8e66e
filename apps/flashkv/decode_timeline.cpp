#include "decode_timeline.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "flashkv/error.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc_compiler.h"

namespace flashkv::cli {
namespace {
constexpr int kEvents = 61;  // kWorkTimelineEvents in kernels/attention/work_timeline.cuh
}

void enable_decode_timeline() { runtime::add_process_nvrtc_option("-DFLASHKV_DECODE_TIMELINE"); }

nlohmann::json capture_decode_timeline(const std::string& kernel_id, unsigned grid,
                                       const std::function<void()>& run, Stream s) {
  using runtime::check_cu;
  using runtime::driver;
  // The plan loaded the module; nothing compiles here.
  const runtime::LoadedModule& mod =
      runtime::KernelCache::instance().module(kernel_id, 0, [&]() -> runtime::CompileRequest {
        fail("decode timeline: kernel ", kernel_id, " is not loaded (plan() first)");
      });
  CUdeviceptr global = 0;
  size_t global_bytes = 0;
  check_cu(
      driver().cuModuleGetGlobal(&global, &global_bytes, mod.module, "flashkv_decode_timeline"),
      "cuModuleGetGlobal(flashkv_decode_timeline): is this a --decode-timeline build?");
  const size_t n = size_t(grid) * kEvents;
  DeviceBuffer stamps(n * sizeof(uint64_t));
  stamps.fill_bytes(0);
  const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(stamps.data());
  check_cu(driver().cuMemcpyHtoD(global, &ptr, sizeof(ptr)), "set flashkv_decode_timeline");
  synchronize(s);
  run();
  synchronize(s);
  const CUdeviceptr null = 0;
  check_cu(driver().cuMemcpyHtoD(global, &null, sizeof(null)), "reset flashkv_decode_timeline");
  std::vector<uint64_t> host(n);
  stamps.copy_to_host(host.data(), n * sizeof(uint64_t));
  uint64_t t0 = std::numeric_limits<uint64_t>::max();
  for (unsigned c = 0; c < grid; ++c) {
    if (host[size_t(c) * kEvents] != 0) t0 = std::min(t0, host[size_t(c) * kEvents]);
  }
  nlohmann::json ctas = nlohmann::json::array();
  for (unsigned c = 0; c < grid; ++c) {
    nlohmann::json row = nlohmann::json::array();
    for (int e = 0; e < kEvents; ++e) {
      const uint64_t t = host[size_t(c) * kEvents + e];
      row.push_back(t == 0 ? int64_t{-1} : static_cast<int64_t>(t - t0));
    }
    ctas.push_back(std::move(row));
  }
  return {{"kernel", kernel_id}, {"ctas", std::move(ctas)}};
}

}  // namespace flashkv::cli
