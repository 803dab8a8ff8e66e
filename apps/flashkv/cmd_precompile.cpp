// flashkv precompile: fill the JIT cache ahead of time (no GPU needed), -j kernels at a time.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli_checks.h"
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
  o->jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto* dtypes = new std::vector<std::string>{"f16", "bf16"};
  auto* kv_dtypes = new std::vector<std::string>;
  auto* json_path = new std::string;
  auto* list = new bool(false);
  cmd->add_flag("--list", *list,
                "print the ids of the kernels it would compile, one a line, and "
                "compile nothing");
  cmd->add_option("--json", *json_path, "also write the compiled kernels and times as JSON")
      ->check(writable_file());
  cmd->add_option("-j,--jobs", o->jobs, "kernels compiled at once (default: all cores)")
      ->check(int_in_range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--arch", o->arch, "NVRTC target architecture")->capture_default_str();
  cmd->add_option("--ops", o->ops, "ops to compile (kv: RoPE, KV append)")
      ->check(one_of(precompile_ops()))
      ->capture_default_str();
  cmd->add_option("--dtypes", *dtypes, "q/kv dtypes")
      ->check(one_of({"f16", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--kv-dtypes", *kv_dtypes,
                  "the caches' dtypes (default: each q dtype's own): e4m3 / e5m2 for fp8 caches, "
                  "f16 / bf16 where they are the q dtype")
      ->check(one_of({"f16", "bf16", "e4m3", "e5m2"}));
  cmd->add_option("--head-dims", o->head_dims, "head dims")
      ->check(int_in_range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--group-sizes", o->group_sizes, "query heads per KV head")
      ->check(int_in_range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--page-sizes", o->page_sizes, "page sizes")
      ->check(int_in_range(1, 1 << 16))
      ->capture_default_str();
  cmd->callback([o, dtypes, kv_dtypes, json_path, list] {
    o->dtypes.clear();
    for (const auto& d : *dtypes) o->dtypes.push_back(parse_dtype(d));
    for (const auto& d : *kv_dtypes) o->kv_dtypes.push_back(parse_dtype(d));
    if (*list) {
      for (const std::string& id : precompile_kernel_ids(*o)) std::printf("%s\n", id.c_str());
      return;
    }
    // The progress line below replaces the cache's per-compile log lines (which would interleave
    // across threads); FLASHKV_QUIET=0 in the environment keeps them.
    setenv("FLASHKV_QUIET", "1", /*overwrite=*/0);
    std::printf("precompiling for %s into %s, %d at a time\n", o->arch.c_str(),
                kernel_cache_dir().empty() ? "(memory only: no writable cache dir)"
                                           : kernel_cache_dir().c_str(),
                o->jobs);
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    const auto kernels = precompile(*o, [](const PrecompiledKernel& k, size_t done, size_t total) {
      std::printf("[%zu/%zu] %-48s %s %6.1f s\n", done, total, k.id.c_str(),
                  k.compiled ? "compiled" : "cached  ", k.ms / 1000.0);
      std::fflush(stdout);
    });
    const double wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int cold = 0;
    double ms = 0;
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& k : kernels) {
      cold += k.compiled;
      ms += k.ms;
      rows.push_back({{"kernel", k.id}, {"compiled", k.compiled}, {"ms", k.ms}});
    }
    std::printf("%d compiled, %d cached, %.1f s (%.1f s of compiles, %d at a time)\n", cold,
                static_cast<int>(kernels.size()) - cold, wall_s, ms / 1000.0, o->jobs);
    write_json_if(*json_path, {{"arch", o->arch}, {"jobs", o->jobs}, {"kernels", rows}});
  });
}

}  // namespace flashkv::cli
