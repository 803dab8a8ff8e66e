#include "bench_decode.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/reference.h"

namespace flashkv::cli {
namespace {

constexpr size_t kL2RotateBytes = size_t(200) << 20;  // rotate input copies until 4x the 50 MB L2

struct DecodeSetup {
  int B, Hq, Hkv, D, page;
  DType dt;
  std::vector<int64_t> lens;
  int64_t pages_per_copy = 0;
  int copies = 1;
  std::vector<int32_t> indptr, last;
  std::vector<std::vector<int32_t>> indices;  // per copy
  DeviceBuffer k, v, q, out, idx;
  size_t bytes_moved = 0;
};

void build(DecodeSetup& st, uint64_t seed, Stream s) {
  st.indptr = {0};
  int64_t tokens = 0;
  for (int64_t l : st.lens) {
    const int64_t p = (l + st.page - 1) / st.page;
    st.indptr.push_back(static_cast<int32_t>(st.indptr.back() + p));
    st.last.push_back(static_cast<int32_t>(p ? l - (p - 1) * st.page : 0));
    tokens += l;
  }
  st.pages_per_copy = st.indptr.back();
  const size_t kv_bytes = size_t(tokens) * st.Hkv * st.D * 2 * dtype_size(st.dt);
  st.copies = static_cast<int>(
      std::clamp<size_t>((kL2RotateBytes + kv_bytes - 1) / std::max<size_t>(kv_bytes, 1), 1, 8));
  const size_t page_elems = size_t(st.page) * st.Hkv * st.D;
  const size_t total_pages = size_t(st.pages_per_copy) * st.copies;
  st.k = DeviceBuffer(total_pages * page_elems * dtype_size(st.dt));
  st.v = DeviceBuffer(total_pages * page_elems * dtype_size(st.dt));
  device_fill_uniform(st.k.data(), st.dt, total_pages * page_elems, seed, -1, 1, s);
  device_fill_uniform(st.v.data(), st.dt, total_pages * page_elems, seed + 1, -1, 1, s);
  const size_t q_elems = size_t(st.B) * st.Hq * st.D;
  st.q = DeviceBuffer(std::max<size_t>(q_elems * dtype_size(st.dt) * st.copies, 16));
  device_fill_uniform(st.q.data(), st.dt, q_elems * st.copies, seed + 2, -1, 1, s);
  st.out = DeviceBuffer(std::max<size_t>(q_elems * dtype_size(st.dt), 16));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  st.idx = DeviceBuffer(std::max<size_t>(total_pages * 4, 16));
  for (int c = 0; c < st.copies; ++c) {
    std::vector<int32_t> perm(st.pages_per_copy);
    std::iota(perm.begin(), perm.end(), static_cast<int32_t>(c * st.pages_per_copy));
    std::shuffle(perm.begin(), perm.end(), rng);  // scattered pages, as a real cache has
    st.idx.copy_from_host(perm.data(), perm.size() * 4, size_t(c) * st.pages_per_copy * 4);
    st.indices.push_back(std::move(perm));
  }
  st.bytes_moved = 2 * q_elems * dtype_size(st.dt) + kv_bytes;
}

PagedKVCache device_cache(const DecodeSetup& st, int copy) {
  const int64_t total_pages = st.pages_per_copy * st.copies;
  PagedKVCache c;
  c.k = TensorView(st.k.data(), st.dt, {total_pages, st.page, st.Hkv, st.D}, Device::cuda(0));
  c.v = TensorView(st.v.data(), st.dt, {total_pages, st.page, st.Hkv, st.D}, Device::cuda(0));
  c.indices = TensorView(static_cast<int32_t*>(st.idx.data()) + copy * st.pages_per_copy,
                         DType::i32, {std::max<int64_t>(st.pages_per_copy, 1)}, Device::cuda(0));
  // indptr / last_page_len are only read on the host (plan); their device views carry shapes.
  c.indptr = TensorView(st.idx.data(), DType::i32, {st.B + 1}, Device::cuda(0));
  c.last_page_len = TensorView(st.idx.data(), DType::i32, {st.B}, Device::cuda(0));
  return c;
}

// Relative error of up to 4 sampled requests of copy 0 against the CPU reference.
double check_sampled(const DecodeSetup& st, float sm_scale) {
  std::vector<int> reqs = {0, st.B / 3, (2 * st.B) / 3, st.B - 1};
  std::sort(reqs.begin(), reqs.end());
  reqs.erase(std::unique(reqs.begin(), reqs.end()), reqs.end());
  const size_t esz = dtype_size(st.dt);
  const size_t page_bytes = size_t(st.page) * st.Hkv * st.D * esz;
  const size_t row_bytes = size_t(st.Hq) * st.D * esz;
  std::vector<double> got_all, ref_all, lowp_all;
  for (int r : reqs) {
    const int np = st.indptr[r + 1] - st.indptr[r];
    HostTensor k(st.dt, {std::max(np, 1), st.page, st.Hkv, st.D}),
        v(st.dt, {std::max(np, 1), st.page, st.Hkv, st.D});
    for (int p = 0; p < np; ++p) {
      const size_t src = size_t(st.indices[0][st.indptr[r] + p]) * page_bytes;
      st.k.copy_to_host(static_cast<char*>(k.data()) + p * page_bytes, page_bytes, src);
      st.v.copy_to_host(static_cast<char*>(v.data()) + p * page_bytes, page_bytes, src);
    }
    HostTensor q(st.dt, {1, st.Hq, st.D}), out(st.dt, {1, st.Hq, st.D});
    st.q.copy_to_host(q.data(), row_bytes, r * row_bytes);
    st.out.copy_to_host(out.data(), row_bytes, r * row_bytes);
    std::vector<int32_t> ind(np > 0 ? np : 1);
    std::iota(ind.begin(), ind.end(), 0);
    std::vector<int32_t> iptr = {0, np}, lst = {st.last[r]};
    PagedKVCache c;
    c.k = k.view();
    c.v = v.view();
    c.indptr = TensorView(iptr.data(), DType::i32, {2});
    c.indices = TensorView(ind.data(), DType::i32, {static_cast<int64_t>(ind.size())});
    c.last_page_len = TensorView(lst.data(), DType::i32, {1});
    HostTensor ref(DType::f32, {1, st.Hq, st.D}), lowp(st.dt, {1, st.Hq, st.D});
    AttentionOptions ao;
    ao.sm_scale = sm_scale;
    reference::batch_decode(q.view(), c, ref.view(), TensorView(), ao);
    for (double x : out.to_doubles()) got_all.push_back(x);
    for (double x : ref.to_doubles()) ref_all.push_back(x);
  }
  return relative_error(got_all, ref_all);
}

}  // namespace

nlohmann::json bench_decode(const DecodeBenchOptions& o, const Ceilings& ceil, Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  const auto wls =
      o.workloads_file.empty() ? standard_workloads() : read_workloads(o.workloads_file);
  const auto shapes = standard_shapes();
  uint64_t seed = 1;
  std::printf("%-4s %-10s %-5s %10s %8s %7s %9s %s\n", "wl", "shape", "dtype", "time_us", "TB/s",
              "%read", "rel_err", "plan");
  for (const auto& w : wls) {
    if (w.kind != "decode") continue;
    if (!o.workloads.empty() &&
        std::find(o.workloads.begin(), o.workloads.end(), w.id) == o.workloads.end())
      continue;
    for (const auto& sh : shapes) {
      if (!o.shapes.empty() &&
          std::find(o.shapes.begin(), o.shapes.end(), sh.name) == o.shapes.end())
        continue;
      for (DType dt : o.dtypes) {
        DecodeSetup st{static_cast<int>(w.lens.size()),
                       sh.num_qo_heads,
                       sh.num_kv_heads,
                       o.head_dim,
                       o.page_size,
                       dt,
                       w.lens};
        build(st, seed++, s);
        BatchDecodeConfig cfg{st.B, st.Hq, st.D};
        cfg.ctas_per_sm = o.ctas_per_sm;
        DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
        BatchDecode dec(cfg, ws.data(), ws.size());
        DecodePlanOptions po;
        po.backend = o.backend == "cuda" ? DecodeBackend::kCudaCores
                     : o.backend == "tc" ? DecodeBackend::kTensorCores
                                         : DecodeBackend::kAuto;
        dec.plan(st.indptr.data(), st.last.data(), st.B, st.Hq, st.Hkv, st.D, st.page, dt, dt, dt,
                 po, s);
        std::vector<PagedKVCache> caches;
        for (int c = 0; c < st.copies; ++c) caches.push_back(device_cache(st, c));
        const size_t q_bytes = size_t(st.B) * st.Hq * st.D * dtype_size(dt);
        auto qview = [&](int c) {
          return TensorView(static_cast<char*>(st.q.data()) + c * q_bytes, dt, {st.B, st.Hq, st.D},
                            Device::cuda(0));
        };
        const TensorView out(st.out.data(), dt, {st.B, st.Hq, st.D}, Device::cuda(0));
        const Timing t = time_on_stream(
            s,
            [&](int rep) {
              const int c = rep % st.copies;
              dec.run(qview(c), caches[c], out, TensorView(), s);
            },
            5, o.reps);
        // Re-run copy 0 for the check.
        dec.run(qview(0), caches[0], out, TensorView(), s);
        synchronize(s);
        const double err = check_sampled(st, 0.f);
        const double tbps = st.bytes_moved / (t.median_us * 1e-6) / 1e12;
        const auto info = dec.plan_info();
        std::printf("%-4s %-10s %-5s %10.2f %8.3f %6.1f%% %9.2e %s %d items/%d split, %.1f us\n",
                    w.id.c_str(), sh.name.c_str(), dtype_name(dt), t.median_us, tbps,
                    100 * tbps / ceil.read_tbps, err, info.tensor_cores ? "tc" : "cc",
                    info.num_work_items, info.num_split_tiles, info.plan_us);
        std::fflush(stdout);
        rows.push_back({{"workload", w.id},
                        {"shape", sh.name},
                        {"dtype", dtype_name(dt)},
                        {"system", "flashkv"},
                        {"time_us", t.median_us},
                        {"min_us", t.min_us},
                        {"tbps", tbps},
                        {"tflops", nullptr},
                        {"pct_read_ceiling", 100 * tbps / ceil.read_tbps},
                        {"rel_err", err},
                        {"bytes", st.bytes_moved},
                        {"copies_rotated", st.copies},
                        {"work_items", info.num_work_items},
                        {"split_tiles", info.num_split_tiles},
                        {"kernel", info.tensor_cores ? "tensor-cores" : "cuda-cores"}});
      }
    }
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
    std::vector<double> us;
    for (int rep = 0; rep < 50; ++rep) {
      dec.plan(indptr.data(), last.data(), B, 32, 8, 128, 16, DType::f16, DType::f16, DType::f16,
               {}, s);
      us.push_back(dec.plan_info().plan_us);
    }
    std::sort(us.begin(), us.end());
    std::printf("plan() batch %4d: median %.1f us (min %.1f)\n", B, us[us.size() / 2], us.front());
    rows.push_back(
        {{"batch", B}, {"plan_us_median", us[us.size() / 2]}, {"plan_us_min", us.front()}});
  }
  synchronize(s);
  return rows;
}

}  // namespace flashkv::cli
