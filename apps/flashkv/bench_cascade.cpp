#include "bench_cascade.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>

#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/reference.h"
#include "scheduler/cascade_cost.h"

namespace flashkv::cli {

std::vector<CascadeBenchCase> default_cascade_grid() {
  const std::vector<int> all_n = {1, 2, 4, 8, 16, 32, 64}, shared_n = {2, 4, 8, 16, 32, 64};
  const std::vector<int64_t> all_prompts = {1024, 2048, 4096, 8192, 16384, 32768};
  return {
      {"gqa-32-8-d128", 32, 8, 128, 128, 1024, all_n, all_prompts},
      {"mha-32-32-d128", 32, 32, 128, 128, 1024, shared_n, all_prompts},
      {"gqa-32-8-d128", 32, 8, 128, 16, 128, shared_n, all_prompts},
      {"gqa-32-8-d128", 32, 8, 128, 2048, 4096, shared_n, all_prompts},
      {"gqa-32-8-d64", 32, 8, 64, 128, 1024, {2, 4, 16, 64}, {2048, 8192, 32768}},
      {"gqa-32-8-d256", 32, 8, 256, 128, 1024, {2, 4, 16, 64}, {2048, 8192, 32768}},
  };
}

namespace {

// n requests sharing a prompt of `prompt` tokens, each with its own suffix; `copies` copies of
// the whole KV (different pages) so consecutive timed runs do not find it in L2.
struct SharedPromptBatch {
  int n = 0, page = 16, copies = 1;
  int hq = 0, hkv = 0, d = 0;
  int64_t pages_per_copy = 0, prefix_tokens = 0, suffix_tokens = 0;
  std::vector<int64_t> lens;
  std::vector<int32_t> indptr{0}, last;
  std::vector<std::vector<int32_t>> indices;  // per copy
  DeviceBuffer k, v, q, idx;
  size_t kv_bytes_plain = 0, kv_bytes_unique = 0;
};

void build(SharedPromptBatch& b, const CascadeBenchCase& c, int64_t prompt, uint64_t seed, DType dt,
           Stream s) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int64_t prompt_pages = (prompt + b.page - 1) / b.page;
  b.prefix_tokens = prompt_pages * b.page;
  std::vector<std::vector<int32_t>> logical;
  int32_t next = static_cast<int32_t>(prompt_pages);
  for (int r = 0; r < b.n; ++r) {
    const int64_t suffix = c.suffix_tokens(r, b.n);
    b.suffix_tokens += suffix;
    std::vector<int32_t> p(prompt_pages);
    std::iota(p.begin(), p.end(), 0);
    for (int64_t t = 0; t < suffix; t += b.page) p.push_back(next++);
    b.lens.push_back(prompt_pages * b.page + suffix);
    b.indptr.push_back(b.indptr.back() + static_cast<int32_t>(p.size()));
    b.last.push_back(static_cast<int32_t>(b.lens.back() - (p.size() - 1) * b.page));
    logical.push_back(std::move(p));
  }
  b.pages_per_copy = next;
  const size_t token_bytes = size_t(2) * b.hkv * b.d * dtype_size(dt);
  b.kv_bytes_unique = size_t(b.prefix_tokens + b.suffix_tokens) * token_bytes;
  for (int64_t l : b.lens) b.kv_bytes_plain += l * token_bytes;
  b.copies = rotation_copies(b.kv_bytes_unique);
  const size_t page_elems = size_t(b.page) * b.hkv * b.d, total = page_elems * next * b.copies;
  b.k = DeviceBuffer(total * dtype_size(dt));
  b.v = DeviceBuffer(total * dtype_size(dt));
  device_fill_uniform(b.k.data(), dt, total, seed + 1, -1, 1, s);
  device_fill_uniform(b.v.data(), dt, total, seed + 2, -1, 1, s);
  b.q = DeviceBuffer(size_t(b.n) * b.hq * b.d * dtype_size(dt));
  device_fill_uniform(b.q.data(), dt, size_t(b.n) * b.hq * b.d, seed + 3, -1, 1, s);
  b.idx = DeviceBuffer(size_t(b.indptr.back()) * 4 * b.copies);
  for (int copy = 0; copy < b.copies; ++copy) {
    std::vector<int32_t> perm(next);  // logical page -> physical page of this copy
    std::iota(perm.begin(), perm.end(), static_cast<int32_t>(copy * next));
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> ids;
    for (const auto& p : logical)
      for (int32_t x : p) ids.push_back(perm[x]);
    b.idx.copy_from_host(ids.data(), ids.size() * 4, size_t(copy) * b.indptr.back() * 4);
    b.indices.push_back(std::move(ids));
  }
}

PagedKVCache device_cache(const SharedPromptBatch& b, DType dt, int c) {
  const int64_t pages = b.pages_per_copy * b.copies;
  const Device g = Device::cuda(0);
  PagedKVCache kv;
  kv.k = TensorView(b.k.data(), dt, {pages, b.page, b.hkv, b.d}, g);
  kv.v = TensorView(b.v.data(), dt, {pages, b.page, b.hkv, b.d}, g);
  kv.indices = TensorView(static_cast<int32_t*>(b.idx.data()) + c * b.indptr.back(), DType::i32,
                          {b.indptr.back()}, g);
  kv.indptr = TensorView(b.idx.data(), DType::i32, {b.n + 1}, g);
  kv.last_page_len = TensorView(b.idx.data(), DType::i32, {b.n}, g);
  return kv;
}

std::string config_name(const CascadeBenchCase& c, int n, int64_t prompt) {
  return c.shape + " suffix " + std::to_string(c.suffix_min) + "-" + std::to_string(c.suffix_max) +
         " n " + std::to_string(n) + " prompt " + std::to_string(prompt);
}

}  // namespace

