// flashkv precompile: fill the JIT cache ahead of time (no GPU needed).
#include <cstdio>

#include "commands.h"
#include "flashkv/jit.h"
#include "flashkv/runtime.h"
#include "json_out.h"

namespace flashkv::cli {

void add_precompile_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "precompile",
      "compile kernels into the disk cache ($FLASHKV_CACHE_DIR); works without a GPU");
  auto* o = new PrecompileOptions;
  auto* dtypes = new std::vector<std::string>{"f16", "bf16"};
  auto* json_path = new std::string;
  cmd->add_option("--json", *json_path, "also write the compiled kernels and times as JSON");
  cmd->add_option("--arch", o->arch, "NVRTC target architecture")->capture_default_str();
  cmd->add_option("--ops", o->ops, "ops to compile: merge, decode, prefill, kv (RoPE, append), cascade")->capture_default_str();
  cmd->add_option("--dtypes", *dtypes, "q/kv dtypes")->capture_default_str();
  cmd->add_option("--head-dims", o->head_dims, "head dims")->capture_default_str();
  cmd->add_option("--group-sizes", o->group_sizes, "query heads per KV head")
      ->capture_default_str();
  cmd->add_option("--page-sizes", o->page_sizes, "page sizes")->capture_default_str();
  cmd->callback([o, dtypes, json_path] {
    o->dtypes.clear();
    for (const auto& d : *dtypes) o->dtypes.push_back(parse_dtype(d));
    std::printf("precompiling for %s into %s\n", o->arch.c_str(),
                kernel_cache_dir().empty() ? "(memory only: no writable cache dir)"
                                           : kernel_cache_dir().c_str());
    int cold = 0;
    double ms = 0;
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& k : precompile(*o)) {
      std::printf("  %-40s %s %8.0f ms\n", k.id.c_str(), k.compiled ? "compiled" : "cached  ",
                  k.ms);
      cold += k.compiled;
      ms += k.ms;
      rows.push_back({{"kernel", k.id}, {"compiled", k.compiled}, {"ms", k.ms}});
    }
    std::printf("%d compiled, %.1f s\n", cold, ms / 1000.0);
    write_json_if(*json_path, {{"arch", o->arch}, {"kernels", rows}});
  });
}

}  // namespace flashkv::cli
