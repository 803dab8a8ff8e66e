#include "bench_prefill.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/prefill.h"
#include "flashkv/reference.h"

namespace flashkv::cli {
namespace {

constexpr int kPlanReps = 20;  // plan() CPU time: median of this many re-plans after the first

// A batch as the reference check sees it. The accessors copy copy 0 of the inputs and the
// output to the host, wherever they live (device buffers in the benchmark, host tensors in the
// CPU self-check).
struct CheckSource {
  int Hq = 0, Hkv = 0, D = 0, page = 0;
  DType dt = DType::f16;     // q and out
  DType kv_dt = DType::f16;  // the cache
  std::vector<int64_t> qo_lens, kv_lens;
  std::vector<int32_t> qo_indptr, kv_indptr;           // rows; pages
  std::function<void(int r, void* k, void* v)> pages;  // request r's pages, in order
  // q_rows / out_rows(first_row, n, dst): rows [first_row, first_row + n) of q / out.
  std::function<void(int64_t, int64_t, void*)> q_rows, out_rows;
};

// Query rows of one request that the check recomputes, as runs [begin, end): the first two, two
// drawn at random, and the last four (those that see the most keys).
std::vector<std::pair<int64_t, int64_t>> sample_runs(int64_t qo_len, std::mt19937_64& rng) {
  std::set<int64_t> rows = {0, 1};
  for (int i = 0; i < 2; ++i) rows.insert(static_cast<int64_t>(rng() % qo_len));
  for (int64_t i = qo_len - 4; i < qo_len; ++i) rows.insert(i);
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t r : rows) {
    if (r < 0 || r >= qo_len) continue;
    if (!runs.empty() && runs.back().second == r) {
      ++runs.back().second;
    } else {
      runs.push_back({r, r + 1});
    }
  }
  return runs;
}

// Recomputes sampled rows of sampled requests (the first, a third, two thirds, the last and the
// longest) on the CPU reference and compares them with the output. Rows [a, b) of a request with
// qo_len queries over kv_len keys are exactly a request of b - a queries over its first
// kv_len - qo_len + b keys, since the causal mask is aligned to the end of the KV; all the
// sub-requests go to one batch_prefill_paged call over the gathered pages.
RefCheck check_sampled(const CheckSource& p, uint64_t seed, int64_t* rows_checked) {
  const int B = static_cast<int>(p.qo_lens.size());
  std::vector<int> reqs = {
      0, B / 3, (2 * B) / 3, B - 1,
      static_cast<int>(std::max_element(p.kv_lens.begin(), p.kv_lens.end()) - p.kv_lens.begin())};
  std::sort(reqs.begin(), reqs.end());
  reqs.erase(std::unique(reqs.begin(), reqs.end()), reqs.end());
  struct Sub {
    int r;
    int64_t begin, end;
  };
  std::mt19937_64 rng(seed);
  std::vector<Sub> subs;
  std::vector<int64_t> first_page(B, 0);
  int64_t rows = 0, pages = 0;
  for (int r : reqs) {
    first_page[r] = pages;
    pages += p.kv_indptr[r + 1] - p.kv_indptr[r];
    if (p.qo_lens[r] == 0) continue;
    for (auto [a, b] : sample_runs(p.qo_lens[r], rng)) {
      subs.push_back({r, a, b});
      rows += b - a;
    }
  }
  check(rows > 0, "reference check: no query rows to check");
  const size_t page_bytes = size_t(p.page) * p.Hkv * p.D * dtype_size(p.kv_dt);
  HostTensor k(p.kv_dt, {std::max<int64_t>(pages, 1), p.page, p.Hkv, p.D}),
      v(p.kv_dt, {std::max<int64_t>(pages, 1), p.page, p.Hkv, p.D});
  for (int r : reqs) {
    p.pages(r, static_cast<char*>(k.data()) + first_page[r] * page_bytes,
            static_cast<char*>(v.data()) + first_page[r] * page_bytes);
  }
  const size_t row_bytes = size_t(p.Hq) * p.D * dtype_size(p.dt);
  HostTensor q(p.dt, {rows, p.Hq, p.D}), got(p.dt, {rows, p.Hq, p.D}),
      ref(DType::f32, {rows, p.Hq, p.D});
  std::vector<int32_t> qo_ptr = {0}, kv_ptr = {0}, ind, last;
  for (const Sub& s : subs) {
    const int64_t row0 = p.qo_indptr[s.r] + s.begin, n = s.end - s.begin;
    p.q_rows(row0, n, static_cast<char*>(q.data()) + qo_ptr.back() * row_bytes);
    p.out_rows(row0, n, static_cast<char*>(got.data()) + qo_ptr.back() * row_bytes);
    const int64_t kv_len = p.kv_lens[s.r] - p.qo_lens[s.r] + s.end;
    check(kv_len > 0, "reference check: request ", s.r, " has rows that see no key");
    const int64_t np = (kv_len + p.page - 1) / p.page;
    for (int64_t i = 0; i < np; ++i) ind.push_back(static_cast<int32_t>(first_page[s.r] + i));
    kv_ptr.push_back(static_cast<int32_t>(kv_ptr.back() + np));
    last.push_back(static_cast<int32_t>(kv_len - (np - 1) * p.page));
    qo_ptr.push_back(static_cast<int32_t>(qo_ptr.back() + n));
  }
  const int64_t S = static_cast<int64_t>(subs.size());
  PagedKVCache c;
  c.k = k.view();
  c.v = v.view();
  c.indptr = TensorView(kv_ptr.data(), DType::i32, {S + 1});
  c.indices = TensorView(ind.data(), DType::i32, {static_cast<int64_t>(ind.size())});
  c.last_page_len = TensorView(last.data(), DType::i32, {S});
  AttentionOptions ao;
  ao.causal = true;
  reference::batch_prefill_paged(q.view(), TensorView(qo_ptr.data(), DType::i32, {S + 1}), c,
                                 ref.view(), TensorView(), ao);
  *rows_checked = rows;
  return check_reference(got.to_doubles(), ref.to_doubles(), p.dt);
}

struct PrefillSetup {
  int B = 0, Hq = 0;
  DType q_dtype = DType::f16;  // q and out (kv.dtype: the cache's)
  std::vector<int64_t> qo_lens;
  std::vector<int32_t> qo_indptr;
  BenchPagedKV kv;
  DeviceBuffer q, out;  // q: kv.copies copies of [nnz_qo, Hq, D]; out: one
  size_t q_bytes() const {
    return size_t(qo_indptr.back()) * Hq * kv.head_dim * dtype_size(q_dtype);
  }
};

void build(PrefillSetup& st, const PrefillBenchOptions& o, const Workload& w, const HeadShape& sh,
           DType dt, uint64_t seed, Stream s) {
  st.B = static_cast<int>(w.lens.size());
  st.Hq = sh.num_qo_heads;
  st.qo_indptr = {0};
  for (size_t i = 0; i < w.lens.size(); ++i) {
    check(w.qo_len(i) <= w.lens[i], "workload ", w.id, ": qo_len > kv_len in request ", i);
    st.qo_lens.push_back(w.qo_len(i));
    st.qo_indptr.push_back(static_cast<int32_t>(st.qo_indptr.back() + w.qo_len(i)));
  }
  st.kv.num_kv_heads = sh.num_kv_heads;
  st.kv.head_dim = o.head_dim;
  st.kv.page_size = o.page_size;
  st.q_dtype = dt;
  st.kv.dtype = is_fp8_dtype(o.kv_dtype) ? o.kv_dtype : dt;
  st.kv.lens = w.lens;
  st.kv.build(rotation_copies(st.kv.kv_bytes() + st.q_bytes()), seed, s);
  st.q = DeviceBuffer(std::max<size_t>(st.q_bytes() * st.kv.copies, 16));
  device_fill_uniform(st.q.data(), dt, st.q_bytes() / dtype_size(dt) * st.kv.copies, seed + 2, -1,
                      1, s);
  st.out = DeviceBuffer(std::max<size_t>(st.q_bytes(), 16));
}

CheckSource device_source(const PrefillSetup& st) {
  CheckSource c{st.Hq,       st.kv.num_kv_heads, st.kv.head_dim, st.kv.page_size, st.q_dtype,
                st.kv.dtype, st.qo_lens,         st.kv.lens,     st.qo_indptr,    st.kv.indptr};
  const size_t row_bytes = size_t(st.Hq) * st.kv.head_dim * dtype_size(st.q_dtype);
  c.pages = [&st](int r, void* k, void* v) { st.kv.pages_to_host(r, k, v); };
  c.q_rows = [&st, row_bytes](int64_t row, int64_t n, void* dst) {
    st.q.copy_to_host(dst, n * row_bytes, row * row_bytes);  // copy 0
  };
  c.out_rows = [&st, row_bytes](int64_t row, int64_t n, void* dst) {
    st.out.copy_to_host(dst, n * row_bytes, row * row_bytes);
  };
  return c;
}

double pct(double x, double ceiling) {
  return ceiling > 0 ? 100 * x / ceiling : std::numeric_limits<double>::quiet_NaN();
}

nlohmann::json run_config(const PrefillBenchOptions& o, const Workload& w, const HeadShape& sh,
                          DType dt, uint64_t seed, const Ceilings& ceil, Stream s, int mb) {
  PrefillSetup st;
  build(st, o, w, sh, dt, seed, s);
  const int D = o.head_dim;
  const int64_t nnz_qo = st.qo_indptr.back();
  BatchPrefillConfig cfg;
  cfg.max_batch = st.B;
  cfg.max_qo_tokens = std::max<int64_t>(nnz_qo, 1);
  cfg.num_qo_heads = st.Hq;
  cfg.head_dim = D;
  cfg.ctas_per_sm = o.ctas_per_sm;
  DeviceBuffer ws(mb > 0 ? size_t(mb) << 20 : BatchPrefillPaged::workspace_bytes(cfg));
  BatchPrefillPaged pf(cfg, ws.data(), ws.size());
  PrefillPlanOptions po;
  po.causal = true;
  po.tile_rows = o.tile_rows;
  po.backend = o.backend == "mma"     ? PrefillBackend::kMmaSync
               : o.backend == "wgmma" ? PrefillBackend::kWgmma
                                      : PrefillBackend::kAuto;
  po.item_order = o.order == "request" ? PrefillItemOrder::kRequestMajor
                  : o.order == "head"  ? PrefillItemOrder::kHeadMajor
                                       : PrefillItemOrder::kAuto;
  auto plan = [&] {
    pf.plan({.qo_indptr = st.qo_indptr.data(),
             .kv_indptr = st.kv.indptr.data(),
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
    return pf.plan_info().plan_us;
  };
  const double plan_first_us = plan();  // may include the kernel's JIT compile
  std::vector<double> plan_us;
  for (int i = 0; i < kPlanReps; ++i) plan_us.push_back(plan());
  std::sort(plan_us.begin(), plan_us.end());
  std::vector<PagedKVCache> caches;
  for (int c = 0; c < st.kv.copies; ++c) caches.push_back(st.kv.device_view(c));
  auto qview = [&](int c) {
    return TensorView(static_cast<char*>(st.q.data()) + c * st.q_bytes(), dt, {nnz_qo, st.Hq, D},
                      Device::cuda(0));
  };
  const TensorView out(st.out.data(), dt, {nnz_qo, st.Hq, D}, Device::cuda(0));
  const Timing t = time_on_stream(
      s,
      [&](int rep) {
        const int c = rep % st.kv.copies;
        pf.run(qview(c), caches[c], out, TensorView(), s);
      },
      5, o.reps);
  synchronize(s);
  st.out.fill_bytes(0xff);  // NaN in f16 and bf16: a sampled row the kernel does not write fails
  pf.run(qview(0), caches[0], out, TensorView(), s);  // copy 0 again, for the check
  synchronize(s);
  int64_t rows_checked = 0;
  const RefCheck rc = check_sampled(device_source(st), seed, &rows_checked);
  const double flops = prefill_flops(w, st.Hq, D);
  const double tflops = flops / (t.median_us * 1e-6) / 1e12;
  const double pct16 = pct(tflops, ceil.gemm_f16_tflops);
  const auto info = pf.plan_info();
  const char* kernel = info.wgmma ? (info.kv_tma ? "wgmma+tma" : "wgmma") : "mma.sync";
  std::printf(
      "%-4s %-10s %-5s %10.1f %8.1f %6.1f%% %9.2e %9.2e %-4s %s, tile %d, %d CTAs, %d items/%d "
      "split, plan %.1f us%s%s\n",
      w.id.c_str(), sh.name.c_str(), dtype_name(dt), t.median_us, tflops, pct16, rc.err, rc.bound,
      rc.pass ? "ok" : "FAIL", kernel, info.tile_rows, info.num_ctas, info.num_work_items,
      info.num_split_tiles, plan_us[plan_us.size() / 2],
      mb > 0 ? (", ws " + std::to_string(mb) + " MB" + (info.split_limited ? " (limited)" : ""))
                   .c_str()
             : "",
      st.kv.dtype != dt ? (std::string(" kv ") + dtype_name(st.kv.dtype)).c_str() : "");
  std::fflush(stdout);
  return {{"workload", w.id},
          {"shape", sh.name},
          {"dtype", dtype_name(dt)},
          {"kv_dtype", dtype_name(st.kv.dtype)},
          {"head_dim", D},
          {"system", "flashkv"},
          {"time_us", t.median_us},
          {"min_us", t.min_us},
          {"reps", t.reps},
          {"tbps", nullptr},
          {"tflops", tflops},
          {"pct_gemm_f16", pct16},
          {"pct_gemm_same_dtype",
           pct(tflops, dt == DType::bf16 ? ceil.gemm_bf16_tflops : ceil.gemm_f16_tflops)},
          {"rel_err", rc.err},
          {"rel_err_bound", rc.bound},
          {"ref_ok", rc.pass},
          {"ref_rows_checked", rows_checked},
          {"flops", flops},
          {"batch", st.B},
          {"sum_qo", nnz_qo},
          {"sum_kv", std::accumulate(w.lens.begin(), w.lens.end(), int64_t{0})},
          {"causal", true},
          {"copies_rotated", st.kv.copies},
          {"plan_us", plan_us[plan_us.size() / 2]},
          {"plan_us_min", plan_us.front()},
          {"plan_us_first", plan_first_us},
          {"tile_rows", info.tile_rows},
          {"partial_states", info.num_partial_states},
          {"workspace_mb", mb},  // 0: workspace_bytes (never limits splitting)
          {"workspace_bytes", ws.size()},
          {"split_limited", info.split_limited},
          {"kernel", info.wgmma ? "wgmma" : "mma.sync"},
          {"kv_loads", info.kv_tma ? "tma" : "cp.async"},
          {"ctas", info.num_ctas},
          {"work_items", info.num_work_items},
          {"split_tiles", info.num_split_tiles},
          {"chunk_bound", info.chunk_bound}};
}

std::string fmt(const char* spec, double x) {
  if (!std::isfinite(x)) return "";
  char buf[64];
  std::snprintf(buf, sizeof(buf), spec, x);
  return buf;
}

}  // namespace

int64_t causal_pairs(int64_t qo_len, int64_t kv_len) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < qo_len; ++i)
    pairs += std::clamp<int64_t>(kv_len - qo_len + i + 1, 0, kv_len);
  return pairs;
}

