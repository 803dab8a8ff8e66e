#include "bench_cascade.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/reference.h"

namespace flashkv::cli {
namespace {

constexpr int kHq = 32, kHkv = 8, kD = 128;

// n requests sharing a prompt of `prompt` tokens, each with its own suffix; `copies` copies of
// the whole KV (different pages) so consecutive timed runs do not find it in L2.
struct SharedPromptBatch {
  int n = 0, page = 16, copies = 1;
  int64_t pages_per_copy = 0;
  std::vector<int64_t> lens;
  std::vector<int32_t> indptr{0}, last;
  std::vector<std::vector<int32_t>> indices;  // per copy
  DeviceBuffer k, v, q, idx;
  size_t kv_bytes_plain = 0, kv_bytes_unique = 0;
};

void build(SharedPromptBatch& b, int64_t prompt, uint64_t seed, DType dt, Stream s) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int64_t prompt_pages = (prompt + b.page - 1) / b.page;
  std::vector<std::vector<int32_t>> logical;
  int32_t next = static_cast<int32_t>(prompt_pages);
  for (int r = 0; r < b.n; ++r) {
    const int64_t suffix = 128 + rng() % 897;  // 128..1024
    std::vector<int32_t> p(prompt_pages);
    std::iota(p.begin(), p.end(), 0);
    for (int64_t t = 0; t < suffix; t += b.page) p.push_back(next++);
    b.lens.push_back(prompt_pages * b.page + suffix);
    b.indptr.push_back(b.indptr.back() + static_cast<int32_t>(p.size()));
    b.last.push_back(static_cast<int32_t>(b.lens.back() - (p.size() - 1) * b.page));
    logical.push_back(std::move(p));
  }
  b.pages_per_copy = next;
  const size_t token_bytes = size_t(2) * kHkv * kD * dtype_size(dt);
  b.kv_bytes_unique = size_t(next) * b.page * token_bytes;
  for (int64_t l : b.lens) b.kv_bytes_plain += l * token_bytes;
  b.copies = rotation_copies(b.kv_bytes_unique);
  const size_t page_elems = size_t(b.page) * kHkv * kD, total = page_elems * next * b.copies;
  b.k = DeviceBuffer(total * dtype_size(dt));
  b.v = DeviceBuffer(total * dtype_size(dt));
  device_fill_uniform(b.k.data(), dt, total, seed + 1, -1, 1, s);
  device_fill_uniform(b.v.data(), dt, total, seed + 2, -1, 1, s);
  b.q = DeviceBuffer(size_t(b.n) * kHq * kD * dtype_size(dt));
  device_fill_uniform(b.q.data(), dt, size_t(b.n) * kHq * kD, seed + 3, -1, 1, s);
  b.idx = DeviceBuffer(size_t(b.indptr.back()) * 4 * b.copies);
  for (int c = 0; c < b.copies; ++c) {
    std::vector<int32_t> perm(next);  // logical page -> physical page of this copy
    std::iota(perm.begin(), perm.end(), static_cast<int32_t>(c * next));
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> ids;
    for (const auto& p : logical)
      for (int32_t x : p) ids.push_back(perm[x]);
    b.idx.copy_from_host(ids.data(), ids.size() * 4, size_t(c) * b.indptr.back() * 4);
    b.indices.push_back(std::move(ids));
  }
}

PagedKVCache device_cache(const SharedPromptBatch& b, DType dt, int c) {
  const int64_t pages = b.pages_per_copy * b.copies;
  const Device g = Device::cuda(0);
  PagedKVCache kv;
  kv.k = TensorView(b.k.data(), dt, {pages, b.page, kHkv, kD}, g);
  kv.v = TensorView(b.v.data(), dt, {pages, b.page, kHkv, kD}, g);
  kv.indices = TensorView(static_cast<int32_t*>(b.idx.data()) + c * b.indptr.back(), DType::i32,
                          {b.indptr.back()}, g);
  kv.indptr = TensorView(b.idx.data(), DType::i32, {b.n + 1}, g);
  kv.last_page_len = TensorView(b.idx.data(), DType::i32, {b.n}, g);
  return kv;
}

}  // namespace

