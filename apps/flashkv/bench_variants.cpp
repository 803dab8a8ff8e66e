#include "bench_variants.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/reference_variants.h"
#include "flashkv/rope.h"
#include "workloads.h"

namespace flashkv::cli {
namespace {

constexpr double kMaxRelErr = 1e-2;  // the cap of check_reference's tolerance rule (bench_util.h)
constexpr int kWindowLeft = 1024;    // the window configurations' window_left
const Device kGpu = Device::cuda(0);

// What every variant of one (workload, shape, dtype) shares: the paged cache and q in rotated
// copies, each variant tensor twice (host for the reference, device for the kernel), and what
// apply-RoPE-then-decode needs: a second key buffer laid out like the first (so each copy's page
// ids address it unchanged) and the RoPE position of every storage slot and of every query.
struct Setup {
  int B = 0, Hq = 0, D = 0;
  DType dt = DType::f16;
  BenchPagedKV kv;
  DeviceBuffer q, out, q_rot, k_rot, slot_pos, q_pos, none;
  size_t bytes = 0;  // plain decode's bytes (docs/benchmarks.md): every variant is charged the same
  BenchVariantInputs vin;

  size_t q_bytes() const { return size_t(B) * Hq * D * dtype_size(dt); }
  int64_t slots() const { return kv.pages_per_copy * kv.page_size; }  // of one copy
  TensorView qview(int c) const {
    return TensorView(static_cast<char*>(q.data()) + c * q_bytes(), dt, {B, Hq, D}, kGpu);
  }
  TensorView out_view() const { return TensorView(out.data(), dt, {B, Hq, D}, kGpu); }
  // Copy c's K storage in `buf` as the ragged [slots, H_kv, D] tensor apply_rope_pos_ids takes.
  TensorView k_slots(const DeviceBuffer& buf, int c) const {
    const size_t off = size_t(c) * slots() * kv.num_kv_heads * D * dtype_size(dt);
    return TensorView(static_cast<char*>(buf.data()) + off, dt, {slots(), kv.num_kv_heads, D},
                      kGpu);
  }
  // A [rows, 0, D] tensor: rope.h rotates q and k in one call; a side with no heads lets one call
  // rotate only keys (rows = slots) or only queries (rows = batch).
  TensorView no_heads(int64_t rows) const {
    return TensorView(none.data(), dt, {rows, 0, D}, {D, D, 1}, kGpu);
  }
};

template <class T>
DeviceBuffer to_device(const T* p, size_t n) {
  DeviceBuffer b(std::max<size_t>(n * sizeof(T), 16));
  if (n) b.copy_from_host(p, n * sizeof(T));
  return b;
}

}  // namespace

void BenchVariantInputs::build(int num_qo_heads, const std::vector<bool>& bits,
                               const std::vector<int64_t>& qo_lens,
                               const std::vector<int64_t>& kv_lens, std::mt19937& rng) {
  Hq = num_qo_heads;
  B = static_cast<int>(kv_lens.size());
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  sinks = HostTensor(DType::f32, {Hq});
  alibi = HostTensor(DType::f32, {Hq});
  for (int h = 0; h < Hq; ++h) {
    sinks.set(h, u(rng));
    alibi.set(h, std::exp2(-8.0 * (h + 1) / Hq));  // the ALiBi paper's slopes
  }
  d_sinks = to_device(static_cast<const float*>(sinks.data()), Hq);
  d_alibi = to_device(static_cast<const float*>(alibi.data()), Hq);
  mask = pack_custom_mask(bits, qo_lens, kv_lens, mask_indptr);
  d_mask = to_device(mask.data(), mask.size());
  d_mask_indptr = to_device(mask_indptr.data(), mask_indptr.size());
}

AttentionVariant BenchVariantInputs::describe(const std::string& name, int window_left,
                                              bool dev) const {
  AttentionVariant v;
  const bool combo = name == "window+soft-cap+sinks";
  if (name == "soft-cap" || combo) v.logits_soft_cap = 30.f;
  if (name == "window" || combo) v.window_left = window_left;
  if (name == "sinks" || combo)
    v.sinks = dev ? TensorView(d_sinks.data(), DType::f32, {Hq}, kGpu) : sinks.view();
  if (name == "alibi")
    v.alibi_slopes = dev ? TensorView(d_alibi.data(), DType::f32, {Hq}, kGpu) : alibi.view();
  if (name == "custom-mask")
    v.custom_mask = {
        dev ? static_cast<const uint8_t*>(d_mask.data()) : mask.data(),
        static_cast<int64_t>(mask.size()),
        dev ? TensorView(d_mask_indptr.data(), DType::i32, {B + 1}, kGpu) : TensorView()};
  if (name == "rope-fused") {
    v.rope.mode = RopeMode::llama;
    v.rope.rope_theta = 1e4f;
  }
  return v;
}

namespace {

void build(Setup& st, const Workload& w, const HeadShape& sh, const VariantsBenchOptions& o,
           DType dt, uint64_t seed, Stream s) {
  st.B = static_cast<int>(w.lens.size());
  st.Hq = sh.num_qo_heads;
  st.D = st.kv.head_dim = o.head_dim;
  st.dt = st.kv.dtype = dt;
  st.kv.num_kv_heads = sh.num_kv_heads;
  st.kv.page_size = o.page_size;
  st.kv.lens = w.lens;
  st.kv.build(rotation_copies(st.kv.kv_bytes()), seed, s);
  const size_t q_elems = size_t(st.B) * st.Hq * st.D;
  st.q = DeviceBuffer(std::max<size_t>(st.q_bytes() * st.kv.copies, 16));
  device_fill_uniform(st.q.data(), st.dt, q_elems * st.kv.copies, seed + 2, -1, 1, s);
  st.out = DeviceBuffer(std::max<size_t>(st.q_bytes(), 16));
  st.q_rot = DeviceBuffer(std::max<size_t>(st.q_bytes(), 16));
  st.k_rot = DeviceBuffer(st.kv.k.size());
  st.none = DeviceBuffer(16);
  st.bytes = 2 * st.q_bytes() + st.kv.kv_bytes();
  std::mt19937 rng(static_cast<uint32_t>(seed * 7 + 3));
  std::vector<bool> bits;  // one query row per request; ~70% of its keys attended
  for (int64_t len : st.kv.lens)
    for (int64_t j = 0; j < len; ++j) bits.push_back(rng() % 10 < 7);
  st.vin.build(st.Hq, bits, std::vector<int64_t>(st.B, 1), st.kv.lens, rng);
  // Slot positions per copy (page ids differ between copies): slot t of a request's j-th page
  // is token j * page_size + t. Padding slots of last pages get positions too (never attended).
  const int64_t P = st.kv.page_size;
  std::vector<int32_t> pos(size_t(st.slots()) * st.kv.copies);
  for (int c = 0; c < st.kv.copies; ++c)
    for (int r = 0; r < st.B; ++r)
      for (int32_t j = 0; j < st.kv.indptr[r + 1] - st.kv.indptr[r]; ++j) {
        const int64_t page = st.kv.indices[c][st.kv.indptr[r] + j];  // global: c * ppc + local
        for (int64_t t = 0; t < P; ++t) pos[size_t(page * P + t)] = int32_t(j * P + t);
      }
  st.slot_pos = to_device(pos.data(), pos.size());
  std::vector<int32_t> qp;  // decode's query sits at kv_len - 1 (variants.h's q_pos)
  for (int64_t len : st.kv.lens) qp.push_back(static_cast<int32_t>(std::max<int64_t>(len - 1, 0)));
  st.q_pos = to_device(qp.data(), qp.size());
}

const char* const kVariants[] = {
    "plain",     "soft-cap", "window", "sinks", "alibi", "custom-mask", "window+soft-cap+sinks",
    "rope-fused"};

// Relative error of up to 3 sampled requests of copy 0 (st.out) against the CPU reference of
// `variant` (host tensors; a custom mask is given as the request's own bytes, no mask_indptr).
double check_sampled(const Setup& st, const AttentionVariant& variant) {
  std::vector<int> reqs = {0, st.B / 2, st.B - 1};
  reqs.erase(std::unique(reqs.begin(), reqs.end()), reqs.end());
  const BenchPagedKV& kv = st.kv;
  const size_t row_bytes = size_t(st.Hq) * st.D * dtype_size(st.dt);
  std::vector<double> got, want;
  for (int r : reqs) {
    const int64_t np = std::max(kv.indptr[r + 1] - kv.indptr[r], 1);
    HostTensor k(st.dt, {np * kv.page_size, kv.num_kv_heads, st.D}), v(st.dt, k.shape());
    kv.pages_to_host(r, k.data(), v.data());
    HostTensor q(st.dt, {st.Hq, st.D}), out(st.dt, {st.Hq, st.D}), ref(DType::f32, {st.Hq, st.D});
    st.q.copy_to_host(q.data(), row_bytes, r * row_bytes);
    st.out.copy_to_host(out.data(), row_bytes, r * row_bytes);
    AttentionVariant hv = variant;
    if (hv.custom_mask.defined())
      hv.custom_mask = {st.vin.mask.data() + st.vin.mask_indptr[r],
                        st.vin.mask_indptr[r + 1] - st.vin.mask_indptr[r], TensorView()};
    reference::single_decode_variant(q.view(), k.view().slice0(0, kv.lens[r]),
                                     v.view().slice0(0, kv.lens[r]), ref.view(), TensorView(),
                                     KVLayout::NHD, hv);
    for (double x : out.to_doubles()) got.push_back(x);
    for (double x : ref.to_doubles()) want.push_back(x);
  }
  return relative_error(got, want);
}

// One row: `prepare` (plan), `step(copy)` timed over the rotated copies, copy 0 re-run and
// checked against `ref`. Whatever the library throws becomes a FAILED row, so one refused
// configuration does not hide the others' numbers.
nlohmann::json measure(Setup& st, const Ceilings& ceil, int reps, nlohmann::json row,
                       const std::function<void()>& prepare, const std::function<void(int)>& step,
                       const AttentionVariant& ref, double t_plain, Stream s) {
  try {
    prepare();
    const Timing t = time_on_stream(
        s, [&](int rep) { step(rep % st.kv.copies); }, 5, reps);
    step(0);
    synchronize(s);
    const double err = check_sampled(st, ref);
    const double tbps = st.bytes / (t.median_us * 1e-6) / 1e12;
    const bool ok = err <= kMaxRelErr;  // false for NaN
    row.update({{"time_us", t.median_us},
                {"min_us", t.min_us},
                {"tbps", tbps},
                {"tflops", nullptr},
                {"pct_read_ceiling", 100 * tbps / ceil.read_tbps},
                // NaN (JSON null) when plain decode itself failed: nothing to compare with.
                {"ratio_to_plain", t_plain > 0                 ? t.median_us / t_plain
                                   : row["variant"] == "plain" ? 1.0
                                                               : std::nan("")},
                {"rel_err", err},
                {"check", ok ? "ok" : "FAILED"},
                {"bytes", st.bytes},
                {"copies_rotated", st.kv.copies}});
    std::printf("%-4s %-9s %-5s %-22s %9.2f %7.3f %6.1f%% %7.2fx %9.2e%s\n",
                row["workload"].get<std::string>().c_str(), row["shape"].get<std::string>().c_str(),
                dtype_name(st.dt), row["variant"].get<std::string>().c_str(), t.median_us, tbps,
                100 * tbps / ceil.read_tbps, row["ratio_to_plain"].get<double>(), err,
                ok ? "" : "  ERROR: rel_err above 1e-2");
  } catch (const std::exception& e) {
    row.update({{"time_us", nullptr}, {"check", "FAILED"}, {"error", e.what()}});
    std::printf("%-4s %-9s %-5s %-22s ERROR: %s\n", row["workload"].get<std::string>().c_str(),
                row["shape"].get<std::string>().c_str(), dtype_name(st.dt),
                row["variant"].get<std::string>().c_str(), e.what());
  }
  std::fflush(stdout);
  return row;
}

double time_of(const nlohmann::json& row) {
  return row["time_us"].is_number() ? row["time_us"].get<double>() : 0.0;
}

}  // namespace

nlohmann::json bench_variants(const VariantsBenchOptions& o, const Ceilings& ceil, Stream s) {
  nlohmann::json rows = nlohmann::json::array();
  const auto wls =
      o.workloads_file.empty() ? standard_workloads() : read_workloads(o.workloads_file);
  uint64_t seed = 101;
  std::printf("%-4s %-9s %-5s %-22s %9s %7s %7s %8s %9s\n", "wl", "shape", "dtype", "variant",
              "time_us", "TB/s", "%read", "x plain", "rel_err");
  for (const auto& w : wls) {
    if (w.kind != "decode" || !selected(o.workloads, w.id)) continue;
    for (const auto& sh : standard_shapes()) {
      if (!selected(o.shapes, sh.name)) continue;
      for (DType dt : o.dtypes) {
        Setup st;
        build(st, w, sh, o, dt, seed++, s);
        BatchDecodeConfig cfg{st.B, st.Hq, st.D};
        cfg.ctas_per_sm = o.ctas_per_sm;
        DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
        BatchDecode dec(cfg, ws.data(), ws.size());
        std::vector<PagedKVCache> caches, rotated;
        for (int c = 0; c < st.kv.copies; ++c) {
          caches.push_back(st.kv.device_view(c));
          rotated.push_back(caches.back());
          rotated.back().k =
              TensorView(st.k_rot.data(), dt,
                         {caches.back().k.size(0), o.page_size, sh.num_kv_heads, st.D}, kGpu);
        }
        auto plan = [&](const Variant& v) {
          DecodePlanOptions po;
          po.variant = v;
          dec.plan({.kv_indptr = st.kv.indptr.data(),
                    .kv_last_page_len = st.kv.last.data(),
                    .batch_size = st.B,
                    .page_size = o.page_size},
                   {.num_qo_heads = st.Hq,
                    .num_kv_heads = sh.num_kv_heads,
                    .head_dim = st.D,
                    .q_dtype = dt,
                    .kv_dtype = dt,
                    .o_dtype = dt},
                   po, s);
        };
        const nlohmann::json base = {{"workload", w.id},
                                     {"shape", sh.name},
                                     {"dtype", dtype_name(dt)},
                                     {"system", "flashkv"}};
        double t_plain = 0, t_fused = 0;
        for (const std::string name : kVariants) {
          nlohmann::json row = base;
          row["variant"] = name;
          const AttentionVariant dv = st.vin.describe(name, kWindowLeft, true);
          row = measure(
              st, ceil, o.reps, row,
              [&] { plan(name == "plain" ? Variant() : Variant::builtin(dv)); },
              [&](int k) { dec.run(st.qview(k), caches[k], st.out_view(), TensorView(), s); },
              st.vin.describe(name, kWindowLeft, false), t_plain, s);
          if (row["time_us"].is_number())
            row["kernel"] = dec.plan_info().tensor_cores ? "tensor-cores" : "cuda-cores";
          if (name == "plain") t_plain = time_of(row);
          if (name == "rope-fused") t_fused = time_of(row);
          rows.push_back(row);
        }
        // The unfused alternative for a cache of un-rotated keys: rotate every key slot (and q)
        // into second buffers, then plain decode over them; three launches timed as one step.
        nlohmann::json row = base;
        row["variant"] = "rope-unfused";
        const RopeOptions ro{.rope_theta = 1e4};
        row = measure(
            st, ceil, o.reps, row, [&] { plan(Variant()); },
            [&](int k) {
              const TensorView pos(static_cast<int32_t*>(st.slot_pos.data()) + k * st.slots(),
                                   DType::i32, {st.slots()}, kGpu);
              const TensorView none_k = st.no_heads(st.slots());
              apply_rope_pos_ids(none_k, st.k_slots(st.kv.k, k), none_k, st.k_slots(st.k_rot, k),
                                 pos, ro, s);
              const TensorView q_rot(st.q_rot.data(), dt, {st.B, st.Hq, st.D}, kGpu);
              const TensorView none_q = st.no_heads(st.B);
              apply_rope_pos_ids(st.qview(k), none_q, q_rot, none_q,
                                 TensorView(st.q_pos.data(), DType::i32, {st.B}, kGpu), ro, s);
              dec.run(q_rot, rotated[k], st.out_view(), TensorView(), s);
            },
            st.vin.describe("rope-fused", kWindowLeft, false), t_plain, s);
        if (t_fused > 0 && row["time_us"].is_number()) {
          const double speedup = time_of(row) / t_fused;
          row["launches"] = 3;
          row["speedup_fused_vs_unfused"] = speedup;
          std::printf("%-4s %-9s %-5s fused RoPE is %.2fx faster than apply-RoPE-then-decode\n",
                      w.id.c_str(), sh.name.c_str(), dtype_name(dt), speedup);
        }
        rows.push_back(row);
      }
    }
  }
  synchronize(s);
  for (const auto& r : bench_variants_prefill(o, ceil, s)) rows.push_back(r);
  for (const auto& r : bench_variants_jit(o)) rows.push_back(r);
  return rows;
}

int count_variant_failures(const nlohmann::json& rows) {
  int n = 0;
  for (const auto& r : rows) n += r.contains("check") && r["check"] == "FAILED";
  return n;
}

}  // namespace flashkv::cli