double prefill_flops(const Workload& w, int num_qo_heads, int head_dim) {
  double pairs = 0;
  for (size_t i = 0; i < w.lens.size(); ++i) pairs += double(causal_pairs(w.qo_len(i), w.lens[i]));
  return 4.0 * head_dim * num_qo_heads * pairs;
}

nlohmann::json bench_prefill(const PrefillBenchOptions& o, const Ceilings& ceil, Stream s,
                             nlohmann::json& failures) {
  nlohmann::json rows = nlohmann::json::array();
  const auto wls =
      o.workloads_file.empty() ? standard_workloads() : read_workloads(o.workloads_file);
  uint64_t seed = 1;
  if (o.head_dim != 128) std::printf("head_dim %d\n", o.head_dim);
  std::printf("%-4s %-10s %-5s %10s %8s %7s %9s %9s %-4s %s\n", "wl", "shape", "dtype", "time_us",
              "TFLOP/s", "%gemm16", "rel_err", "bound", "ref", "plan");
  for (const auto& w : wls) {
    if (w.kind != "prefill" || !selected(o.workloads, w.id)) continue;
    for (const auto& sh : standard_shapes()) {
      if (!selected(o.shapes, sh.name)) continue;
      for (DType dt : o.dtypes) {
        const uint64_t cfg_seed = seed++;
        try {
          for (int mb : o.workspace_mb)
            rows.push_back(run_config(o, w, sh, dt, cfg_seed, ceil, s, mb));
        } catch (const Error& e) {
          std::printf("%-4s %-10s %-5s FAILED: %s\n", w.id.c_str(), sh.name.c_str(), dtype_name(dt),
                      e.what());
          std::fflush(stdout);
          // heads/system: the keys a failures entry of the peers carries.
          failures.push_back({{"workload", w.id},
                              {"heads", sh.num_kv_heads == sh.num_qo_heads ? "MHA" : "GQA"},
                              {"system", "flashkv"},
                              {"shape", sh.name},
                              {"dtype", dtype_name(dt)},
                              {"error", e.what()}});
        }
      }
    }
  }
  return rows;
}