nlohmann::json bench_cascade(const CascadeBenchOptions& o, const Ceilings& ceil, Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  const DType dt = o.dtype;
  std::printf("%-4s %-7s %-8s %10s %10s %9s %8s %7s %s\n", "n", "prompt", "system", "time_us",
              "TB/s*", "%read*", "speedup", "levels", "check");
  uint64_t seed = 7;
  for (int64_t prompt : o.prompts) {
    for (int n : o.groups) {
      SharedPromptBatch b;
      b.n = n;
      b.page = o.page_size;
      build(b, prompt, seed++, dt, s);
      const Device g = Device::cuda(0);
      const TensorView q(b.q.data(), dt, {n, kHq, kD}, g);
      DeviceBuffer out_c(b.q.size()), out_p(b.q.size());
      const TensorView oc(out_c.data(), dt, {n, kHq, kD}, g), op(out_p.data(), dt, {n, kHq, kD}, g);

      // Plain batch decode.
      BatchDecodeConfig dcfg{n, kHq, kD};
      DeviceBuffer dws(BatchDecode::workspace_bytes(dcfg));
      BatchDecode dec(dcfg, dws.data(), dws.size());
      dec.plan(b.indptr.data(), b.last.data(), n, kHq, kHkv, kD, b.page, dt, dt, dt, {}, s);
      const Timing tp = time_on_stream(
          s, [&](int rep) { dec.run(q, device_cache(b, dt, rep % b.copies), op, {}, s); }, 5, o.reps);

      // The cascade (forced on: kAuto's choice is reported next to it).
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
      const CascadeShape shape{kHq, kHkv, kD, dt};
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
        per_copy.back()->plan({nullptr, b.indptr.data(), b.indices[c].data(), b.last.data(), n, b.page},
                              shape, forced, s);
      }
      const CascadePlanInfo info = per_copy[0]->plan_info();
      const Timing tc = time_on_stream(
          s,
          [&](int rep) {
            const int c = rep % b.copies;
            per_copy[c]->run(q, device_cache(b, dt, c), oc, {}, s);
          },
          5, o.reps);

      // Check: cascade and plain outputs of copy 0 against the CPU reference (request 0 and n-1).
      dec.run(q, device_cache(b, dt, 0), op, {}, s);
      per_copy[0]->run(q, device_cache(b, dt, 0), oc, {}, s);
      synchronize(s);
      std::vector<double> got_c, got_p, ref;
      for (int r : {0, n - 1}) {
        const int np = b.indptr[r + 1] - b.indptr[r];
        HostTensor kh(dt, {np, b.page, kHkv, kD}), vh = kh, qh(dt, {1, kHq, kD}), oh = qh, ph = qh;
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
      }
      const RefCheck rc = check_reference(got_c, ref, dt), rp = check_reference(got_p, ref, dt);
      // Bandwidth counted on the unique bytes (the prefix once), for both systems.
      const double bytes = double(b.kv_bytes_unique) + 2.0 * n * kHq * kD * dtype_size(dt);
      for (int sys = 0; sys < 2; ++sys) {
        const Timing& t = sys == 0 ? tp : tc;
        const double tbps = bytes / (t.median_us * 1e-6) / 1e12;
        const bool pass = sys == 0 ? rp.pass : rc.pass;
        std::printf("%-4d %-7lld %-8s %10.2f %10.3f %8.1f%% %7.2fx %7d %s%s\n", n,
                    (long long)prompt, sys == 0 ? "plain" : "cascade", t.median_us, tbps,
                    100 * tbps / ceil.read_tbps, tp.median_us / t.median_us,
                    sys == 0 ? 1 : info.num_levels, pass ? "ok" : "FAIL",
                    sys == 1 ? (auto_info.cascade ? " (auto: cascade)" : " (auto: plain)") : "");
        rows.push_back({{"workload", "cascade"},
                        {"n", n},
                        {"prompt", prompt},
                        {"shape", "gqa-32-8"},
                        {"dtype", dtype_name(dt)},
                        {"system", sys == 0 ? "flashkv-plain-decode" : "flashkv-cascade"},
                        {"time_us", t.median_us},
                        {"tbps_unique_bytes", tbps},
                        {"pct_read_ceiling_unique_bytes", 100 * tbps / ceil.read_tbps},
                        {"speedup_vs_plain", tp.median_us / t.median_us},
                        {"levels", sys == 0 ? 1 : info.num_levels},
                        {"auto_uses_cascade", auto_info.cascade},
                        {"estimated_plain_us", auto_info.estimated_plain_us},
                        {"estimated_cascade_us", auto_info.estimated_cascade_us},
                        {"rel_err", sys == 0 ? rp.err : rc.err},
                        {"bound", sys == 0 ? rp.bound : rc.bound},
                        {"pass", pass},
                        {"copies_rotated", b.copies}});
      }
      std::fflush(stdout);
      check(rc.pass && rp.pass, "bench cascade: n ", n, " prompt ", prompt,
            ": output failed the reference check");
    }
  }
  return rows;
}

}  // namespace flashkv::cli
