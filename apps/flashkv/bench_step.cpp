#include "bench_step.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "flashkv/decode.h"
#include "flashkv/device_errors.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/kv_ops.h"
#include "flashkv/reference.h"
#include "runtime/driver.h"
#include "workloads.h"

namespace flashkv::cli {
namespace {

using runtime::check_cu;
using runtime::driver;

// Llama-3.1-8B attention: 32 layers, 32 query heads, 8 KV heads, head_dim 128.
constexpr int kLayers = 32, kHq = 32, kHkv = 8, kD = 128;

// One layer's state: its own paged cache (a real model has one per layer, and 32 of them keep
// the L2 from holding a small batch's whole KV), its new q / k / v and its output.
struct Layer {
  BenchPagedKV kv;
  DeviceBuffer q, k, v, out_unfused, out_fused;
};

TensorView dev_view(const DeviceBuffer& b, DType dt, std::initializer_list<int64_t> shape) {
  return TensorView(b.data(), dt, shape, Device::cuda(0));
}

struct StepCase {
  std::string name;           // a workload id, or "" for a (batch, kv_len) case
  std::vector<int64_t> lens;  // KV length per request, the new token included
};

// Captures `body` on `s` into an instantiated graph.
CUgraphExec capture(Stream s, const std::function<void()>& body) {
  const runtime::Driver& d = driver();
  check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
  body();
  CUgraph g;
  check_cu(d.cuStreamEndCapture(s, &g), "end capture");
  CUgraphExec e;
  check_cu(d.cuGraphInstantiate(&e, g, 0), "instantiate");
  d.cuGraphDestroy(g);
  return e;
}

}  // namespace

nlohmann::json bench_step(const StepBenchOptions& o, const Ceilings& ceil, Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  const DType dt = o.dtype;
  const DType kvt = is_fp8_dtype(o.kv_dtype) ? o.kv_dtype : dt;  // the caches' (fp8: quantized)
  std::printf("%-6s %-6s %-6s %-18s %9s %9s %10s %s\n", "case", "batch", "kv", "mode", "us/token",
              "launches", "speedup", "check");
  // The cases: every (batch, kv_len), then the named workloads with their own lengths.
  std::vector<StepCase> cases;
  for (int B : o.batches)
    for (int64_t kv_len : o.kv_lens) cases.push_back({"", std::vector<int64_t>(B, kv_len)});
  for (const std::string& id : o.workloads) {
    const auto all = standard_workloads();
    const auto it = std::find_if(all.begin(), all.end(), [&](const Workload& w) {
      return w.id == id && w.kind == "decode";
    });
    check(it != all.end(), "bench step: --step-workloads takes decode workloads (D1-D6), got ", id);
    cases.push_back({id, it->lens});
  }
  for (const StepCase& c : cases) {
    {
      const int B = static_cast<int>(c.lens.size());
      const int64_t kv_len = c.lens.front();  // the label of a uniform case
      // The page table after the append: every request's new token is at its kv_len - 1.
      std::vector<Layer> layers(kLayers);
      const size_t q_elems = size_t(B) * kHq * kD, kv_elems = size_t(B) * kHkv * kD;
      for (int l = 0; l < kLayers; ++l) {
        Layer& L = layers[l];
        L.kv.num_kv_heads = kHkv;
        L.kv.head_dim = kD;
        L.kv.page_size = o.page_size;
        L.kv.dtype = kvt;
        L.kv.lens = c.lens;
        L.kv.build(1, 1000 + l, s);
        L.q = DeviceBuffer(q_elems * dtype_size(dt));
        L.k = DeviceBuffer(kv_elems * dtype_size(dt));
        L.v = DeviceBuffer(kv_elems * dtype_size(dt));
        L.out_unfused = DeviceBuffer(q_elems * dtype_size(dt));
        L.out_fused = DeviceBuffer(q_elems * dtype_size(dt));
        device_fill_uniform(L.q.data(), dt, q_elems, 10 * l + 1, -1, 1, s);
        device_fill_uniform(L.k.data(), dt, kv_elems, 10 * l + 2, -1, 1, s);
        device_fill_uniform(L.v.data(), dt, kv_elems, 10 * l + 3, -1, 1, s);
      }
      const BenchPagedKV& kv0 = layers[0].kv;
      // Device page-table arrays (the append checks positions against them) and positions.
      std::vector<int32_t> pos(B), bi(B);
      for (int i = 0; i < B; ++i) pos[i] = static_cast<int32_t>(c.lens[i] - 1);
      std::iota(bi.begin(), bi.end(), 0);
      DeviceBuffer d_indptr(kv0.indptr.size() * 4),
          d_last(std::max<size_t>(kv0.last.size() * 4, 4)), d_pos(B * 4), d_bi(B * 4),
          q_rope(q_elems * dtype_size(dt)), k_rope(kv_elems * dtype_size(dt));
      d_indptr.copy_from_host(kv0.indptr.data(), kv0.indptr.size() * 4, 0);
      d_last.copy_from_host(kv0.last.data(), kv0.last.size() * 4, 0);
      d_pos.copy_from_host(pos.data(), B * 4, 0);
      d_bi.copy_from_host(bi.data(), B * 4, 0);
      std::vector<PagedKVCache> caches;
      for (auto& L : layers) {
        PagedKVCache c = L.kv.device_view(0);
        c.indptr = dev_view(d_indptr, DType::i32, {B + 1});
        c.last_page_len = dev_view(d_last, DType::i32, {B});
        caches.push_back(c);
      }
      const TensorView posv = dev_view(d_pos, DType::i32, {B}),
                       biv = dev_view(d_bi, DType::i32, {B});
      const TensorView qr = dev_view(q_rope, dt, {B, kHq, kD}),
                       kr = dev_view(k_rope, dt, {B, kHkv, kD});
      DecodeStepOptions step;
      step.rope = DecodeStepOptions::Rope::kLlama31;

      // One object per mode: graphs need fixed grids (enable_cuda_graph), eager runs do not.
      BatchDecodeConfig cfg{B, kHq, kD};
      DeviceBuffer ws_e(BatchDecode::workspace_bytes(cfg)), ws_g(BatchDecode::workspace_bytes(cfg));
      DeviceBuffer ws_n(BatchDecode::workspace_bytes(cfg));
      BatchDecode eager(cfg, ws_e.data(), ws_e.size()), graphed(cfg, ws_g.data(), ws_g.size()),
          graphed_nopdl(cfg, ws_n.data(), ws_n.size());
      DecodePlanOptions po;
      const DecodeBatch batch{.kv_indptr = kv0.indptr.data(),
                              .kv_last_page_len = kv0.last.data(),
                              .batch_size = B,
                              .page_size = o.page_size};
      const AttentionShape shape{.num_qo_heads = kHq,
                                 .num_kv_heads = kHkv,
                                 .head_dim = kD,
                                 .q_dtype = dt,
                                 .kv_dtype = kvt,
                                 .o_dtype = dt};
      eager.plan(batch, shape, po, s);
      po.enable_cuda_graph = true;
      graphed.plan(batch, shape, po, s);
      po.enable_pdl = false;
      graphed_nopdl.plan(batch, shape, po, s);

      auto unfused = [&](BatchDecode& dec) {
        for (int l = 0; l < kLayers; ++l) {
          Layer& L = layers[l];
          apply_llama31_rope_pos_ids(dev_view(L.q, dt, {B, kHq, kD}),
                                     dev_view(L.k, dt, {B, kHkv, kD}), qr, kr, posv, step.llama31,
                                     s);
          append_paged_kv_cache(kr, dev_view(L.v, dt, {B, kHkv, kD}), biv, posv, caches[l], s);
          dec.run(qr, caches[l], dev_view(L.out_unfused, dt, {B, kHq, kD}), TensorView(), s);
        }
      };
      auto fused = [&](BatchDecode& dec) {
        for (int l = 0; l < kLayers; ++l) {
          Layer& L = layers[l];
          dec.run_step(dev_view(L.q, dt, {B, kHq, kD}), dev_view(L.k, dt, {B, kHkv, kD}),
                       dev_view(L.v, dt, {B, kHkv, kD}), caches[l],
                       dev_view(L.out_fused, dt, {B, kHq, kD}), TensorView(), step, s);
        }
      };
      // 32 plain decode calls (no RoPE, no append): decode as a model's layers run it.
      auto decode_only = [&](BatchDecode& dec) {
        for (int l = 0; l < kLayers; ++l)
          dec.run(dev_view(layers[l].q, dt, {B, kHq, kD}), caches[l],
                  dev_view(layers[l].out_unfused, dt, {B, kHq, kD}), TensorView(), s);
      };
      CUgraphExec g_unfused = capture(s, [&] { unfused(graphed); });
      CUgraphExec g_fused = capture(s, [&] { fused(graphed); });
      CUgraphExec g_fused_nopdl = capture(s, [&] { fused(graphed_nopdl); });
      CUgraphExec g_decode = capture(s, [&] { decode_only(graphed); });
      CUgraphExec g_decode_nopdl = capture(s, [&] { decode_only(graphed_nopdl); });
      const auto replay = [&](CUgraphExec g) {
        return [&s, g](int) { check_cu(driver().cuGraphLaunch(g, s), "launch"); };
      };

      struct Mode {
        const char* name;
        int launches;
        std::function<void(int)> fn;
      };
      const std::vector<Mode> modes = {
          {"unfused", 3 * kLayers, [&](int) { unfused(eager); }},
          {"fused", kLayers, [&](int) { fused(eager); }},
          {"unfused+graph", 3 * kLayers, replay(g_unfused)},
          {"fused+graph", kLayers, replay(g_fused)},
          {"fused+graph-nopdl", kLayers, replay(g_fused_nopdl)},
          {"decode+graph", kLayers, replay(g_decode)},
          {"decode+graph-nopdl", kLayers, replay(g_decode_nopdl)},
      };
      // Bytes one layer's decode must read (K and V of every request) and move for q and out.
      int64_t tokens = 0;
      for (int64_t l : c.lens) tokens += l;
      const double layer_bytes =
          double(tokens) * kHkv * kD * 2 * double(dtype_size(kvt)) + 2.0 * q_elems * dtype_size(dt);
      std::vector<double> us;
      for (const Mode& m : modes) us.push_back(time_on_stream(s, m.fn, 3, o.reps).median_us);

      // Check: fused and unfused outputs of every layer agree bitwise (same cache contents, same
      // rounding), and layer 0's fused output of request 0 matches the CPU reference on the
      // updated cache and the GPU-rotated q.
      unfused(eager);
      fused(eager);
      synchronize(s);
      bool bitwise = true;
      std::vector<char> a(q_elems * dtype_size(dt)), b(a.size());
      for (auto& L : layers) {
        L.out_unfused.copy_to_host(a.data(), a.size(), 0);
        L.out_fused.copy_to_host(b.data(), b.size(), 0);
        bitwise = bitwise && std::memcmp(a.data(), b.data(), a.size()) == 0;
      }
      // Layer 0 again, unfused, so q_rope holds its rotated q.
      apply_llama31_rope_pos_ids(dev_view(layers[0].q, dt, {B, kHq, kD}),
                                 dev_view(layers[0].k, dt, {B, kHkv, kD}), qr, kr, posv,
                                 step.llama31, s);
      synchronize(s);
      const int np = kv0.indptr[1];
      HostTensor kh(kvt, {np, o.page_size, kHkv, kD}), vh = kh, qh(dt, {1, kHq, kD}), oh = qh;
      kv0.pages_to_host(0, kh.data(), vh.data());
      q_rope.copy_to_host(qh.data(), qh.nbytes(), 0);
      layers[0].out_fused.copy_to_host(oh.data(), oh.nbytes(), 0);
      const HostTensor ref = reference_decode_request(kh, vh, kv0.last[0], qh);
      const RefCheck rc = check_reference(oh.to_doubles(), ref.to_doubles(), dt);
      check_device_errors(0, s);
      const bool ok = bitwise && rc.pass;

      for (size_t i = 0; i < modes.size(); ++i) {
        // Speedups: eager modes over eager unfused, graph modes over unfused+graph, the PDL
        // decode graph over the one without.
        const double base = i < 2 ? us[0] : i < 5 ? us[2] : us[6];
        const bool decode_mode = i >= 5;
        const double layer_us = us[i] / kLayers;
        const double pct_read =
            ceil.read_tbps > 0 ? 100.0 * layer_bytes / (layer_us * 1e-6) / (ceil.read_tbps * 1e12)
                               : 0.0;
        std::printf("%-6s %-6d %-6lld %-18s %9.1f %9d %9.2fx %s", c.name.c_str(), B,
                    (long long)kv_len, modes[i].name, us[i], modes[i].launches, base / us[i],
                    ok ? "ok" : (bitwise ? "REF FAIL" : "FUSED != UNFUSED"));
        if (decode_mode) std::printf("  %.2f us/layer, %.1f %% of read", layer_us, pct_read);
        std::printf("\n");
        rows.push_back({{"workload", c.name.empty() ? "step" : c.name},
                        {"batch", B},
                        {"kv_len", kv_len},
                        {"kv_lens_uniform", std::all_of(c.lens.begin(), c.lens.end(),
                                                        [&](int64_t l) { return l == kv_len; })},
                        {"us_per_layer", layer_us},
                        {"layer_bytes", layer_bytes},
                        {"pct_read_ceiling", decode_mode ? pct_read : 0.0},
                        {"layers", kLayers},
                        {"shape", "gqa-32-8"},
                        {"dtype", dtype_name(dt)},
                        {"kv_dtype", dtype_name(kvt)},
                        {"mode", modes[i].name},
                        {"system", "flashkv"},
                        {"us_per_token", us[i]},
                        {"launches_per_token", modes[i].launches},
                        {"fused_equals_unfused", bitwise},
                        {"rel_err", rc.err},
                        {"bound", rc.bound},
                        {"pass", ok}});
      }
      std::fflush(stdout);
      for (CUgraphExec g : {g_unfused, g_fused, g_fused_nopdl, g_decode, g_decode_nopdl})
        driver().cuGraphExecDestroy(g);
      check(ok, "bench step: batch ", B, " kv ", kv_len,
            bitwise ? ": the fused output failed the reference check"
                    : ": fused and unfused outputs differ");
    }
  }
  return rows;
}

}  // namespace flashkv::cli
