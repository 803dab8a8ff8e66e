// flashkv fuzz: randomized differential testing. Configuration seed, seed + 1, ... (fuzz_config.h)
// each run on the GPU against the CPU reference (fuzz_gpu.cpp) or, with --cpu-only or without a
// GPU, through the CPU-only checks (fuzz_cpu.cpp). One line per configuration with its seed; a
// failure is shrunk and written as a regression file with the command that redraws it. The last
// line of the output (and of --log) reads exactly "N configurations, F failed".
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "flashkv/device_errors.h"
#include "flashkv/error.h"
#include "flashkv/runtime.h"
#include "fuzz_config.h"
#include "fuzz_ops.h"
#include "fuzz_reproducer.h"
#include "json_out.h"

namespace flashkv::cli {
namespace {

struct FuzzArgs {
  uint64_t seed = 1;
  int64_t count = 1000;
  double time_limit_s = 0;  // 0: none
  std::vector<std::string> ops;
  bool cpu_only = false;
  std::string log_path, json_path;
  std::string regressions_dir = "fuzz_regressions";
  int64_t max_failures = 50;
  bool quiet = false;
  int jobs = 1;      // processes (run_sharded)
  bool echo = true;  // print to stdout (a shard only writes its log)
};

// stdout and the log file, line by line (flushed: a killed run keeps what it printed).
class Log {
 public:
  explicit Log(const std::string& path, bool echo = true) : echo_(echo) {
    if (!path.empty()) {
      file_ = std::fopen(path.c_str(), "w");
      check(file_ != nullptr, "--log: cannot open ", path, " for writing");
    }
  }
  ~Log() {
    if (file_) std::fclose(file_);
  }
  Log(const Log&) = delete;
  Log& operator=(const Log&) = delete;
  void line(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char buf[8192];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (echo_) {
      std::printf("%s\n", buf);
      std::fflush(stdout);
    }
    if (file_) {
      std::fprintf(file_, "%s\n", buf);
      std::fflush(file_);
    }
  }

