// flashkv bench variants, the prefill half: the built-in variants on long-prompt prefill (PV: 4
// requests of 2048 queries over their own 2048 keys; PW: one 32k prompt with a 4096-key sliding
// window, Mistral's; ragged contiguous KV through BatchPrefillRagged), each timed next to plain
// prefill of the same run and checked against reference::single_prefill_variant on the last query
// rows of the first and last request. Each row names the kernel the plan ran (wgmma / mma.sync).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "bench_prefill.h"
#include "bench_variants.h"
#include "flashkv/error.h"
#include "flashkv/prefill.h"
#include "flashkv/reference_variants.h"
#include "workloads.h"

namespace flashkv::cli {
namespace {

constexpr double kMaxRelErr = 1e-2;  // as the decode half: the cap of check_reference's rule
constexpr int64_t kCheckRows = 16;   // the last rows of a request: they see the most keys
const Device kGpu = Device::cuda(0);

// A workload of this benchmark: `batch` requests of qo_len = kv_len = `len`, the window
// configurations' window_left, and the configurations in order. "plain-noncausal" comes right
// before "custom-mask": it is that row's baseline (the mask is random, not causal-shaped, so the
// causal flag is off there, as for tree / speculative masks).
struct PrefillVariantWorkload {
  const char* id;  // what --workloads selects it by
  int batch;
  int64_t len;
  int window_left;
  std::vector<std::string> configs;
};

const PrefillVariantWorkload kWorkloads[] = {
    {"PV",
     4,
     2048,
     512,
     {"plain", "soft-cap", "window", "sinks", "alibi", "window+soft-cap+sinks", "rope-fused",
      "plain-noncausal", "custom-mask"}},
    // A sliding window over a long prompt must cost about the window, not the prompt.
    {"PW", 1, 32768, 4096, {"plain", "window"}},
};

bool is_causal(const std::string& name) {
  return name != "plain-noncausal" && name != "custom-mask";
}

// Inputs in rotated copies (q, k, v: copy c at offset c * bytes of one copy), one output, and
// each variant tensor twice: host (the reference) and device (the kernel). `bits` keeps the
// unpacked mask so the check can cut a sub-request's rows out of it.
struct Setup {
  int B = 0, Hq = 0, Hkv = 0, D = 0, copies = 1;
  int64_t len = 0;
  DType dt = DType::f16;
  std::vector<int32_t> indptr;  // qo and kv alike: request r owns rows [r * len, (r + 1) * len)
  DeviceBuffer q, k, v, out;
  std::vector<bool> bits;  // request r's [len, len] row-major mask, requests back to back
  BenchVariantInputs vin;

