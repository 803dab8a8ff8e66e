#include "bench_sparse.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "flashkv/block_sparse.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/prefill.h"
#include "sparse_workloads.h"
#include "workloads.h"

namespace flashkv::cli {
namespace {

constexpr int kHq = 32, kHkv = 8, kD = 128, kGroup = kHq / kHkv;
const Device kGpu = Device::cuda(0);

double f16_at(const DeviceBuffer& b, int64_t element) {
  uint16_t bits = 0;
  b.copy_to_host(&bits, 2, static_cast<size_t>(element) * 2);
  return f16_to_float(bits);
}

// Softmax attention of one query row (scaled by 1 / sqrt(D)) over keys / values given as
// element offsets into host f16 arrays; double precision.
std::vector<double> attend(const std::vector<double>& q, const std::vector<double>& k,
                           const std::vector<double>& v) {
  const size_t n = k.size() / kD;
  std::vector<double> s(n), out(kD, 0.0);
  double mx = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int e = 0; e < kD; ++e) acc += q[e] * k[j * kD + e];
    s[j] = acc / std::sqrt(double(kD));
    mx = std::max(mx, s[j]);
  }
  double sum = 0;
  for (size_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
  for (size_t j = 0; j < n; ++j)
    for (int e = 0; e < kD; ++e) out[e] += s[j] / sum * v[j * kD + e];
  return out;
}

nlohmann::json row(const std::string& id, const std::string& system, const Timing& t) {
  return {{"workload", id},     {"kind", "sparse"}, {"shape", "gqa-32-8"},
          {"dtype", "f16"},     {"system", system}, {"time_us", t.median_us},
          {"min_us", t.min_us}, {"reps", t.reps},   {"host_us", t.host_us}};
}

void print_row(const nlohmann::json& r, const Ceilings& c) {
  const bool flops = r.contains("tflops");
  const double rate = flops ? r["tflops"].get<double>() : r["tbps"].get<double>();
  const double pct = 100 * rate / (flops ? c.gemm_f16_tflops : c.read_tbps);
  std::printf("%-4s %-28s %10.1f us %8.2f %s %5.1f%%", r["workload"].get<std::string>().c_str(),
              r["system"].get<std::string>().c_str(), r["time_us"].get<double>(), rate,
              flops ? "TFLOP/s" : "TB/s   ", pct);
  if (r.contains("rel_err"))
    std::printf("  rel_err %.2e <= %.1e %s", r["rel_err"].get<double>(),
                r["rel_err_bound"].get<double>(), r["ref_ok"].get<bool>() ? "ok" : "FAIL");
  std::printf("\n");
}

void add_check(nlohmann::json& r, const std::vector<double>& got, const std::vector<double>& ref) {
  const RefCheck c = check_reference(got, ref, DType::f16);
  r["rel_err"] = std::isfinite(c.err) ? c.err : -1.0;
  r["rel_err_bound"] = c.bound;
  r["ref_ok"] = c.pass;
}

// B1 / B2: BlockSparseAttention (causal) and dense causal prefill over all keys.
void bench_block(const BlockWorkload& w, int reps, int ctas_per_sm, const Ceilings& ceil, Stream s,
                 nlohmann::json& rows) {
  const BsrPattern p = bsr_pattern(w);
  const int64_t n = w.n, mb = w.blocks_per_side(), nnz = static_cast<int64_t>(p.indices.size());
  const int64_t pairs = causal_pairs(w, p);
  const double flops = 4.0 * kD * kHq * double(pairs);
  std::printf("%s: %lld x %lld blocks of %d, %lld stored (%.2f %% of the causal triangle)\n",
              w.id.c_str(), (long long)mb, (long long)mb, w.block, (long long)nnz,
              100.0 * double(nnz) / double(causal_blocks(mb)));
  DeviceBuffer q(n * kHq * kD * 2), k(n * kHkv * kD * 2), v(n * kHkv * kD * 2),
      out(n * kHq * kD * 2);
  device_fill_uniform(q.data(), DType::f16, n * kHq * kD, w.seed, -1, 1, s);
  device_fill_uniform(k.data(), DType::f16, n * kHkv * kD, w.seed + 1, -1, 1, s);
  device_fill_uniform(v.data(), DType::f16, n * kHkv * kD, w.seed + 2, -1, 1, s);
  const TensorView tq(q.data(), DType::f16, {n, kHq, kD}, kGpu),
      tk(k.data(), DType::f16, {n, kHkv, kD}, kGpu), tv(v.data(), DType::f16, {n, kHkv, kD}, kGpu),
      to(out.data(), DType::f16, {n, kHq, kD}, kGpu);
  const BlockSparseLayout layout{p.indptr.data(), p.indices.data(), n, n, w.block, w.block};
  BlockSparseConfig cfg{.max_rows = n,
                        .max_block_rows = mb,
                        .max_blocks = nnz,
                        .max_mask_bytes = block_sparse_mask_bytes(layout, true),
                        .ctas_per_sm = ctas_per_sm};
  DeviceBuffer ws(BlockSparseAttention::workspace_bytes(cfg));
  BlockSparseAttention bsa(cfg, ws.data(), ws.size());
  bsa.plan(layout, {.num_qo_heads = kHq, .num_kv_heads = kHkv, .head_dim = kD}, {.causal = true},
           s);
  nlohmann::json r = row(w.id, "flashkv",
                         time_on_stream(
                             s, [&](int) { bsa.run(tq, tk, tv, to, {}, s); }, 5, reps));
  r["tflops"] = flops / (r["time_us"].get<double>() * 1e-6) / 1e12;
  r["flops"] = flops;
  r["blocks"] = nnz;
  r["density"] = double(nnz) / double(causal_blocks(mb));
  r["ctas_per_sm"] = ctas_per_sm;
  // Check sampled rows (every head) against the host reference.
  synchronize(s);
  out.fill_bytes(0xFF);  // f16 NaN: a row the kernel does not write fails the check
  bsa.run(tq, tk, tv, to, {}, s);
  synchronize(s);
  HostTensor hk(DType::f16, {n, kHkv, kD}), hv(DType::f16, {n, kHkv, kD});
  k.copy_to_host(hk.data(), hk.nbytes());
  v.copy_to_host(hv.data(), hv.nbytes());
  std::vector<double> got, ref;
  for (int64_t m : {int64_t{0}, int64_t{w.block} - 1, n / 2 + 5, 7 * n / 9, n - 1}) {
    const int64_t i = m / w.block;
    std::vector<int64_t> keys;
    for (int32_t t = p.indptr[i]; t < p.indptr[i + 1]; ++t)
      for (int64_t c = 0; c < w.block; ++c)
        if (p.indices[t] * int64_t{w.block} + c <= m) keys.push_back(p.indices[t] * w.block + c);
    for (int h = 0; h < kHq; ++h) {
      std::vector<double> qr(kD), kr, vr;
      for (int e = 0; e < kD; ++e) qr[e] = f16_at(q, (m * kHq + h) * kD + e);
      for (int64_t key : keys)
        for (int e = 0; e < kD; ++e) {
          kr.push_back(hk.get((key * kHkv + h / kGroup) * kD + e));
          vr.push_back(hv.get((key * kHkv + h / kGroup) * kD + e));
        }
      const std::vector<double> o = attend(qr, kr, vr);
      ref.insert(ref.end(), o.begin(), o.end());
      HostTensor got_row(DType::f16, {kD});
      out.copy_to_host(got_row.data(), kD * 2, static_cast<size_t>((m * kHq + h) * kD) * 2);
      for (int e = 0; e < kD; ++e) got.push_back(got_row.get(e));
    }
  }
  add_check(r, got, ref);
  print_row(r, ceil);
  rows.push_back(r);
  // Dense causal prefill over all keys: the "dense time" of the target.
  BatchPrefillConfig pc{.max_batch = 1, .max_qo_tokens = n, .num_qo_heads = kHq, .head_dim = kD};
  DeviceBuffer pws(BatchPrefillRagged::workspace_bytes(pc));
  BatchPrefillRagged dense(pc, pws.data(), pws.size());
  const int32_t indptr[2] = {0, static_cast<int32_t>(n)};
  dense.plan({.qo_indptr = indptr, .kv_indptr = indptr, .batch_size = 1},
             {.num_qo_heads = kHq, .num_kv_heads = kHkv, .head_dim = kD}, {.causal = true}, s);
  nlohmann::json d = row(w.id, "flashkv-dense",
                         time_on_stream(
                             s, [&](int) { dense.run(tq, tk, tv, to, {}, s); }, 5, reps));
  d["tflops"] =
      4.0 * kD * kHq * double(n) * double(n + 1) / 2 / (d["time_us"].get<double>() * 1e-6) / 1e12;
  d["notes"] = "causal over all keys; tflops count the dense pairs";
  print_row(d, ceil);
  rows.push_back(d);
}

// B3 / B4: decode over head_pages() of a paged cache (page 16, scattered pages), a random
// selection per (request, KV head); beside dense decode over the selected length and over the
// whole context.
void bench_select(const SelectWorkload& w, int reps, const Ceilings& ceil, Stream s,
                  nlohmann::json& rows) {
  const int B = w.batch, page = 16, BH = B * kHkv;
  const int64_t ppr = w.context / page, P = B * ppr, sel = w.selected_tokens();
  std::printf("%s: batch %d, context %lld, %d %s per request and KV head\n", w.id.c_str(), B,
              (long long)w.context, w.selected, w.page == 1 ? "tokens" : "pages of 16");
  DeviceBuffer k(P * page * kHkv * kD * 2), v(P * page * kHkv * kD * 2), q(B * kHq * kD * 2),
      out(B * kHq * kD * 2);
  device_fill_uniform(k.data(), DType::f16, P * page * kHkv * kD, w.seed, -1, 1, s);
  device_fill_uniform(v.data(), DType::f16, P * page * kHkv * kD, w.seed + 1, -1, 1, s);
  device_fill_uniform(q.data(), DType::f16, B * kHq * kD, w.seed + 2, -1, 1, s);
  std::mt19937_64 rng(w.seed);
  std::vector<int32_t> page_of(P);  // request r's i-th page
  for (int64_t i = 0; i < P; ++i) page_of[i] = static_cast<int32_t>(i);
  std::shuffle(page_of.begin(), page_of.end(), rng);
  // Selected token positions per (r, h), ascending.
  std::vector<std::vector<int64_t>> chosen(BH);
  const int64_t units = w.context / w.page;
  for (auto& c : chosen) {
    std::vector<int64_t> all(units);
    for (int64_t i = 0; i < units; ++i) all[i] = i;
    for (int i = 0; i < w.selected; ++i)  // partial Fisher-Yates
      std::swap(all[i], all[i + rng() % (units - i)]);
    all.resize(w.selected);
    std::sort(all.begin(), all.end());
    for (int64_t u : all)
      for (int t = 0; t < w.page; ++t) c.push_back(u * w.page + t);
  }
  const PagedKVCache full_view = [&] {
    PagedKVCache c;
    c.k = TensorView(k.data(), DType::f16, {P, page, kHkv, kD}, kGpu);
    c.v = TensorView(v.data(), DType::f16, {P, page, kHkv, kD}, kGpu);
    return c;
  }();
  const double bytes = 2.0 * B * kHq * kD * 2 + double(BH) * double(sel) * kD * 2 * 2;
  BatchDecodeConfig dc{.max_batch = BH, .num_qo_heads = kHq, .head_dim = kD};
  DeviceBuffer dws(BatchDecode::workspace_bytes(dc));
  const TensorView tq(q.data(), DType::f16, {B, kHq, kD}, kGpu),
      to(out.data(), DType::f16, {B, kHq, kD}, kGpu);
  const TensorView tq2(q.data(), DType::f16, {BH, kGroup, kD}, kGpu),
      to2(out.data(), DType::f16, {BH, kGroup, kD}, kGpu);
  // flashkv: NHD token ids over head_pages(k), page_size 1.
  {
    std::vector<int32_t> indptr = {0}, ids, last(BH, 1);
    for (int rh = 0; rh < BH; ++rh) {
      const int r = rh / kHkv, h = rh % kHkv;
      for (int64_t t : chosen[rh])
        ids.push_back(static_cast<int32_t>(
            (int64_t{page_of[r * ppr + t / page]} * page + t % page) * kHkv + h));
      indptr.push_back(static_cast<int32_t>(ids.size()));
    }
    DeviceBuffer dids(ids.size() * 4);
    dids.copy_from_host(ids.data(), ids.size() * 4);
    PagedKVCache c;
    c.k = head_pages(full_view.k, KVLayout::NHD);
    c.v = head_pages(full_view.v, KVLayout::NHD);
    c.indices = TensorView(dids.data(), DType::i32, {static_cast<int64_t>(ids.size())}, kGpu);
    c.indptr = TensorView(dids.data(), DType::i32, {BH + 1}, kGpu);
    c.last_page_len = TensorView(dids.data(), DType::i32, {BH}, kGpu);
    BatchDecode dec(dc, dws.data(), dws.size());
    dec.plan({.kv_indptr = indptr.data(),
              .kv_last_page_len = last.data(),
              .batch_size = BH,
              .page_size = 1},
             {.num_qo_heads = kGroup, .num_kv_heads = 1, .head_dim = kD}, {}, s);
    nlohmann::json r = row(w.id, "flashkv",
                           time_on_stream(
                               s, [&](int) { dec.run(tq2, c, to2, {}, s); }, 5, reps));
    r["tbps"] = bytes / (r["time_us"].get<double>() * 1e-6) / 1e12;
    r["bytes"] = bytes;
    r["notes"] = "NHD cache, head_pages view, token ids, page_size 1";
    synchronize(s);
    out.fill_bytes(0xFF);  // f16 NaN: a row the kernel does not write fails the check
    dec.run(tq2, c, to2, {}, s);
    synchronize(s);
    std::vector<double> got, ref;
    for (int rh : {0, BH / 2 + 3, BH - 1}) {
      const int r = rh / kHkv, h = rh % kHkv;
      std::vector<double> kr, vr;
      for (int64_t t : chosen[rh]) {
        const int64_t base =
            ((int64_t{page_of[r * ppr + t / page]} * page + t % page) * kHkv + h) * kD;
        HostTensor kt(DType::f16, {kD}), vt(DType::f16, {kD});
        k.copy_to_host(kt.data(), kD * 2, static_cast<size_t>(base) * 2);
        v.copy_to_host(vt.data(), kD * 2, static_cast<size_t>(base) * 2);
        for (int e = 0; e < kD; ++e) {
          kr.push_back(kt.get(e));
          vr.push_back(vt.get(e));
        }
      }
      for (int j = 0; j < kGroup; ++j) {
        std::vector<double> qr(kD);
        for (int e = 0; e < kD; ++e)
          qr[e] = f16_at(q, (int64_t{r} * kHq + h * kGroup + j) * kD + e);
        const std::vector<double> o = attend(qr, kr, vr);
        ref.insert(ref.end(), o.begin(), o.end());
        for (int e = 0; e < kD; ++e)
          got.push_back(f16_at(out, (int64_t{r} * kHq + h * kGroup + j) * kD + e));
      }
    }
    add_check(r, got, ref);
    print_row(r, ceil);
    rows.push_back(r);
  }
  // Dense decode over the selected length (B3's comparator) and over the whole context.
  for (const auto& [system, n_tok] :
       {std::pair<std::string, int64_t>{"flashkv-dense-selected-len", sel},
        std::pair<std::string, int64_t>{"flashkv-dense", w.context}}) {
    const int64_t pages = n_tok / page;
    std::vector<int32_t> indptr = {0}, ids, last(B, page);
    for (int r = 0; r < B; ++r) {
      for (int64_t i = 0; i < pages; ++i) ids.push_back(page_of[r * ppr + i]);
      indptr.push_back(static_cast<int32_t>(ids.size()));
    }
    DeviceBuffer dids(ids.size() * 4);
    dids.copy_from_host(ids.data(), ids.size() * 4);
    PagedKVCache c = full_view;
    c.indices = TensorView(dids.data(), DType::i32, {static_cast<int64_t>(ids.size())}, kGpu);
    c.indptr = TensorView(dids.data(), DType::i32, {B + 1}, kGpu);
    c.last_page_len = TensorView(dids.data(), DType::i32, {B}, kGpu);
    BatchDecode dec(dc, dws.data(), dws.size());
    dec.plan({.kv_indptr = indptr.data(),
              .kv_last_page_len = last.data(),
              .batch_size = B,
              .page_size = page},
             {.num_qo_heads = kHq, .num_kv_heads = kHkv, .head_dim = kD}, {}, s);
    nlohmann::json r = row(w.id, system,
                           time_on_stream(
                               s, [&](int) { dec.run(tq, c, to, {}, s); }, 5, reps));
    const double b = 2.0 * B * kHq * kD * 2 + double(B) * double(n_tok) * kHkv * kD * 2 * 2;
    r["tbps"] = b / (r["time_us"].get<double>() * 1e-6) / 1e12;
    r["notes"] = "dense decode over " + std::to_string(n_tok) + " tokens per request (page 16)";
    print_row(r, ceil);
    rows.push_back(r);
  }
}

}  // namespace

nlohmann::json bench_sparse(const SparseBenchOptions& opts, const Ceilings& ceil, Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& w : block_workloads())
    if (selected(opts.workloads, w.id)) bench_block(w, opts.reps, opts.ctas_per_sm, ceil, s, rows);
  for (const auto& w : select_workloads())
    if (selected(opts.workloads, w.id)) bench_select(w, opts.reps, ceil, s, rows);
  return rows;
}

}  // namespace flashkv::cli