 private:
  std::FILE* file_ = nullptr;
  bool echo_ = true;
};

void run_fuzz(const FuzzArgs& a) {
  std::vector<FuzzOp> ops;
  for (const auto& name : a.ops) ops.push_back(parse_fuzz_op(name));
  const std::string ops_arg = join(a.ops, " ");
  const bool gpu = !a.cpu_only && cuda_available();
  Log log(a.log_path, a.echo);
  if (gpu) {
    const DeviceInfo d = device_info();
    log.line("flashkv fuzz: seeds %llu..%llu on %s (%s), each against the CPU reference",
             static_cast<unsigned long long>(a.seed),
             static_cast<unsigned long long>(a.seed + a.count - 1), d.name.c_str(), d.arch.c_str());
    check_device_errors();  // allocates the device-error record before any graph capture
  } else {
    if (a.cpu_only)
      log.line("flashkv fuzz --cpu-only: CPU-ONLY, no GPU kernel is checked.");
    else
      log.line("No CUDA GPU (%s): CPU-ONLY, NO GPU KERNEL IS CHECKED.",
               cuda_unavailable_reason().c_str());
    log.line(
        "Runs the CPU-only subset: plan checks, scheduler invariants, and the CPU reference\n"
        "against a second path of itself; run `flashkv fuzz` on a GPU machine to check kernels.");
  }
  const DrawLimits limits{.cpu_only = !gpu};
  const FuzzRunner runner = gpu ? FuzzRunner(run_on_gpu) : FuzzRunner(run_on_cpu);

  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  int64_t done = 0, failed = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> per_op;  // op: (count, failed)
  nlohmann::json failures = nlohmann::json::array();
  std::string stopped;
  for (int64_t i = 0; i < a.count; ++i) {
    if (a.time_limit_s > 0 && elapsed() >= a.time_limit_s) {
      stopped =
          "time limit of " + std::to_string(static_cast<int64_t>(a.time_limit_s)) + " s reached";
      break;
    }
    if (failed >= a.max_failures) {
      stopped = std::to_string(failed) + " failures (--max-failures)";
      break;
    }
    const FuzzConfig c = draw_config(a.seed + static_cast<uint64_t>(i), limits, ops);
    const double start = elapsed();
    const FuzzOutcome o = run_guarded(runner, c);
    const double ms = (elapsed() - start) * 1e3;
    ++done;
    auto& op = per_op[fuzz_op_name(c.op)];
    ++op.first;
    if (o.pass) {
      if (!a.quiet)
        log.line("ok   seed %llu  %.0f ms  worst %.2f  %s", static_cast<unsigned long long>(c.seed),
                 ms, o.worst, c.str().c_str());
      continue;
    }
    ++failed;
    ++op.second;
    const std::string cmd = reproduce_command(c, !gpu, ops_arg);
    log.line("FAIL seed %llu  %.0f ms  %s", static_cast<unsigned long long>(c.seed), ms,
             c.str().c_str());
    log.line("     %s", o.detail.c_str());
    log.line("     reproduce: %s", cmd.c_str());
    // Shrinking reruns the op up to 20 times: only for the first failures, and not when the
    // time limit is near (a systematic failure must not eat the run).
    const bool shrink = failed <= 10 && (a.time_limit_s <= 0 || elapsed() < 0.8 * a.time_limit_s);
    const FuzzConfig small = shrink ? shrink_failure(runner, c, 20) : c;
    const FuzzOutcome so = shrink ? run_guarded(runner, small) : o;
    const std::string detail = so.pass ? o.detail : so.detail;
    std::string file;
    try {
      std::filesystem::create_directories(a.regressions_dir);
      file = a.regressions_dir + "/seed-" + std::to_string(c.seed) + "-" + fuzz_op_name(c.op) +
             ".json";
      std::ofstream out(file);
      out << regression_json(so.pass ? c : small, c, !gpu, detail, cmd).dump(2) << "\n";
      check(static_cast<bool>(out), "cannot write ", file);
      log.line("     shrunk to: %s", (so.pass ? c : small).str().c_str());
      log.line("     regression test written: %s (copy it into tests/fuzz_regressions/)",
               file.c_str());
    } catch (const std::exception& e) {
      log.line("     could not write the regression file: %s", e.what());
    }
    failures.push_back({{"seed", c.seed},
                        {"config", to_json(c)},
                        {"shrunk", to_json(so.pass ? c : small)},
                        {"detail", o.detail},
                        {"reproduce", cmd},
                        {"regression_file", file}});
  }
  const double total_s = elapsed();
  for (const auto& [name, counts] : per_op)
    log.line("  %-22s %6lld configurations, %lld failed", name.c_str(),
             static_cast<long long>(counts.first), static_cast<long long>(counts.second));
  const JitCounters jit = jit_counters();
  log.line(
      "seeds %llu..%llu, %.1f s (%.1f ms per configuration); %lld kernels compiled (%.1f s), "
      "%lld from the disk cache%s%s",
      static_cast<unsigned long long>(a.seed),
      static_cast<unsigned long long>(a.seed + (done > 0 ? done - 1 : 0)), total_s,
      done > 0 ? total_s * 1e3 / done : 0.0, static_cast<long long>(jit.compiles),
      jit.compile_ms / 1e3, static_cast<long long>(jit.disk_hits),
      stopped.empty() ? "" : "; stopped: ", stopped.c_str());
  if (!a.json_path.empty()) {
    nlohmann::json ops_json = nlohmann::json::object();
    for (const auto& [name, counts] : per_op)
      ops_json[name] = {{"count", counts.first}, {"failed", counts.second}};
    std::ofstream out(a.json_path);
    out << nlohmann::json{{"gpu", gpu},
                          {"device", gpu ? device_info().name : std::string("cpu")},
                          {"commit", source_commit()},
                          {"date", utc_now_iso()},
                          {"seed_first", a.seed},
                          {"seed_last", a.seed + (done > 0 ? done - 1 : 0)},
                          {"configurations", done},
                          {"failed", failed},
                          {"elapsed_s", total_s},
                          {"stopped", stopped},
                          {"jit_compiles", jit.compiles},
                          {"jit_compile_s", jit.compile_ms / 1e3},
                          {"per_op", ops_json},
                          {"failures", failures}}
               .dump(2)
        << "\n";
    check(static_cast<bool>(out), "--json: cannot write ", a.json_path);
  }
  // The summary line, exactly, last (the format for committed logs).
  log.line("%lld configurations, %lld failed", static_cast<long long>(done),
           static_cast<long long>(failed));
  if (failed > 0) throw Error(std::to_string(failed) + " fuzz configurations failed");
}

// --jobs N: N processes (fork, before anything touches CUDA), each a consecutive part of the seed
// range with its own log (LOG.shard-K, kept: a run killed from outside still leaves them) and
// JSON; then their logs in seed order, the sums, and the one summary line. NVRTC compiles are
// the bulk of a GPU run and each process compiles its own families' kernels, so N processes on
// N cores (one GPU, shared) finish N times sooner.
void run_sharded(const FuzzArgs& a) {
  const std::string base =
      !a.log_path.empty()
          ? a.log_path
          : (std::filesystem::temp_directory_path() / ("flashkv-fuzz-" + std::to_string(getpid())))
                .string();
  const int64_t per = (a.count + a.jobs - 1) / a.jobs;
  std::vector<FuzzArgs> parts;
  std::vector<pid_t> pids;
  for (int k = 0; k < a.jobs && k * per < a.count; ++k) {
    FuzzArgs p = a;
    p.jobs = 1;
    p.echo = false;
    p.seed = a.seed + static_cast<uint64_t>(k * per);
    p.count = std::min(per, a.count - k * per);
    p.log_path = base + ".shard-" + std::to_string(k);
    p.json_path = p.log_path + ".json";
    std::remove(p.json_path.c_str());
    parts.push_back(p);
    std::fflush(nullptr);
    const pid_t pid = fork();
    check(pid >= 0, "--jobs: fork failed");
    if (pid == 0) {
      int rc = 0;
      try {
        run_fuzz(p);
      } catch (const Error&) {
        rc = 1;
      } catch (...) {
        rc = 2;
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);

  Log log(a.log_path);
  int64_t done = 0, failed = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> per_op;
  nlohmann::json failures = nlohmann::json::array(), shards = nlohmann::json::array();
  for (const FuzzArgs& p : parts) {
    std::ifstream in(p.log_path);
    int64_t lines_ok = 0, lines_failed = 0;
    for (std::string line; std::getline(in, line);) {
      log.line("%s", line.c_str());
      lines_ok += line.rfind("ok   seed ", 0) == 0;
      lines_failed += line.rfind("FAIL seed ", 0) == 0;
    }
    std::ifstream js(p.json_path);
    if (js) {
      const nlohmann::json j = nlohmann::json::parse(js);
      done += j.at("configurations").get<int64_t>();
      failed += j.at("failed").get<int64_t>();
      for (const auto& [name, v] : j.at("per_op").items()) {
        per_op[name].first += v.at("count").get<int64_t>();
        per_op[name].second += v.at("failed").get<int64_t>();
      }
      for (const auto& f : j.at("failures")) failures.push_back(f);
      shards.push_back(j);
    } else {  // the shard died before its summary: count what its log shows
      log.line("shard of seeds %llu..: no summary (the process died); counted from its log",
               static_cast<unsigned long long>(p.seed));
      done += lines_ok + lines_failed;
      failed += lines_failed + 1;  // the death itself is a failure
    }
  }
  log.line("all %zu processes:", parts.size());
  for (const auto& [name, counts] : per_op)
    log.line("  %-22s %6lld configurations, %lld failed", name.c_str(),
             static_cast<long long>(counts.first), static_cast<long long>(counts.second));
  if (!a.json_path.empty()) {
    nlohmann::json ops_json = nlohmann::json::object();
    for (const auto& [name, counts] : per_op)
      ops_json[name] = {{"count", counts.first}, {"failed", counts.second}};
    std::ofstream out(a.json_path);
    out << nlohmann::json{{"commit", source_commit()},
                          {"date", utc_now_iso()},
                          {"seed_first", a.seed},
                          {"seed_last", a.seed + static_cast<uint64_t>(a.count) - 1},
                          {"jobs", parts.size()},
                          {"configurations", done},
                          {"failed", failed},
                          {"per_op", ops_json},
                          {"failures", failures},
                          {"shards", shards}}
               .dump(2)
        << "\n";
    check(static_cast<bool>(out), "--json: cannot write ", a.json_path);
  }
  if (a.log_path.empty()) {  // the shard files were temporary
    for (const FuzzArgs& p : parts) {
      std::remove(p.log_path.c_str());
      std::remove(p.json_path.c_str());
    }
  }
  log.line("%lld configurations, %lld failed", static_cast<long long>(done),
           static_cast<long long>(failed));
  if (failed > 0) throw Error(std::to_string(failed) + " fuzz configurations failed");
}

}  // namespace

void add_fuzz_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "fuzz",
      "randomized differential testing: random configurations of every op against the CPU "
      "reference (CPU-only checks without a GPU)");
  auto* a = new FuzzArgs;
  cmd->add_option("--seed", a->seed, "the first configuration's seed (then seed + 1, ...)")
      ->capture_default_str();
  cmd->add_option("--count", a->count, "configurations to run")
      ->check(int_in_range(1))
      ->capture_default_str();
  cmd->add_option("--time-limit-s", a->time_limit_s,
                  "stop drawing new configurations after this many seconds (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--ops", a->ops, "only these ops (default: all)")->check(one_of(fuzz_op_names()));
  cmd->add_flag("--cpu-only", a->cpu_only,
                "the CPU-only checks even where a GPU is present (what runs without one)");
  cmd->add_option("--log", a->log_path, "also write the output to this file")
      ->check(writable_file());
  cmd->add_option("--json", a->json_path, "write the run's summary and failures as JSON")
      ->check(writable_file());
  cmd->add_option("--regressions-dir", a->regressions_dir,
                  "where failures are written as regression files")
      ->capture_default_str();
  cmd->add_option("--max-failures", a->max_failures, "stop after this many failures")
      ->check(int_in_range(1))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", a->quiet, "print only failures and the summary");
  cmd->add_option("-j,--jobs", a->jobs,
                  "processes, each a consecutive part of the seeds (NVRTC compiles in parallel)")
      ->check(int_in_range(1, 256))
      ->capture_default_str();
  cmd->callback([a] { a->jobs > 1 ? run_sharded(*a) : run_fuzz(*a); });
}

}  // namespace flashkv::cli
