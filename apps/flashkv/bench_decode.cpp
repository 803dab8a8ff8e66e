#include "bench_decode.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>

#include "decode_timeline.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/reference.h"

namespace flashkv::cli {
namespace {

struct DecodeSetup {
  int B, Hq;
  DType q_dtype = DType::f16;  // q and out; kv.dtype is the cache's (an fp8 type, or the same)
  BenchPagedKV kv;
  DeviceBuffer q, out;
  size_t bytes_moved = 0;
};

void build(DecodeSetup& st, uint64_t seed, Stream s) {
  st.kv.build(rotation_copies(st.kv.kv_bytes()), seed, s);
  const DType dt = st.q_dtype;
  const size_t q_elems = size_t(st.B) * st.Hq * st.kv.head_dim;
  st.q = DeviceBuffer(std::max<size_t>(q_elems * dtype_size(dt) * st.kv.copies, 16));
  device_fill_uniform(st.q.data(), dt, q_elems * st.kv.copies, seed + 2, -1, 1, s);
  st.out = DeviceBuffer(std::max<size_t>(q_elems * dtype_size(dt), 16));
  st.bytes_moved = 2 * q_elems * dtype_size(dt) + st.kv.kv_bytes();
}

// Up to 4 sampled requests of copy 0 against the CPU reference, by the tolerance rule of the
// tests (check_reference).
RefCheck check_sampled(const DecodeSetup& st, float sm_scale) {
  std::vector<int> reqs = {0, st.B / 3, (2 * st.B) / 3, st.B - 1};
  std::sort(reqs.begin(), reqs.end());
  reqs.erase(std::unique(reqs.begin(), reqs.end()), reqs.end());
  const BenchPagedKV& kv = st.kv;
  const DType dt = st.q_dtype;
  const int D = kv.head_dim;
  const size_t row_bytes = size_t(st.Hq) * D * dtype_size(dt);
  std::vector<double> got_all, ref_all;
  for (int r : reqs) {
    const int np = kv.indptr[r + 1] - kv.indptr[r];
    const int64_t pages = std::max(np, 1);
    const std::vector<int64_t> shape =
        kv.layout == KVLayout::NHD ? std::vector<int64_t>{pages, kv.page_size, kv.num_kv_heads, D}
                                   : std::vector<int64_t>{pages, kv.num_kv_heads, kv.page_size, D};
    HostTensor k(kv.dtype, shape), v(kv.dtype, shape);
    kv.pages_to_host(r, k.data(), v.data());
    HostTensor q(dt, {1, st.Hq, D}), out(dt, {1, st.Hq, D});
    st.q.copy_to_host(q.data(), row_bytes, r * row_bytes);
    st.out.copy_to_host(out.data(), row_bytes, r * row_bytes);
    const HostTensor ref = reference_decode_request(k, v, kv.last[r], q, sm_scale, kv.layout);
    for (double x : out.to_doubles()) got_all.push_back(x);
    for (double x : ref.to_doubles()) ref_all.push_back(x);
  }
  return check_reference(got_all, ref_all, dt);
}

}  // namespace

nlohmann::json bench_decode(const DecodeBenchOptions& o, const Ceilings& ceil, Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  const auto wls =
      o.workloads_file.empty() ? standard_workloads() : read_workloads(o.workloads_file);
  const auto shapes = standard_shapes();
  uint64_t seed = 1;
  nlohmann::json timelines = nlohmann::json::array();
  if (o.head_dim != 128) std::printf("head_dim %d\n", o.head_dim);
  std::printf("%-4s %-10s %-5s %10s %8s %7s %9s %s\n", "wl", "shape", "dtype", "time_us", "TB/s",
              "%read", "rel_err", "plan (plan() time; run()'s host time, not timed on the GPU)");
  // The settings to sweep: every (alpha, min_chunk, balanced bound, tail, stages, warps)
  // combination of the scheduler's options and the tensor-core kernel's shape.
  struct SchedulerSetting {
    double alpha;
    int min_chunk;
    bool balance;
    bool tail;
    int stages;
    int warps;
    int workspace_mb;
  };
  std::vector<SchedulerSetting> settings;
  for (double alpha : o.alphas)
    for (int min_chunk : o.min_chunks)
      for (int balance : o.balance)
        for (int tail : o.tail)
          for (int stages : o.stages)
            for (int warps : o.warps)
              for (int mb : o.workspace_mb)
                settings.push_back({alpha, min_chunk, balance != 0, tail != 0, stages, warps, mb});
  for (const auto& w : wls) {
    if (w.kind != "decode" || !selected(o.workloads, w.id)) continue;
    for (const auto& sh : shapes) {
      if (!selected(o.shapes, sh.name)) continue;
      for (DType dt : o.dtypes) {
        DecodeSetup st{static_cast<int>(w.lens.size()), sh.num_qo_heads, dt};
        st.kv.num_kv_heads = sh.num_kv_heads;
        st.kv.head_dim = o.head_dim;
        st.kv.page_size = o.page_size;
        st.kv.layout = o.layout;
        st.kv.dtype = is_fp8_dtype(o.kv_dtype) ? o.kv_dtype : dt;
        st.kv.lens = w.lens;
        build(st, seed++, s);
        for (const auto& [alpha, min_chunk, balance, tail, stages, warps, mb] : settings) {
          const int D = o.head_dim;
          BatchDecodeConfig cfg{st.B, st.Hq, D};
          cfg.ctas_per_sm = o.ctas_per_sm;
          DeviceBuffer ws(mb > 0 ? size_t(mb) << 20 : BatchDecode::workspace_bytes(cfg));
          BatchDecode dec(cfg, ws.data(), ws.size());
          DecodePlanOptions po;
          po.work_item_cost_tokens = alpha;
          po.min_chunk_tokens = min_chunk;
          po.balance_chunk_bound = balance;
          po.balance_tail = tail;
          po.tc_stages = stages;
          po.tc_warps = warps;
          po.backend = o.backend == "cuda" ? DecodeBackend::kCudaCores
                       : o.backend == "tc" ? DecodeBackend::kTensorCores
                                           : DecodeBackend::kAuto;
          dec.plan({.kv_indptr = st.kv.indptr.data(),
                    .kv_last_page_len = st.kv.last.data(),
                    .batch_size = st.B,
                    .page_size = o.page_size},
                   {.num_qo_heads = st.Hq,
                    .num_kv_heads = sh.num_kv_heads,
                    .head_dim = D,
                    .q_dtype = dt,
                    .kv_dtype = st.kv.dtype,
                    .o_dtype = dt},
                   po, s);
          std::vector<PagedKVCache> caches;
          for (int c = 0; c < st.kv.copies; ++c) caches.push_back(st.kv.device_view(c));
          const size_t q_bytes = size_t(st.B) * st.Hq * D * dtype_size(dt);
          auto qview = [&](int c) {
            return TensorView(static_cast<char*>(st.q.data()) + c * q_bytes, dt, {st.B, st.Hq, D},
                              Device::cuda(0));
          };
          const TensorView out(st.out.data(), dt, {st.B, st.Hq, D}, Device::cuda(0));
          const Timing t = time_on_stream(
              s,
              [&](int rep) {
                const int c = rep % st.kv.copies;
                dec.run(qview(c), caches[c], out, TensorView(), s);
              },
              5, o.reps);
          // Re-run copy 0 for the check.
          dec.run(qview(0), caches[0], out, TensorView(), s);
          synchronize(s);
          const RefCheck ref = check_sampled(st, 0.f);
          const double err = ref.err;
          const auto info = dec.plan_info();
          if (!o.timeline_file.empty()) {
            nlohmann::json tl = capture_decode_timeline(
                info.kernel_id, static_cast<unsigned>(info.num_ctas),
                [&] { dec.run(qview(0), caches[0], out, TensorView(), s); }, s);
            tl["workload"] = w.id;
            tl["shape"] = sh.name;
            tl["dtype"] = dtype_name(dt);
            timelines.push_back(std::move(tl));
          }
          const double tbps = st.bytes_moved / (t.median_us * 1e-6) / 1e12;
          std::string sweep;
          if (alpha > 0 || min_chunk > 0) {
            sweep +=
                " alpha " + std::to_string(int(alpha)) + " min_chunk " + std::to_string(min_chunk);
          }
          if (o.layout != KVLayout::NHD) sweep += std::string(" ") + kv_layout_name(o.layout);
          if (!balance) sweep += " plain-bound";
          if (tail) sweep += " tail-balanced";
          if (stages > 0 || warps > 0)
            sweep += " stages " + std::to_string(stages) + " warps " + std::to_string(warps);
          if (mb > 0) {
            sweep += " ws " + std::to_string(mb) + " MB" +
                     (info.split_limited ? " (limited: " : " (") +
                     std::to_string(info.num_partial_states) + " partial states)";
          }
          std::printf(
              "%-4s %-10s %-5s %10.2f %8.3f %6.1f%% %9.2e%s %s %dx%dw %d items/%d split, plan %.1f "
              "us, "
              "run host %.1f us%s%s\n",
              w.id.c_str(), sh.name.c_str(), dtype_name(dt), t.median_us, tbps,
              100 * tbps / ceil.read_tbps, err, ref.pass ? "" : " FAIL",
              info.tensor_cores ? "tc" : "cc", info.ctas_per_sm, info.warps, info.num_work_items,
              info.num_split_tiles, info.plan_us, t.host_us, sweep.c_str(),
              st.kv.dtype != dt ? (std::string(" kv ") + dtype_name(st.kv.dtype)).c_str() : "");
          std::fflush(stdout);
          rows.push_back({{"workload", w.id},
                          {"shape", sh.name},
                          {"dtype", dtype_name(dt)},
                          {"kv_dtype", dtype_name(st.kv.dtype)},
                          {"system", "flashkv"},
                          {"time_us", t.median_us},
                          {"min_us", t.min_us},
                          {"run_host_us", t.host_us},
                          {"tbps", tbps},
                          {"tflops", nullptr},
                          {"pct_read_ceiling", 100 * tbps / ceil.read_tbps},
                          {"rel_err", err},
                          {"ref_ok", ref.pass},
                          {"ref_bound", ref.bound},
                          {"bytes", st.bytes_moved},
                          {"copies_rotated", st.kv.copies},
                          {"layout", kv_layout_name(o.layout)},
                          {"page_size", o.page_size},
                          {"work_items", info.num_work_items},
                          {"split_tiles", info.num_split_tiles},
                          {"partial_states", info.num_partial_states},
                          {"workspace_mb", mb},  // 0: workspace_bytes (never limits splitting)
                          {"workspace_bytes", ws.size()},
                          {"split_limited", info.split_limited},
                          {"kernel", info.tensor_cores ? "tensor-cores" : "cuda-cores"},
                          {"work_item_cost_tokens", alpha},
                          {"min_chunk_tokens", min_chunk},
                          {"balanced_chunk_bound", balance},
                          {"balance_tail", tail},
                          {"tc_stages", stages},
                          {"tc_warps", warps},
                          {"ctas_per_sm", info.ctas_per_sm},
                          {"warps", info.warps}});
        }
      }
    }
  }
  if (!o.timeline_file.empty()) {
    std::ofstream f(o.timeline_file);
    check(static_cast<bool>(f), "--decode-timeline: cannot open ", o.timeline_file);
    f << timelines.dump() << "\n";
    std::printf("wrote %s\n", o.timeline_file.c_str());
  }
  return rows;
}

nlohmann::json bench_plan_time(Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  for (int B : {1, 64, 256, 1024}) {
    BatchDecodeConfig cfg{B, 32, 128};
    DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
    BatchDecode dec(cfg, ws.data(), ws.size());
    std::vector<int32_t> indptr{0}, last;
    std::mt19937 rng(B);
    for (int i = 0; i < B; ++i) {
      const int len = 1024 + rng() % 2048;
      indptr.push_back(indptr.back() + (len + 15) / 16);
      last.push_back(len - ((len + 15) / 16 - 1) * 16);
    }
    std::vector<double> us, sched_us;
    for (int rep = 0; rep < 50; ++rep) {
      dec.plan({.kv_indptr = indptr.data(),
                .kv_last_page_len = last.data(),
                .batch_size = B,
                .page_size = 16},
               {.num_qo_heads = 32,
                .num_kv_heads = 8,
                .head_dim = 128,
                .q_dtype = DType::f16,
                .kv_dtype = DType::f16,
                .o_dtype = DType::f16},
               {}, s);
      us.push_back(dec.plan_info().plan_us);
      sched_us.push_back(dec.plan_info().schedule_us);
    }
    std::sort(us.begin(), us.end());
    std::sort(sched_us.begin(), sched_us.end());
    const double sched = sched_us[sched_us.size() / 2];
    std::printf("plan() batch %4d: median %.1f us (min %.1f), of which the scheduler %.1f us\n", B,
                us[us.size() / 2], us.front(), sched);
    rows.push_back({{"batch", B},
                    {"plan_us_median", us[us.size() / 2]},
                    {"plan_us_min", us.front()},
                    {"schedule_us_median", sched}});
  }
  synchronize(s);
  return rows;
}

}  // namespace flashkv::cli
