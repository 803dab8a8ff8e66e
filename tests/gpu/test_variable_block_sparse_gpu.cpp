// VariableBlockSparseAttention (flashkv/block_sparse.h) on the GPU against the CPU reference
// (reference::variable_block_sparse_attention), outputs poisoned before each run, STYLE.md's
// tolerance rule: random per-head layouts with blocks of different sizes (0 included), empty block
// rows (out 0, lse -inf), causal with M != N, GQA 1/4/8 and MQA, head_dim 64/128/256, f16 and
// bf16, soft-cap and sinks, e4m3 keys and values with per-head scales; q, k, v, out laid out by
// token ([M, H, D]) and by head (FlashInfer's [H, M, D], as transposed views); bad layouts and
// inputs are named errors that write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_util.h"
#include "common/test_util.h"
#include "flashkv/block_sparse.h"
#include "flashkv/reference_block_sparse.h"
#include "gpu/prefill_case.h"

namespace flashkv::test {
namespace {

class VariableBlockSparseGpu : public GpuTest {};

struct VCase {
  int64_t MB = 6, NB = 5, M = 300, N = 400;
  double density = 0.4;
  bool causal = false, cap_and_sinks = false, head_major = false;
  bool min_workspace = false;  // min_workspace_bytes: plans split KV into what fits
  bool alibi_rope = false;     // ALiBi and RoPE at the tokens' own positions
  int hq = 8, hkv = 2, d = 128;
  DType dt = DType::f16;
  DType fp8_kv = DType::f32;  // e4m3: k, v in fp8 with per-head scales
  uint64_t seed = 1;
  std::string str() const {
    return "MB " + std::to_string(MB) + " NB " + std::to_string(NB) + " M " + std::to_string(M) +
           " N " + std::to_string(N) + " density " + std::to_string(density) +
           (causal ? " causal" : "") + (cap_and_sinks ? " cap+sinks" : "") +
           (head_major ? " head-major" : "") + " H " + std::to_string(hq) + "/" +
           std::to_string(hkv) + " D " + std::to_string(d) + " " + dtype_name(dt) +
           (is_fp8_dtype(fp8_kv) ? " kv e4m3" : "") + (alibi_rope ? " alibi+rope" : "");
  }
};

struct VLayout {
  std::vector<uint8_t> map;
  std::vector<int32_t> rows, cols;
  VariableBlockSparseLayout layout;
};

VLayout make_layout(const VCase& c) {
  VLayout v;
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  v.map.resize(c.hkv * c.MB * c.NB);
  for (auto& b : v.map) b = u(rng) < c.density;
  for (int64_t b = 0; b < c.NB; ++b) v.map[1 * c.NB + b] = 0;  // head 0, block row 1: empty
  const auto sizes = [&](int64_t n, int64_t total) {
    std::vector<int32_t> s(n, 0);
    for (int64_t i = 0; i < total; ++i) ++s[rng() % n];
    return s;
  };
  for (int h = 0; h < c.hkv; ++h) {
    auto r = sizes(c.MB, c.M), k = sizes(c.NB, c.N);
    if (h == 0 && r[1] == 0) {  // block row 1 of head 0 holds rows, so the empty row shows
      --r[0];
      ++r[1];
    }
    v.rows.insert(v.rows.end(), r.begin(), r.end());
    v.cols.insert(v.cols.end(), k.begin(), k.end());
  }
  v.layout = {v.map.data(), v.rows.data(), v.cols.data(), c.hkv, c.MB, c.NB, c.M, c.N};
  return v;
}

// [T, H, D] host tensor -> [H, T, D] (head-major) host tensor.
HostTensor head_major(const HostTensor& t) {
  const int64_t T = t.shape()[0], H = t.shape()[1], D = t.shape()[2];
  HostTensor r(t.dtype(), {H, T, D});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < D; ++e) r.set((h * T + i) * D + e, t.get((i * H + h) * D + e));
  return r;
}

// A device [H, T, D] tensor as the [T, H, D] view the op takes.
TensorView token_view(const DeviceTensor& hm) {
  const TensorView& v = hm.view;
  const int64_t H = v.size(0), T = v.size(1), D = v.size(2);
  const int64_t shape[3] = {T, H, D}, strides[3] = {D, T * D, 1};
  return TensorView(v.data(), v.dtype(), 3, shape, strides, v.device());
}

VariableBlockSparseConfig config_for(const VCase& c, const VariableBlockSparseLayout& l) {
  VariableBlockSparseConfig cfg;
  cfg.max_rows = c.M;
  cfg.max_block_rows = c.MB;
  cfg.max_kv_ids = c.MB * c.N;
  cfg.max_mask_bytes = c.causal ? (c.M * c.N + 7) / 8 + c.MB : 0;
  cfg.num_qo_heads = c.hq;
  cfg.num_kv_heads = l.num_kv_heads;
  cfg.head_dim = c.d;
  return cfg;
}

void run_case(const VCase& c) {
  SCOPED_TRACE(c.str());
  const VLayout lay = make_layout(c);
  const VariableBlockSparseLayout& l = lay.layout;
  const DType kv_dt = is_fp8_dtype(c.fp8_kv) ? c.fp8_kv : c.dt;
  HostTensor q(c.dt, {c.M, c.hq, c.d}), k(kv_dt, {c.N, c.hkv, c.d}), v(kv_dt, {c.N, c.hkv, c.d});
  q.fill_random(c.seed + 1);
  k.fill_random(c.seed + 2);
  v.fill_random(c.seed + 3);
  std::vector<double> sink_vals, ks, vs;
  for (int h = 0; h < c.hq; ++h) sink_vals.push_back(0.3 * h - 1.0);
  for (int h = 0; h < c.hkv; ++h) {
    ks.push_back(0.25 + 0.5 * h);
    vs.push_back(2.0 - 0.25 * h);
  }
  const HostTensor sinks = make_tensor(DType::f32, {c.hq}, sink_vals);
  const HostTensor kscale = make_tensor(DType::f32, {c.hkv}, ks),
                   vscale = make_tensor(DType::f32, {c.hkv}, vs);
  const DeviceTensor d_sinks = to_device(sinks), d_ks = to_device(kscale), d_vs = to_device(vscale);
  BlockSparseOptions host_o, dev_o;
  host_o.causal = dev_o.causal = c.causal;
  if (c.cap_and_sinks) {
    host_o.logits_soft_cap = dev_o.logits_soft_cap = 3.0f;
    host_o.sinks = sinks.view();
    dev_o.sinks = d_sinks.view;
  }
  if (is_fp8_dtype(c.fp8_kv)) {
    host_o.kv_scale = {1.0f, 1.0f, kscale.view(), vscale.view()};
    dev_o.kv_scale = {1.0f, 1.0f, d_ks.view, d_vs.view};
  }
  std::vector<double> slope_vals;
  for (int h = 0; h < c.hq; ++h) slope_vals.push_back(std::ldexp(1.0, -(h % 8) - 1));
  const HostTensor slopes = make_tensor(DType::f32, {c.hq}, slope_vals);
  const DeviceTensor d_slopes = to_device(slopes);
  if (c.alibi_rope) {
    host_o.alibi_slopes = slopes.view();
    dev_o.alibi_slopes = d_slopes.view;
    host_o.rope.mode = dev_o.rope.mode = RopeMode::llama;
  }
  HostTensor ref(DType::f32, {c.M, c.hq, c.d}), ref_lse(DType::f32, {c.M, c.hq});
  reference::variable_block_sparse_attention(q.view(), k.view(), v.view(), l, ref.view(),
                                             ref_lse.view(), host_o);
  const HostTensor ref_lowp = rounded_to(ref, c.dt);

  const VariableBlockSparseConfig cfg = config_for(c, l);
  DeviceBuffer ws(c.min_workspace ? VariableBlockSparseAttention::min_workspace_bytes(cfg)
                                  : VariableBlockSparseAttention::workspace_bytes(cfg));
  VariableBlockSparseAttention op(cfg, ws.data(), ws.size());
  HostTensor out(c.dt, {c.M, c.hq, c.d}), lse(DType::f32, {c.M, c.hq});
  DeviceTensor dlse = poisoned_like(lse);
  ScopedStream s;
  op.plan(l,
          {.num_qo_heads = c.hq,
           .num_kv_heads = c.hkv,
           .head_dim = c.d,
           .q_dtype = c.dt,
           .kv_dtype = kv_dt,
           .o_dtype = c.dt},
          dev_o, s);
  if (c.head_major) {
    const DeviceTensor dq = to_device(head_major(q)), dk = to_device(head_major(k)),
                       dv = to_device(head_major(v));
    HostTensor out_hm(c.dt, {c.hq, c.M, c.d});
    DeviceTensor dout = poisoned_like(out_hm);
    op.run(token_view(dq), token_view(dk), token_view(dv), token_view(dout), dlse.view, s);
    synchronize(s);
    to_host(dout, out_hm);
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t h = 0; h < c.hq; ++h)
        for (int64_t e = 0; e < c.d; ++e)
          out.set((i * c.hq + h) * c.d + e, out_hm.get((h * c.M + i) * c.d + e));
  } else {
    const DeviceTensor dq = to_device(q), dk = to_device(k), dv = to_device(v);
    DeviceTensor dout = poisoned_like(out);
    op.run(dq.view, dk.view, dv.view, dout.view, dlse.view, s);
    synchronize(s);
    to_host(dout, out);
  }
  to_host(dlse, lse);
  const ToleranceCheck t = check_tolerance(out.to_doubles(), ref.to_doubles(),
                                           ref_lowp.to_doubles(), tolerance_floor(c.dt));
  EXPECT_TRUE(t.pass) << t.str();
  const auto got = lse.to_doubles(), want = ref_lse.to_doubles();
  int64_t empty = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ++empty;
      bad += got[i] != want[i];
    } else {
      bad += !(std::abs(got[i] - want[i]) <= 1e-3 * std::max(1.0, std::abs(want[i])));
    }
  }
  EXPECT_EQ(bad, 0) << "lse entries off (of " << got.size() << ")";
  if (!c.cap_and_sinks) EXPECT_GT(empty, 0) << "the empty block row must show";
}

