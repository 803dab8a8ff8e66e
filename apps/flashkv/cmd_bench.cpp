// flashkv bench: ceilings, merge throughput and decode workloads on the GPU; without a GPU, says
// so and times the CPU reference at a small size.
#include <chrono>
#include <cstdio>

#include "bench_decode.h"
#include "bench_util.h"
#include "commands.h"
#include "flashkv/host_tensor.h"
#include "flashkv/merge.h"
#include "flashkv/reference.h"
#include "flashkv/runtime.h"
#include "json_out.h"

namespace flashkv::cli {
namespace {

struct BenchArgs {
  std::vector<std::string> kinds = {"ceilings", "merge", "decode"};
  std::string json;
  DecodeBenchOptions decode;
  std::vector<std::string> dtypes = {"f16", "bf16"};
  bool plan_time = true;
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

void bench_cpu_only(const BenchArgs& a) {
  std::printf("No CUDA GPU: %s\n", cuda_unavailable_reason().c_str());
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
  write_json_if(a.json, {{"gpu", nullptr},
                         {"commit", source_commit()},
                         {"date", utc_now_iso()},
                         {"cpu_reference", rows}});
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("bench", "ceilings and the standard workloads (../shared/BENCHMARKS.md)");
  auto* a = new BenchArgs;
  cmd->add_option("kinds", a->kinds, "what to run: ceilings, merge, decode")->capture_default_str();
  cmd->add_option("--json", a->json, "write results (BENCHMARKS.md schema) to this file");
  cmd->add_option("--workloads", a->decode.workloads, "workload ids (default: all of the kind)");
  cmd->add_option("--workloads-file", a->decode.workloads_file,
                  "workloads from peers_torch.py --emit-workloads");
  cmd->add_option("--shapes", a->decode.shapes, "gqa-32-8, mha-32-32 (default: both)");
  cmd->add_option("--dtypes", a->dtypes, "f16, bf16")->capture_default_str();
  cmd->add_option("--reps", a->decode.reps, "timed repetitions (median reported)")
      ->capture_default_str();
  cmd->add_option("--page-size", a->decode.page_size, "page size")->capture_default_str();
  cmd->add_option("--ctas-per-sm", a->decode.ctas_per_sm, "persistent decode CTAs per SM")
      ->capture_default_str();
  cmd->add_option("--decode-backend", a->decode.backend,
                  "auto, cuda (CUDA cores) or tc (tensor cores)")
      ->check(CLI::IsMember({"auto", "cuda", "tc"}))
      ->capture_default_str();
  cmd->add_flag("!--no-plan-time", a->plan_time, "skip the plan() CPU-time measurement");
  cmd->callback([a] {
    if (!cuda_available()) return bench_cpu_only(*a);
    a->decode.dtypes.clear();
    for (const auto& d : a->dtypes) a->decode.dtypes.push_back(parse_dtype(d));
    const DeviceInfo info = device_info(0);
    std::printf("GPU: %s (%s, %d SMs)\n", info.name.c_str(), info.arch.c_str(), info.sm_count);
    Stream s = create_stream();
    auto has = [&](const char* k) {
      return std::find(a->kinds.begin(), a->kinds.end(), k) != a->kinds.end();
    };
    nlohmann::json j = {{"gpu", info.name}, {"commit", source_commit()}, {"date", utc_now_iso()}};
    const Ceilings ceil = measure_ceilings(s);
    std::printf(
        "ceilings: read %.2f TB/s, copy %.2f TB/s, GEMM f16 %.0f TFLOP/s, bf16 %.0f TFLOP/s\n",
        ceil.read_tbps, ceil.copy_tbps, ceil.gemm_f16_tflops, ceil.gemm_bf16_tflops);
    j["ceilings"] = ceil.to_json();
    j["results"] = nlohmann::json::array();
    if (has("merge")) j["merge"] = bench_merge(ceil, s);
    if (has("decode")) {
      j["results"] = bench_decode(a->decode, ceil, s);
      if (a->plan_time) j["plan_time"] = bench_plan_time(s);
    }
    const JitCounters jc = jit_counters();
    j["jit"] = {
        {"compiles", jc.compiles}, {"compile_ms", jc.compile_ms}, {"disk_hits", jc.disk_hits}};
    destroy_stream(s);
    write_json_if(a->json, j);
  });
}

}  // namespace flashkv::cli
