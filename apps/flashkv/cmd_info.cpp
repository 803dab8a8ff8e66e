// flashkv info: the GPU, the driver and NVRTC, and the kernel cache.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "flashkv/runtime.h"
#include "json_out.h"

namespace flashkv::cli {

static uint64_t dir_size(const std::string& dir, int* files) {
  namespace fs = std::filesystem;
  uint64_t total = 0;
  *files = 0;
  std::error_code ec;
  if (dir.empty() || !fs::exists(dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) {
      total += e.file_size(ec);
      ++*files;
    }
  }
  return total;
}

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "GPU, driver, NVRTC and kernel-cache information");
  auto* json_path = new std::string;
  cmd->add_option("--json", *json_path, "also write the information as JSON to this file");
  cmd->callback([json_path] {
    nlohmann::json j;
    j["nvrtc_version"] = nvrtc_version();
    j["nvrtc_library"] = nvrtc_library();
    j["cache_dir"] = kernel_cache_dir();
    int files = 0;
    j["cache_bytes"] = dir_size(kernel_cache_dir(), &files);
    j["cache_entries"] = files;
    j["cuda_available"] = cuda_available();
    std::printf("NVRTC           %s (%s)\n", nvrtc_version().c_str(), nvrtc_library().c_str());
    std::printf("kernel cache    %s (%d entries, %.1f MiB)\n",
                kernel_cache_dir().empty() ? "(memory only)" : kernel_cache_dir().c_str(), files,
                j["cache_bytes"].get<uint64_t>() / 1048576.0);
    if (!cuda_available()) {
      std::printf("GPU             none (%s)\n", cuda_unavailable_reason().c_str());
      std::printf("                flashkv runs the CPU reference backend on host tensors\n");
    } else {
      for (int d = 0; d < cuda_device_count(); ++d) {
        const DeviceInfo info = device_info(d);
        std::printf("GPU %d           %s, %s, %d SMs, %.1f GiB, L2 %.0f MiB, smem/block %d KiB\n",
                    d, info.name.c_str(), info.arch.c_str(), info.sm_count,
                    info.total_memory / 1073741824.0, info.l2_bytes / 1048576.0,
                    info.max_smem_per_block / 1024);
        std::printf("driver          %d.%d\n", info.driver_version / 1000,
                    (info.driver_version % 1000) / 10);
        j["devices"].push_back({{"name", info.name},
                                {"arch", info.arch},
                                {"sm_count", info.sm_count},
                                {"total_memory", info.total_memory},
                                {"l2_bytes", info.l2_bytes},
                                {"driver_version", info.driver_version}});
      }
    }
    write_json_if(*json_path, j);
  });
}

}  // namespace flashkv::cli