TEST_F(VariableBlockSparseGpu, RandomLayoutsBothLayoutsAndCausal) {
  uint64_t seed = 70;
  VCase cases[] = {
      {6, 5, 300, 400, 0.4},                      // token-major
      {6, 5, 300, 400, 0.4, false, false, true},  // head-major (FlashInfer's)
      {8, 8, 256, 256, 0.5, true},                // causal, M == N
      {5, 7, 200, 513, 0.6, true, false, true},   // causal, M != N, head-major
      {4, 16, 64, 1024, 0.05},                    // sparse, long keys
      {3, 3, 130, 97, 1.0, true, true},           // full, causal, M > N, cap + sinks
  };
  for (VCase c : cases) {
    c.seed = seed++;
    run_case(c);
  }
  for (const bool head_major : {false, true}) {  // ALiBi + RoPE at token positions
    VCase ar{6, 5, 300, 400, 0.5, true};
    ar.alibi_rope = true;
    ar.head_major = head_major;
    ar.cap_and_sinks = head_major;
    ar.seed = seed++;
    run_case(ar);
  }
  VCase small{4, 8, 256, 8192, 0.6, true};  // long rows in the least workspace
  small.min_workspace = true;
  small.seed = seed++;
  run_case(small);
}

TEST_F(VariableBlockSparseGpu, HeadDimsGroupsDtypesAndFp8) {
  uint64_t seed = 90;
  for (int d : {64, 128, 256})
    for (int group : {1, 4, 8}) {
      VCase c;
      c.d = d;
      c.hkv = 2;
      c.hq = 2 * group;
      c.dt = group == 4 ? DType::bf16 : DType::f16;
      c.causal = d != 128;
      c.head_major = group == 8;
      c.seed = seed++;
      run_case(c);
    }
  VCase mqa;  // MQA
  mqa.hq = 8;
  mqa.hkv = 1;
  mqa.causal = true;
  mqa.seed = seed++;
  run_case(mqa);
  VCase f;  // e4m3 with per-head scales
  f.fp8_kv = DType::e4m3;
  f.hkv = 4;
  f.causal = true;
  f.seed = seed++;
  run_case(f);
}