  int64_t rows() const { return int64_t(B) * len; }
  size_t row_bytes(int heads) const { return size_t(heads) * D * dtype_size(dt); }
  // Copy c of a [rows, heads, D] input held in `b`.
  TensorView view(const DeviceBuffer& b, int heads, int c) const {
    return TensorView(static_cast<char*>(b.data()) + c * rows() * row_bytes(heads), dt,
                      {rows(), heads, D}, kGpu);
  }
};

// with_mask: the random custom mask (B x len x len bits, so only for short prompts).
void build(Setup& st, const PrefillVariantWorkload& wl, const HeadShape& sh, int head_dim, DType dt,
           uint64_t seed, bool with_mask, Stream s) {
  st.B = wl.batch;
  st.len = wl.len;
  st.Hq = sh.num_qo_heads;
  st.Hkv = sh.num_kv_heads;
  st.D = head_dim;
  st.dt = dt;
  for (int r = 0; r <= st.B; ++r) st.indptr.push_back(static_cast<int32_t>(r * st.len));
  const size_t qb = st.rows() * st.row_bytes(st.Hq), kvb = st.rows() * st.row_bytes(st.Hkv);
  st.copies = rotation_copies(qb + 2 * kvb);  // compute-bound, but rotating costs only memory
  st.q = DeviceBuffer(qb * st.copies);
  st.k = DeviceBuffer(kvb * st.copies);
  st.v = DeviceBuffer(kvb * st.copies);
  st.out = DeviceBuffer(qb);
  device_fill_uniform(st.q.data(), dt, qb / dtype_size(dt) * st.copies, seed, -1, 1, s);
  device_fill_uniform(st.k.data(), dt, kvb / dtype_size(dt) * st.copies, seed + 1, -1, 1, s);
  device_fill_uniform(st.v.data(), dt, kvb / dtype_size(dt) * st.copies, seed + 2, -1, 1, s);
  std::mt19937 rng(static_cast<uint32_t>(seed * 7 + 3));
  const std::vector<int64_t> lens(st.B, st.len);
  if (with_mask) {
    st.bits.resize(size_t(st.B) * st.len * st.len);
    for (size_t n = 0; n < st.bits.size(); ++n) st.bits[n] = rng() % 10 < 7;  // ~70% attended
    st.vin.build(st.Hq, st.bits, lens, lens, rng);
  } else {
    st.vin.build(st.Hq, std::vector<bool>{true}, {1}, {1}, rng);  // sinks and slopes; no mask
  }
}

// Configuration `name` (BenchVariantInputs::describe) with the causal mask where it applies.
AttentionVariant describe(const Setup& st, const std::string& name, int window_left, bool dev) {
  AttentionVariant v = st.vin.describe(name, window_left, dev);
  v.causal = is_causal(name);
  return v;
}

// Relative error of the last kCheckRows query rows of requests 0 and B-1 (copy 0, st.out). Rows
// [row0, end) form a request of end - row0 queries over the first kv_len - qo_len + end keys (all
// of them here): the causal diagonal is aligned to the end of the KV, so every query and key keeps
// its position (masks, ALiBi and RoPE see the same q_pos / kv_pos as in the full request).
double check_sampled(const Setup& st, const AttentionVariant& variant) {
  const int64_t n = kCheckRows, row0 = st.len - n, kv_len = st.len - st.len + (row0 + n);
  std::vector<double> got, want;
  for (int r : {0, st.B - 1}) {
    HostTensor q(st.dt, {n, st.Hq, st.D}), out(st.dt, {n, st.Hq, st.D}),
        ref(DType::f32, {n, st.Hq, st.D}), k(st.dt, {kv_len, st.Hkv, st.D}), v(st.dt, k.shape());
    const size_t qrow = st.row_bytes(st.Hq), kvrow = st.row_bytes(st.Hkv);
    st.q.copy_to_host(q.data(), n * qrow, (r * st.len + row0) * qrow);
    st.out.copy_to_host(out.data(), n * qrow, (r * st.len + row0) * qrow);
    st.k.copy_to_host(k.data(), kv_len * kvrow, r * st.len * kvrow);
    st.v.copy_to_host(v.data(), kv_len * kvrow, r * st.len * kvrow);
    AttentionVariant hv = variant;
    std::vector<uint8_t> sub_mask;  // outlives the reference call
    if (hv.custom_mask.defined()) {
      // Row i of the sub-request is row row0 + i of request r; all kv_len columns.
      std::vector<bool> sub(size_t(n) * kv_len);
      const size_t base = size_t(r) * st.len * st.len;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < kv_len; ++j)
          sub[size_t(i * kv_len + j)] = st.bits[base + size_t((row0 + i) * st.len + j)];
      std::vector<int32_t> ind;
      sub_mask = pack_custom_mask(sub, {n}, {kv_len}, ind);
      hv.custom_mask = {sub_mask.data(), static_cast<int64_t>(sub_mask.size()), TensorView()};
    }
    reference::single_prefill_variant(q.view(), k.view(), v.view(), ref.view(), TensorView(),
                                      KVLayout::NHD, hv);
    for (double x : out.to_doubles()) got.push_back(x);
    for (double x : ref.to_doubles()) want.push_back(x);
  }
  return relative_error(got, want);
}

double pct(double x, double ceiling) {
  return ceiling > 0 ? 100 * x / ceiling : std::numeric_limits<double>::quiet_NaN();
}

// Query-key pairs of one request of qo_len = kv_len = len that a causal window of window_left
// keys (< 0: none) keeps: min(i + 1, window_left + 1) for query i.
double visible_pairs(int64_t len, int window_left) {
  if (window_left < 0) return double(causal_pairs(len, len));
  double n = 0;
  for (int64_t i = 0; i < len; ++i) n += double(std::min<int64_t>(i + 1, window_left + 1));
  return n;
}

// One workload's rows for shape sh and dtype dt.
void run_workload(const PrefillVariantWorkload& wl, const VariantsBenchOptions& o,
                  const Ceilings& ceil, const HeadShape& sh, DType dt, uint64_t seed, Stream s,
                  nlohmann::json& rows) {
  const bool with_mask =
      std::find(wl.configs.begin(), wl.configs.end(), "custom-mask") != wl.configs.end();
  Setup st;
  build(st, wl, sh, o.head_dim, dt, seed, with_mask, s);
  BatchPrefillConfig cfg{
      .max_batch = st.B,
      .max_qo_tokens = st.rows(),
      .num_qo_heads = st.Hq,
      .head_dim = st.D,
      .ctas_per_sm = o.ctas_per_sm > 0 ? o.ctas_per_sm : BatchPrefillConfig{}.ctas_per_sm};
  DeviceBuffer ws(BatchPrefillRagged::workspace_bytes(cfg));
  BatchPrefillRagged pf(cfg, ws.data(), ws.size());
  const TensorView out(st.out.data(), dt, {st.rows(), st.Hq, st.D}, kGpu);
  auto run = [&](int c) {
    pf.run(st.view(st.q, st.Hq, c), st.view(st.k, st.Hkv, c), st.view(st.v, st.Hkv, c), out,
           TensorView(), s);
  };
  double t_plain = 0, t_noncausal = 0;
  const double causal_flops = 4.0 * st.D * st.Hq * st.B * visible_pairs(st.len, -1);
  for (const std::string& name : wl.configs) {
    const bool causal = is_causal(name), plain = name.rfind("plain", 0) == 0;
    const bool windowed = name.find("window") != std::string::npos;
    // FLOPs of the pairs the configuration keeps (a window's, not the prompt's).
    const double pairs = double(st.B) * (!causal    ? double(st.len) * double(st.len)
                                         : windowed ? visible_pairs(st.len, wl.window_left)
                                                    : visible_pairs(st.len, -1));
    const double flops = 4.0 * st.D * st.Hq * pairs;
    // The matching plain row: the causal one, or the non-causal one for the custom mask.
    const double t_base = causal ? t_plain : t_noncausal;
    nlohmann::json row = {
        {"kind", "prefill"},       {"workload", wl.id},   {"shape", sh.name},
        {"dtype", dtype_name(dt)}, {"system", "flashkv"}, {"variant", name},
        {"causal", causal},        {"batch", st.B},       {"qo_len", st.len},
        {"kv_len", st.len},        {"flops", flops},      {"copies_rotated", st.copies}};
    if (windowed) row["window_left"] = wl.window_left;
    // A window's time over plain causal, were both at the same FLOP rate.
    if (causal) row["work_ratio_to_plain"] = flops / causal_flops;
    try {
      PrefillPlanOptions po;
      po.causal = causal;
      if (!plain) po.variant = Variant::builtin(describe(st, name, wl.window_left, true));
      pf.plan({.qo_indptr = st.indptr.data(),
               .kv_indptr = st.indptr.data(),
               .kv_last_page_len = nullptr,
               .batch_size = st.B,
               .page_size = 0},
              {.num_qo_heads = st.Hq,
               .num_kv_heads = st.Hkv,
               .head_dim = st.D,
               .q_dtype = dt,
               .kv_dtype = dt,
               .o_dtype = dt},
              po, s);  // JIT-compiles the variant's kernel: outside the timed region
      const Timing t = time_on_stream(
          s, [&](int rep) { run(rep % st.copies); }, 5, o.reps);
      synchronize(s);
      st.out.fill_bytes(0xff);  // NaN in f16 / bf16: a row the kernel skips fails the check
      run(0);
      synchronize(s);
      const double err = check_sampled(st, describe(st, name, wl.window_left, false));
      const bool ok = err <= kMaxRelErr;  // false for NaN
      const double tflops = flops / (t.median_us * 1e-6) / 1e12;
      // NaN (JSON null) when the baseline itself failed: nothing to compare with.
      const double ratio = plain ? 1.0 : t_base > 0 ? t.median_us / t_base : std::nan("");
      if (name == "plain") t_plain = t.median_us;
      if (name == "plain-noncausal") t_noncausal = t.median_us;
      const auto info = pf.plan_info();
      const char* kernel = info.wgmma ? "wgmma" : "mma.sync";
      row.update({{"time_us", t.median_us},
                  {"min_us", t.min_us},
                  {"reps", t.reps},
                  {"tbps", nullptr},
                  {"tflops", tflops},
                  {"pct_gemm_f16", pct(tflops, ceil.gemm_f16_tflops)},
                  {"ratio_to_plain", ratio},
                  {"baseline", causal ? "plain" : "plain-noncausal"},
                  {"rel_err", err},
                  {"ref_rows_checked", 2 * kCheckRows},
                  {"check", ok ? "ok" : "FAILED"},
                  {"kernel", kernel},
                  {"tile_rows", info.tile_rows},
                  {"ctas", info.num_ctas},
                  {"work_items", info.num_work_items},
                  {"split_tiles", info.num_split_tiles}});
      std::printf("%-4s %-9s %-5s %-22s %-8s %9.1f %8.1f %6.1f%% %7.2fx %9.2e%s\n", wl.id,
                  sh.name.c_str(), dtype_name(dt), name.c_str(), kernel, t.median_us, tflops,
                  pct(tflops, ceil.gemm_f16_tflops), ratio, err,
                  ok ? "" : "  ERROR: rel_err above 1e-2");
    } catch (const std::exception& e) {
      // One refused configuration is a FAILED row; the others still report.
      row.update({{"time_us", nullptr}, {"check", "FAILED"}, {"error", e.what()}});
      std::printf("%-4s %-9s %-5s %-22s ERROR: %s\n", wl.id, sh.name.c_str(), dtype_name(dt),
                  name.c_str(), e.what());
    }
    std::fflush(stdout);
    rows.push_back(row);
  }
}

}  // namespace

nlohmann::json bench_variants_prefill(const VariantsBenchOptions& o, const Ceilings& ceil,
                                      Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  uint64_t seed = 701;
  for (const PrefillVariantWorkload& wl : kWorkloads) {
    if (!selected(o.workloads, wl.id)) continue;
    std::printf(
        "\nprefill %s: %d request(s), qo_len = kv_len = %lld, ragged KV, causal (custom-mask and "
        "plain-noncausal: not), window_left %d\n%-4s %-9s %-5s %-22s %-8s %9s %8s %7s %8s %9s\n",
        wl.id, wl.batch, (long long)wl.len, wl.window_left, "wl", "shape", "dtype", "variant",
        "kernel", "time_us", "TFLOP/s", "%gemm16", "x plain", "rel_err");
    for (const auto& sh : standard_shapes()) {
      if (!selected(o.shapes, sh.name)) continue;
      for (DType dt : o.dtypes) {
        run_workload(wl, o, ceil, sh, dt, seed, s, rows);
        seed += 3;
      }
    }
  }
  synchronize(s);
  return rows;
}

}  // namespace flashkv::cli
