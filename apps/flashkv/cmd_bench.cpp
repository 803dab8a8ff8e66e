// flashkv bench: ceilings, merge throughput, decode and prefill workloads on the GPU; without a
// GPU, says so and times the CPU reference at a small size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "bench_cascade.h"
#include "bench_decode.h"
#include "bench_prefill.h"
#include "bench_sparse.h"
#include "bench_step.h"
#include "bench_util.h"
#include "bench_variants.h"
#include "cli_checks.h"
#include "commands.h"
#include "decode_timeline.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/merge.h"
#include "flashkv/prefill.h"
#include "flashkv/reference.h"
#include "flashkv/runtime.h"
#include "json_out.h"
#include "sparse_workloads.h"
#include "workloads.h"

namespace flashkv::cli {
namespace {

struct BenchArgs {
  std::vector<std::string> kinds = {"ceilings", "merge", "decode"};
  std::string json, md;
  // The selection both decode and prefill take.
  std::vector<std::string> workloads, shapes, dtypes = {"f16", "bf16"};
  std::string kv_dtype;  // "": the q dtype; e4m3 / e5m2: an fp8 cache
  std::string workloads_file;
  int reps = 30, page_size = 16;
  int head_dim = 128;   // decode and prefill
  int ctas_per_sm = 0;  // 0: each library's default (decode: auto; prefill: 2)
  DecodeBenchOptions decode;
  PrefillBenchOptions prefill;
  StepBenchOptions step;
  CascadeBenchOptions cascade;
  VariantsBenchOptions variants;
  SparseBenchOptions sparse;
  // bench variants runs f16 and GQA 32/8 alone unless --dtypes / --shapes were given.
  bool dtypes_given = false, shapes_given = false;
  bool plan_time = true;
  bool has(const char* kind) const {
    return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
  }
  // Copies the shared selection into the decode and prefill options.
  void resolve() {
    std::vector<DType> dts;
    for (const auto& d : dtypes) dts.push_back(parse_dtype(d));
    decode.workloads = prefill.workloads = workloads;
    decode.shapes = prefill.shapes = shapes;
    decode.dtypes = prefill.dtypes = dts;
    const DType kv = kv_dtype.empty() ? DType::f32 : parse_dtype(kv_dtype);
    decode.kv_dtype = prefill.kv_dtype = step.kv_dtype = kv;
    decode.workloads_file = prefill.workloads_file = workloads_file;
    decode.reps = prefill.reps = reps;
    decode.page_size = prefill.page_size = page_size;
    decode.head_dim = prefill.head_dim = head_dim;
    decode.ctas_per_sm = ctas_per_sm;
    prefill.ctas_per_sm = ctas_per_sm > 0 ? ctas_per_sm : BatchPrefillConfig{}.ctas_per_sm;
    step.dtype = dts.empty() ? DType::f16 : dts.front();
    step.reps = reps;
    step.page_size = page_size;
    cascade.dtype = step.dtype;
    cascade.reps = reps;
    cascade.page_size = page_size;
    variants.workloads = workloads;
    if (shapes_given) variants.shapes = shapes;
    if (dtypes_given) variants.dtypes = dts;
    variants.workloads_file = workloads_file;
    variants.reps = reps;
    variants.page_size = page_size;
    variants.ctas_per_sm = ctas_per_sm;  // decode as given; prefill: see bench_variants_prefill
    sparse.workloads = workloads;
    sparse.reps = reps;
    sparse.ctas_per_sm = ctas_per_sm;
  }
};

nlohmann::json bench_merge(const Ceilings& ceil, Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  // merge_states of 8 split states per row: the contraction split-KV needs.
  for (DType dt : {DType::f16, DType::bf16}) {
    const int64_t n = 16384, S = 8, H = 32, D = 128;
    DeviceBuffer v(n * S * H * D * dtype_size(dt)), st(n * S * H * 4),
        vo(n * H * D * dtype_size(dt)), so(n * H * 4);
    device_fill_uniform(v.data(), dt, n * S * H * D, 3, -1, 1, s);
    device_fill_uniform(st.data(), DType::f32, n * S * H, 4, -5, 5, s);
    const Device g = Device::cuda(0);
    const TensorView tv(v.data(), dt, {n, S, H, D}, g), ts(st.data(), DType::f32, {n, S, H}, g);
    const TensorView tvo(vo.data(), dt, {n, H, D}, g), tso(so.data(), DType::f32, {n, H}, g);
    const Timing t = time_on_stream(s, [&](int) { merge_states(tv, ts, tvo, tso, s); });
    const double bytes = double(v.size() + st.size() + vo.size() + so.size());
    const double tbps = bytes / (t.median_us * 1e-6) / 1e12;
    std::printf(
        "merge_states %s n=%lld S=%lld H=%lld D=%lld: %.1f us, %.2f TB/s (%.0f%% of read)\n",
        dtype_name(dt), (long long)n, (long long)S, (long long)H, (long long)D, t.median_us, tbps,
        100 * tbps / ceil.read_tbps);
    rows.push_back({{"op", "merge_states"},
                    {"dtype", dtype_name(dt)},
                    {"time_us", t.median_us},
                    {"tbps", tbps}});
  }
  return rows;
}

nlohmann::json bench_decode_cpu_reference() {
  std::printf(
      "Running the CPU reference backend at a small size instead (batch decode, GQA 32/8, D "
      "128).\n");
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t len : {256, 1024}) {
    const int64_t B = 4, Hq = 32, Hkv = 8, D = 128, page = 16;
    const int64_t pages = B * ((len + page - 1) / page);
    HostTensor k(DType::f16, {pages, page, Hkv, D}), v(DType::f16, {pages, page, Hkv, D});
    k.fill_random(1);
    v.fill_random(2);
    HostTensor q(DType::f16, {B, Hq, D}), out(DType::f16, {B, Hq, D}), lse(DType::f32, {B, Hq});
    q.fill_random(3);
    std::vector<int32_t> indptr{0}, idx, last;
    for (int64_t i = 0; i < B; ++i) {
      indptr.push_back(static_cast<int32_t>(indptr.back() + pages / B));
      last.push_back(static_cast<int32_t>(len - (pages / B - 1) * page));
    }
    for (int64_t p = 0; p < pages; ++p) idx.push_back(static_cast<int32_t>(p));
    PagedKVCache c;
    c.k = k.view();
    c.v = v.view();
    c.indptr = TensorView(indptr.data(), DType::i32, {B + 1});
    c.indices = TensorView(idx.data(), DType::i32, {pages});
    c.last_page_len = TensorView(last.data(), DType::i32, {B});
    const auto t0 = std::chrono::steady_clock::now();
    reference::batch_decode(q.view(), c, out.view(), lse.view());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("reference batch_decode batch %lld kv %lld: %.1f ms\n", (long long)B,
                (long long)len, ms);
    rows.push_back(
        {{"op", "reference_batch_decode"}, {"batch", B}, {"kv_len", len}, {"time_ms", ms}});
  }
  return rows;
}

// --workloads names ids the selected workload set has (the standard one, or --workloads-file's),
// or PV / PW (bench variants' prefill part). Checked before anything runs, GPU or not.
void check_workload_ids(const BenchArgs& a) {
  if (a.workloads.empty()) return;
  std::vector<std::string> known;
  for (const auto& w :
       a.workloads_file.empty() ? standard_workloads() : read_workloads(a.workloads_file))
    known.push_back(w.id);
  known.push_back("PV");
  known.push_back("PW");
  for (const auto& w : block_workloads()) known.push_back(w.id);
  for (const auto& w : select_workloads()) known.push_back(w.id);
  for (const auto& id : a.workloads)
    check(std::find(known.begin(), known.end(), id) != known.end(), "--workloads: unknown id '", id,
          "' (expected some of ", join(known), a.workloads_file.empty() ? "" : " from ",
          a.workloads_file, ")");
}

void bench_cpu_only(const BenchArgs& a) {
  const std::string why = cuda_unavailable_reason();
  // Kinds that time GPU kernels and have no CPU form: asked for by name, they fail rather than
  // time something else.
  std::vector<std::string> gpu_only;
  for (const char* k : {"step", "cascade", "variants", "sparse"})
    if (a.has(k)) gpu_only.push_back(k);
  check(gpu_only.empty(), "bench ", join(gpu_only, " "), " needs a CUDA GPU (none here: ", why,
        "); it times GPU kernels and has no CPU form. Without a GPU, `flashkv bench decode` and "
        "`flashkv bench prefill` time the CPU reference at a small size.");
  check(a.has("decode") || a.has("prefill"), "bench ", join(a.kinds, " "),
        " needs a CUDA GPU (none here: ", why,
        "). Without a GPU, `flashkv bench decode` and `flashkv bench prefill` time the CPU "
        "reference at a small size.");
  std::printf("No CUDA GPU: %s\n", why.c_str());
  for (const char* k : {"ceilings", "merge"})
    if (a.has(k)) std::printf("bench %s measures the GPU: skipped.\n", k);
  nlohmann::json rows = nlohmann::json::array();
  if (a.has("decode")) rows = bench_decode_cpu_reference();
  if (a.has("prefill")) {
    std::printf(
        "Running the CPU reference backend at a small size instead (batch prefill, causal, GQA "
        "32/8, D 128).\n");
    for (const auto& r : bench_prefill_cpu_reference()) rows.push_back(r);
  }
  write_json_if(a.json, {{"gpu", nullptr},
                         {"commit", source_commit()},
                         {"date", utc_now_iso()},
                         {"cpu_reference", rows}});
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("bench", "ceilings and the standard workloads (docs/benchmarks.md)");
  auto* a = new BenchArgs;
  cmd->add_option(
         "kinds", a->kinds,
         "what to run: ceilings, merge, decode (D1-D6), prefill (P1-P5, A1, S1; causal), step "
         "(32-layer decode step, RoPE + append + attention, fused vs unfused), cascade (shared "
         "prompt: MultiLevelCascade vs plain decode), variants "
         "(built-in variants and fused vs unfused RoPE on D1-D6, variants on a 4 x 2048 "
         "prefill (PV), their JIT cost; f16 "
         "GQA 32/8 unless --dtypes/--shapes), sparse (B1-B4: block-sparse prefill and sparse-KV "
         "decode beside dense flashkv; f16 GQA 32/8)")
      ->check(one_of(
          {"ceilings", "merge", "decode", "prefill", "step", "cascade", "variants", "sparse"}))
      ->capture_default_str();
  cmd->add_option("--json", a->json,
                  "write results (the schema of docs/benchmarks.md) to this file")
      ->check(writable_file());
  cmd->add_option("--md", a->md, "write the prefill results as a Markdown table to this file")
      ->check(writable_file());
  cmd->add_option("--workloads", a->workloads,
                  "workload ids: D1-D6, P1-P5, A1, S1, PV / PW (bench variants' prefill), B1-B4 "
                  "(bench sparse) or those of "
                  "--workloads-file (default: all of the kind)");
  cmd->add_option("--workloads-file", a->workloads_file,
                  "workloads from `python -m flashkv.bench.peers --emit-workloads`")
      ->check(CLI::ExistingFile);
  std::vector<std::string> shape_names;
  for (const auto& sh : standard_shapes()) shape_names.push_back(sh.name);
  auto* shapes_opt = cmd->add_option("--shapes", a->shapes, "gqa-32-8, mha-32-32 (default: both)")
                         ->check(one_of(shape_names));
  auto* dtypes_opt = cmd->add_option("--dtypes", a->dtypes, "f16, bf16")
                         ->check(one_of({"f16", "bf16"}))
                         ->capture_default_str();
  cmd->add_option("--kv-dtype", a->kv_dtype,
                  "the KV cache's dtype for decode, prefill and step: e4m3 or e5m2 (an fp8 cache "
                  "under each --dtypes query dtype; default: the query dtype)")
      ->check(one_of({"e4m3", "e5m2"}));
  cmd->add_option("--reps", a->reps, "timed repetitions (median reported)")
      ->check(int_in_range(1))
      ->capture_default_str();
  cmd->add_option("--head-dim", a->head_dim, "bench decode and prefill: head_dim (64, 128, 256)")
      ->check(CLI::IsMember({64, 128, 256}))
      ->capture_default_str();
  cmd->add_option("--page-size", a->page_size, "page size (tokens per page)")
      ->check(int_in_range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option_function<std::string>(
      "--layout", [a](const std::string& l) { a->decode.layout = parse_kv_layout(l); },
      "bench decode: KV page layout, NHD or HND (default NHD)");
  cmd->add_option("--ctas-per-sm", a->ctas_per_sm,
                  "persistent CTAs per SM, decode and prefill (0: the libraries' defaults)")
      ->check(int_in_range(0, 64))
      ->capture_default_str();
  cmd->add_option_function<std::vector<int>>(
         "--workspace-mb",
         [a](const std::vector<int>& v) { a->decode.workspace_mb = a->prefill.workspace_mb = v; },
         "decode and prefill: caller workspace sizes to compare, MB (0: workspace_bytes, never "
         "limiting split-KV; FlashInfer's tests use 32 for decode, 16 for prefill)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option(
         "--prefill-backend", a->prefill.backend,
         "prefill kernel: auto (wgmma on sm_90a where it applies), mma (mma.sync) or wgmma")
      ->check(CLI::IsMember({"auto", "mma", "wgmma"}))
      ->capture_default_str();
  cmd->add_option("--prefill-order", a->prefill.order,
                  "prefill work-item order per CTA: auto, request (request-major) or head "
                  "(head-major: the CTAs work through the KV heads together)")
      ->check(CLI::IsMember({"auto", "request", "head"}))
      ->capture_default_str();
  cmd->add_option("--prefill-tile-rows", a->prefill.tile_rows,
                  "prefill query-tile rows (16, 32, 64, 128; 0: the planner's heuristic)")
      ->check(CLI::IsMember({0, 16, 32, 64, 128}))
      ->capture_default_str();
  cmd->add_option("--decode-backend", a->decode.backend,
                  "auto, cuda (CUDA cores) or tc (tensor cores)")
      ->check(CLI::IsMember({"auto", "cuda", "tc"}))
      ->capture_default_str();
  cmd->add_option("--decode-alphas", a->decode.alphas,
                  "decode scheduler sweep: work-item cost in KV tokens (0: default)")
      ->capture_default_str();
  cmd->add_option("--decode-min-chunks", a->decode.min_chunks,
                  "decode scheduler sweep: shortest split chunk in tokens (0: default)")
      ->capture_default_str();
  cmd->add_option("--decode-balance", a->decode.balance,
                  "decode scheduler sweep: 1 balanced chunk bound, 0 the paper's plain L_kv")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  cmd->add_option("--decode-tail", a->decode.tail,
                  "decode scheduler sweep: 1 balanced last round (balance_tail), 0 the greedy's")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  cmd->add_option("--decode-stages", a->decode.stages,
                  "decode sweep: tensor-core kernel pipeline stages (0: default, 2-8)")
      ->capture_default_str();
  cmd->add_option("--decode-warps", a->decode.warps,
                  "decode sweep: tensor-core kernel warps per CTA (0: default, 2, 4, 8)")
      ->capture_default_str();
  cmd->add_option("--decode-timeline", a->decode.timeline_file,
                  "profiling build of the decode kernels: per-CTA phase timestamps of every "
                  "configuration into this JSON file (kernels/attention/work_timeline.cuh)")
      ->check(writable_file());
  cmd->add_option("--step-batches", a->step.batches, "bench step: batch sizes")
      ->check(int_in_range(1))
      ->capture_default_str();
  cmd->add_option("--step-kv", a->step.kv_lens, "bench step: KV lengths")
      ->check(int_in_range(1))
      ->capture_default_str();
  cmd->add_option("--step-workloads", a->step.workloads,
                  "bench step: decode workloads (D1-D6) to run as 32-layer steps as well");
  cmd->add_flag("!--no-plan-time", a->plan_time, "skip the plan() CPU-time measurement");
  cmd->callback([a, shapes_opt, dtypes_opt] {
    check_workload_ids(*a);
    if (!cuda_available()) return bench_cpu_only(*a);
    a->shapes_given = shapes_opt->count() > 0;
    a->dtypes_given = dtypes_opt->count() > 0;
    a->resolve();
    if (!a->decode.timeline_file.empty()) enable_decode_timeline();
    const DeviceInfo info = device_info(0);
    std::printf("GPU: %s (%s, %d SMs)\n", info.name.c_str(), info.arch.c_str(), info.sm_count);
    Stream s = create_stream();
    nlohmann::json j = {{"gpu", info.name}, {"commit", source_commit()}, {"date", utc_now_iso()}};
    const Ceilings ceil = measure_ceilings(s);
    std::printf(
        "ceilings: read %.2f TB/s, copy %.2f TB/s, GEMM f16 %.0f TFLOP/s, bf16 %.0f TFLOP/s\n",
        ceil.read_tbps, ceil.copy_tbps, ceil.gemm_f16_tflops, ceil.gemm_bf16_tflops);
    j["ceilings"] = ceil.to_json();
    j["results"] = nlohmann::json::array();
    if (a->has("merge")) j["merge"] = bench_merge(ceil, s);
    int decode_failed = 0;
    if (a->has("decode")) {
      j["results"] = bench_decode(a->decode, ceil, s);
      for (const auto& r : j["results"]) decode_failed += !r.value("ref_ok", false);
      if (a->plan_time) j["plan_time"] = bench_plan_time(s);
    }
    if (a->has("step")) j["step"] = bench_step(a->step, ceil, s);
    int cascade_failed = 0;
    if (a->has("cascade")) {
      j["cascade"] = bench_cascade(a->cascade, ceil, s);
      cascade_failed = count_cascade_failures(j["cascade"]);
    }
    int variants_failed = 0;
    if (a->has("variants")) {
      j["variants"] = bench_variants(a->variants, ceil, s);
      variants_failed = count_variant_failures(j["variants"]);
    }
    int prefill_failed = 0;
    if (a->has("prefill")) {
      nlohmann::json failures = nlohmann::json::array();
      const nlohmann::json rows = bench_prefill(a->prefill, ceil, s, failures);
      for (const auto& r : rows) j["results"].push_back(r);
      j["failures"] = failures;
      prefill_failed = count_prefill_failures(rows, failures);
      if (!a->md.empty()) {
        std::ofstream md(a->md);
        check(static_cast<bool>(md), "--md: cannot open ", a->md, " for writing");
        md << prefill_markdown(rows, ceil, info.name, j["commit"].get<std::string>());
        std::printf("wrote %s\n", a->md.c_str());
      }
    }
    int sparse_failed = 0;
    if (a->has("sparse")) {
      j["sparse"] = bench_sparse(a->sparse, ceil, s);
      for (const auto& r : j["sparse"]) sparse_failed += r.contains("ref_ok") && !r["ref_ok"];
    }
    const JitCounters jc = jit_counters();
    j["jit"] = {
        {"compiles", jc.compiles}, {"compile_ms", jc.compile_ms}, {"disk_hits", jc.disk_hits}};
    destroy_stream(s);
    write_json_if(a->json, j);
    // After the results are written: a wrong answer fails the command, as verify does.
    check(decode_failed == 0, decode_failed,
          " decode configurations failed the reference check (FAIL above)");
    check(prefill_failed == 0, prefill_failed,
          " prefill configurations failed the reference check or did not run (see above)");
    check(variants_failed == 0, variants_failed,
          " variant configurations failed the reference check or did not run (ERROR above)");
    check(sparse_failed == 0, sparse_failed,
          " sparse configurations failed the reference check (FAIL above)");
    check(cascade_failed == 0, cascade_failed,
          " cascade configurations chose the slower path by more than 3 % or failed the reference "
          "check (FAIL above)");
  });
}

}  // namespace flashkv::cli