int count_prefill_failures(const nlohmann::json& rows, const nlohmann::json& failures) {
  int n = static_cast<int>(failures.size());
  for (const auto& r : rows) n += !r.value("ref_ok", false);
  return n;
}

std::string prefill_markdown(const nlohmann::json& rows, const Ceilings& ceil,
                             const std::string& gpu, const std::string& commit) {
  std::string md = "Prefill, flashkv " + commit + " on " + gpu +
                   ": causal, paged KV, ceilings measured in the same run: fp16 GEMM " +
                   fmt("%.0f", ceil.gemm_f16_tflops) + " TFLOP/s, bf16 GEMM " +
                   fmt("%.0f", ceil.gemm_bf16_tflops) + " TFLOP/s, read " +
                   fmt("%.2f", ceil.read_tbps) + " TB/s, copy " + fmt("%.2f", ceil.copy_tbps) +
                   " TB/s. % is of the fp16 GEMM rate (bf16 rows too).\n\n"
                   "| workload | shape | dtype | time_us | TFLOP/s | % fp16 GEMM | rel_err | "
                   "plan_us |\n|---|---|---|---:|---:|---:|---:|---:|\n";
  auto num = [](const nlohmann::json& x, const char* spec) {
    return x.is_number() ? fmt(spec, x.get<double>()) : std::string();
  };
  for (const auto& r : rows) {
    md += "| " + r["workload"].get<std::string>() + " | " + r["shape"].get<std::string>() + " | " +
          r["dtype"].get<std::string>() + " | " + num(r["time_us"], "%.1f") + " | " +
          num(r["tflops"], "%.1f") + " | " + num(r["pct_gemm_f16"], "%.1f") + " | " +
          num(r["rel_err"], "%.1e") + (r.value("ref_ok", false) ? "" : " FAIL") + " | " +
          num(r["plan_us"], "%.1f") + " |\n";
  }
  return md;
}