TEST_F(VariableBlockSparseGpu, BadInputsAreNamedAndWriteNothing) {
  VCase c;
  VLayout lay = make_layout(c);
  const VariableBlockSparseConfig cfg = config_for(c, lay.layout);
  EXPECT_NE(error_of([&] {
              DeviceBuffer tiny(VariableBlockSparseAttention::min_workspace_bytes(cfg) - 256);
              VariableBlockSparseAttention t(cfg, tiny.data(), tiny.size());
            }).find("min_workspace_bytes"),
            std::string::npos);
  DeviceBuffer ws(VariableBlockSparseAttention::workspace_bytes(cfg));
  VariableBlockSparseAttention op(cfg, ws.data(), ws.size());
  const AttentionShape shape{.num_qo_heads = c.hq, .num_kv_heads = c.hkv, .head_dim = c.d};
  HostTensor q(c.dt, {c.M, c.hq, c.d}), k(c.dt, {c.N, c.hkv, c.d});
  q.fill_random(1);
  k.fill_random(2);
  const DeviceTensor dq = to_device(q), dk = to_device(k);
  DeviceTensor dout = poisoned_like(q);
  EXPECT_NE(error_of([&] { op.run(dq.view, dk.view, dk.view, dout.view, {}); }).find("plan"),
            std::string::npos);
  VariableBlockSparseLayout bad = lay.layout;
  std::vector<int32_t> rows = lay.rows;
  rows[0] += 1;  // head 0's row sizes no longer sum to M
  bad.block_row_sz = rows.data();
  EXPECT_NE(error_of([&] { op.plan(bad, shape); }).find("block_row_sz[0] sums to"),
            std::string::npos);
  AttentionShape wrong = shape;
  wrong.num_kv_heads = 1;
  wrong.num_qo_heads = c.hq / 2;
  EXPECT_NE(error_of([&] { op.plan(lay.layout, wrong); }).find("num_kv_heads"), std::string::npos);
  BlockSparseOptions causal;
  causal.causal = true;  // needs mask bytes the config has none of
  EXPECT_NE(error_of([&] { op.plan(lay.layout, shape, causal); }).find("max_mask_bytes"),
            std::string::npos);
  EXPECT_TRUE(all_bytes_are(dout)) << "a refused call wrote its output";
  op.plan(lay.layout, shape);
  HostTensor short_k(c.dt, {c.N - 1, c.hkv, c.d});
  const DeviceTensor dks = to_device(short_k);
  EXPECT_NE(error_of([&] {
              op.run(dq.view, dks.view, dks.view, dout.view, {});
            }).find("k: expected [N = "),
            std::string::npos);
  EXPECT_TRUE(all_bytes_are(dout));
}

}  // namespace
}  // namespace flashkv::test