nlohmann::json bench_cascade(const CascadeBenchOptions& o, const Ceilings& ceil, Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::string> failures;
  const DType dt = o.dtype;
  const auto t_start = std::chrono::steady_clock::now();
  std::printf(
      "auto: the cost model's choice (est_* its estimates); auto/best: the chosen path's time over "
      "the faster one's (FAIL above %.0f%%)\n",
      100 * o.auto_tolerance);
  std::printf("%-15s %-9s %-3s %-6s %9s %9s %7s %9s %9s %-7s %8s %6s %6s %s\n", "shape", "suffix",
              "n", "prompt", "plain_us", "casc_us", "speedup", "est_plain", "est_casc", "auto",
              "auto/bst", "%rd_p*", "%rd_c*", "check");
  uint64_t seed = 7;
  for (const CascadeBenchCase& cs : o.cases) {
    const int kHq = cs.num_qo_heads, kHkv = cs.num_kv_heads, kD = cs.head_dim;
    for (int64_t prompt : cs.prompts) {
      for (int n : cs.groups) {
        SharedPromptBatch b;
        b.n = n;
        b.page = o.page_size;
        b.hq = kHq;
        b.hkv = kHkv;
        b.d = kD;
        build(b, cs, prompt, seed++, dt, s);
        const Device g = Device::cuda(0);
        const TensorView q(b.q.data(), dt, {n, kHq, kD}, g);
        DeviceBuffer out_c(b.q.size()), out_p(b.q.size());
        const TensorView oc(out_c.data(), dt, {n, kHq, kD}, g),
            op(out_p.data(), dt, {n, kHq, kD}, g);

        // Plain batch decode.
        BatchDecodeConfig dcfg{n, kHq, kD};
        DeviceBuffer dws(BatchDecode::workspace_bytes(dcfg));
        BatchDecode dec(dcfg, dws.data(), dws.size());
        dec.plan({.kv_indptr = b.indptr.data(),
                  .kv_last_page_len = b.last.data(),
                  .batch_size = n,
                  .page_size = b.page},
                 {.num_qo_heads = kHq,
                  .num_kv_heads = kHkv,
                  .head_dim = kD,
                  .q_dtype = dt,
                  .kv_dtype = dt,
                  .o_dtype = dt},
                 {}, s);
        const Timing tp = time_on_stream(
            s, [&](int rep) { dec.run(q, device_cache(b, dt, rep % b.copies), op, {}, s); }, 5,
            o.reps);

        // The cascade (forced on: kAuto's choice and estimates are reported next to it).
        MultiLevelCascadeConfig ccfg;
        ccfg.max_batch = n;
        ccfg.max_pages = b.indptr.back();
        ccfg.num_qo_heads = kHq;
        ccfg.head_dim = kD;
        ccfg.max_levels = 2;
        DeviceBuffer cws(MultiLevelCascade::workspace_bytes(ccfg));
        MultiLevelCascade casc(ccfg, cws.data(), cws.size());
        CascadePlanOptions auto_opts, forced;
        forced.use = CascadePlanOptions::Use::kAlways;
        CascadeShape shape;
        shape.num_qo_heads = kHq;
        shape.num_kv_heads = kHkv;
        shape.head_dim = kD;
        shape.dtype = dt;
        casc.plan({nullptr, b.indptr.data(), b.indices[0].data(), b.last.data(), n, b.page}, shape,
                  auto_opts, s);
        const CascadePlanInfo auto_info = casc.plan_info();
        // Each copy has its own page ids: one plan per copy, rotated with the copies.
        std::vector<std::unique_ptr<MultiLevelCascade>> per_copy;
        std::vector<DeviceBuffer> per_ws;
        for (int c = 0; c < b.copies; ++c) {
          per_ws.emplace_back(MultiLevelCascade::workspace_bytes(ccfg));
          per_copy.push_back(std::make_unique<MultiLevelCascade>(ccfg, per_ws.back().data(),
                                                                 per_ws.back().size()));
          per_copy.back()->plan(
              {nullptr, b.indptr.data(), b.indices[c].data(), b.last.data(), n, b.page}, shape,
              forced, s);
        }
        const CascadePlanInfo info = per_copy[0]->plan_info();
        const Timing tc = time_on_stream(
            s,
            [&](int rep) {
              const int c = rep % b.copies;
              per_copy[c]->run(q, device_cache(b, dt, c), oc, {}, s);
            },
            5, o.reps);

        // Check: cascade and plain outputs of copy 0 against the CPU reference (requests 0 and
        // n-1).
        dec.run(q, device_cache(b, dt, 0), op, {}, s);
        per_copy[0]->run(q, device_cache(b, dt, 0), oc, {}, s);
        synchronize(s);
        std::vector<double> got_c, got_p, ref;
        for (int r : {0, n - 1}) {
          const int np = b.indptr[r + 1] - b.indptr[r];
          HostTensor kh(dt, {np, b.page, kHkv, kD}), vh = kh, qh(dt, {1, kHq, kD}), oh = qh,
                                                     ph = qh;
          const size_t page_bytes = size_t(b.page) * kHkv * kD * dtype_size(dt);
          for (int p = 0; p < np; ++p) {
            const size_t src = size_t(b.indices[0][b.indptr[r] + p]) * page_bytes;
            b.k.copy_to_host(static_cast<char*>(kh.data()) + p * page_bytes, page_bytes, src);
            b.v.copy_to_host(static_cast<char*>(vh.data()) + p * page_bytes, page_bytes, src);
          }
          const size_t row = qh.nbytes();
          b.q.copy_to_host(qh.data(), row, r * row);
          out_c.copy_to_host(oh.data(), row, r * row);
          out_p.copy_to_host(ph.data(), row, r * row);
          const HostTensor rf = reference_decode_request(kh, vh, b.last[r], qh);
          for (double x : oh.to_doubles()) got_c.push_back(x);
          for (double x : ph.to_doubles()) got_p.push_back(x);
          for (double x : rf.to_doubles()) ref.push_back(x);
          if (n == 1) break;
        }
        const RefCheck rc = check_reference(got_c, ref, dt), rp = check_reference(got_p, ref, dt);

        // The automatic choice, judged where there is a choice (a shared prefix: two levels).
        const bool shared = info.num_levels > 1;
        const scheduler::CascadeChoiceCheck verdict = scheduler::check_cascade_choice(
            tp.median_us, tc.median_us, auto_info.cascade, o.auto_tolerance);
        const bool auto_ok = !shared || verdict.ok;
        const std::string name = config_name(cs, n, prompt);
        if (!auto_ok) {
          char line[256];
          std::snprintf(line, sizeof line,
                        "%s: auto chose %s (%.1f us) but %s is faster (%.1f us): %.1f%% slower",
                        name.c_str(), auto_info.cascade ? "cascade" : "plain", verdict.chosen_us,
                        auto_info.cascade ? "plain" : "cascade", verdict.best_us,
                        100 * verdict.slowdown);
          failures.push_back(line);
        }
        if (!rc.pass || !rp.pass)
          failures.push_back(name + ": output failed the reference check (" +
                             (rp.pass ? "" : "plain ") + (rc.pass ? "" : "cascade") + ")");

        // Bandwidth counted on the unique bytes (the prefix once), for both paths.
        const double bytes = double(b.kv_bytes_unique) + 2.0 * n * kHq * kD * dtype_size(dt);
        const double tbps_p = bytes / (tp.median_us * 1e-6) / 1e12,
                     tbps_c = bytes / (tc.median_us * 1e-6) / 1e12;
        const std::string suffix =
            std::to_string(cs.suffix_min) + "-" + std::to_string(cs.suffix_max);
        std::printf(
            "%-15s %-9s %-3d %-6lld %9.2f %9.2f %6.2fx %9.2f %9.2f %-7s %7.1f%% %5.1f%% %5.1f%% "
            "%s%s [%.0f s]\n",
            cs.shape.c_str(), suffix.c_str(), n, (long long)prompt, tp.median_us, tc.median_us,
            tp.median_us / tc.median_us, auto_info.estimated_plain_us,
            auto_info.estimated_cascade_us,
            shared ? (auto_info.cascade ? "cascade" : "plain") : "-",
            100 * (verdict.chosen_us / verdict.best_us), 100 * tbps_p / ceil.read_tbps,
            100 * tbps_c / ceil.read_tbps, rc.pass && rp.pass ? "ok" : "REF-FAIL",
            auto_ok ? "" : " FAIL: auto chose the slower path",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
        rows.push_back({{"workload", "cascade"},
                        {"shape", cs.shape},
                        {"num_qo_heads", kHq},
                        {"num_kv_heads", kHkv},
                        {"head_dim", kD},
                        {"dtype", dtype_name(dt)},
                        {"page_size", b.page},
                        {"n", n},
                        {"prompt", prompt},
                        {"suffix_min", cs.suffix_min},
                        {"suffix_max", cs.suffix_max},
                        {"prefix_tokens", b.prefix_tokens},
                        {"suffix_tokens", b.suffix_tokens},
                        {"kv_bytes_plain", b.kv_bytes_plain},
                        {"kv_bytes_unique", b.kv_bytes_unique},
                        {"plain_us", tp.median_us},
                        {"plain_min_us", tp.min_us},
                        {"cascade_us", tc.median_us},
                        {"cascade_min_us", tc.min_us},
                        {"cascade_levels", info.num_levels},
                        {"speedup_cascade_vs_plain", tp.median_us / tc.median_us},
                        {"estimated_plain_us", auto_info.estimated_plain_us},
                        {"estimated_cascade_us", auto_info.estimated_cascade_us},
                        {"auto", shared ? (auto_info.cascade ? "cascade" : "plain")
                                        : "plain (no shared prefix)"},
                        {"auto_uses_cascade", auto_info.cascade},
                        {"auto_us", verdict.chosen_us},
                        {"best_us", verdict.best_us},
                        {"auto_slowdown", verdict.slowdown},
                        {"auto_checked", shared},
                        {"auto_ok", auto_ok},
                        {"tbps_unique_bytes_plain", tbps_p},
                        {"tbps_unique_bytes_cascade", tbps_c},
                        {"plain_rel_err", rp.err},
                        {"cascade_rel_err", rc.err},
                        {"bound", rc.bound},
                        {"ref_ok", rc.pass && rp.pass},
                        {"copies_rotated", b.copies}});
        std::fflush(stdout);
      }
    }
  }
  // The command fails on these after writing --json (cmd_bench.cpp: count_cascade_failures).
  for (const std::string& f : failures) std::printf("FAIL %s\n", f.c_str());
  std::fflush(stdout);
  return rows;
}

int count_cascade_failures(const nlohmann::json& rows) {
  int n = 0;
  for (const auto& r : rows) n += !r.value("auto_ok", true) || !r.value("ref_ok", true);
  return n;
}

}  // namespace flashkv::cli