nlohmann::json bench_prefill_cpu_reference() {
  // Prefill, append and speculative-verification requests side by side, GQA 32/8, D 128.
  const int Hq = 32, Hkv = 8, D = 128, page = 16;
  const DType dt = DType::f16;
  Workload w{"cpu", "prefill", {256, 512, 300, 129}, {256, 64, 300, 4}};
  std::vector<int32_t> qo_indptr = {0}, kv_indptr = {0}, last;
  for (size_t i = 0; i < w.lens.size(); ++i) {
    const int64_t np = (w.lens[i] + page - 1) / page;
    qo_indptr.push_back(static_cast<int32_t>(qo_indptr.back() + w.qo_len(i)));
    kv_indptr.push_back(static_cast<int32_t>(kv_indptr.back() + np));
    last.push_back(static_cast<int32_t>(w.lens[i] - (np - 1) * page));
  }
  const int64_t B = static_cast<int64_t>(w.lens.size()), pages = kv_indptr.back(),
                nnz = qo_indptr.back();
  std::vector<int32_t> indices(pages);
  std::iota(indices.begin(), indices.end(), 0);
  std::shuffle(indices.begin(), indices.end(), std::mt19937(5));
  HostTensor k(dt, {pages, page, Hkv, D}), v(dt, {pages, page, Hkv, D}), q(dt, {nnz, Hq, D}),
      out(dt, {nnz, Hq, D});
  k.fill_random(1);
  v.fill_random(2);
  q.fill_random(3);
  PagedKVCache c;
  c.k = k.view();
  c.v = v.view();
  c.indptr = TensorView(kv_indptr.data(), DType::i32, {B + 1});
  c.indices = TensorView(indices.data(), DType::i32, {pages});
  c.last_page_len = TensorView(last.data(), DType::i32, {B});
  AttentionOptions ao;
  ao.causal = true;
  const auto t0 = std::chrono::steady_clock::now();
  reference::batch_prefill_paged(q.view(), TensorView(qo_indptr.data(), DType::i32, {B + 1}), c,
                                 out.view(), TensorView(), ao);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double flops = prefill_flops(w, Hq, D);
  std::printf(
      "reference batch_prefill_paged, causal, qo_len %s / kv_len %s: %.1f ms (%.2f GFLOP/s)\n",
      "256,64,300,4", "256,512,300,129", ms, flops / (ms * 1e-3) / 1e9);
  // The benchmark's sampled-row check, with the full reference as the "kernel" output.
  const size_t page_bytes = size_t(page) * Hkv * D * dtype_size(dt),
               row_bytes = size_t(Hq) * D * dtype_size(dt);
  CheckSource src{Hq, Hkv, D, page, dt, dt, w.qo_lens, w.lens, qo_indptr, kv_indptr};
  src.pages = [&](int r, void* kd, void* vd) {
    for (int p = 0; p < kv_indptr[r + 1] - kv_indptr[r]; ++p) {
      const size_t off = size_t(indices[kv_indptr[r] + p]) * page_bytes;
      std::memcpy(static_cast<char*>(kd) + p * page_bytes, static_cast<char*>(k.data()) + off,
                  page_bytes);
      std::memcpy(static_cast<char*>(vd) + p * page_bytes, static_cast<char*>(v.data()) + off,
                  page_bytes);
    }
  };
  src.q_rows = [&](int64_t row, int64_t n, void* dst) {
    std::memcpy(dst, static_cast<char*>(q.data()) + row * row_bytes, n * row_bytes);
  };
  src.out_rows = [&](int64_t row, int64_t n, void* dst) {
    std::memcpy(dst, static_cast<char*>(out.data()) + row * row_bytes, n * row_bytes);
  };
  int64_t rows_checked = 0;
  const RefCheck rc = check_sampled(src, 7, &rows_checked);
  std::printf(
      "sampled-row check (%lld rows of sub-requests) against the full reference: rel_err %.2e, "
      "bound %.2e: %s\n",
      (long long)rows_checked, rc.err, rc.bound, rc.pass ? "ok" : "FAIL");
  check(rc.pass,
        "bench prefill: the sampled-row reference check disagrees with the full reference");
  return nlohmann::json::array({{{"op", "reference_batch_prefill_paged"},
                                 {"qo_lens", w.qo_lens},
                                 {"kv_lens", w.lens},
                                 {"time_ms", ms},
                                 {"sampled_check_rel_err", rc.err},
                                 {"sampled_check_bound", rc.bound},
                                 {"sampled_check_rows", rows_checked}}});
}

}  // namespace flashkv::cli
