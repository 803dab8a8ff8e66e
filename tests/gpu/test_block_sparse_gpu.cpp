// BlockSparseAttention (flashkv/block_sparse.h) on the GPU against the CPU reference
// (reference_block_sparse.h: dense masked attention from the layout), outputs poisoned before each
// run, STYLE.md's tolerance rule for the dtype: random patterns at densities 1 %-100 % with R, C in
// {1, 3, 16, 64, 128, 200}, empty block rows (out 0, lse -inf), rows masked entirely inside their
// blocks, causal with R != C and with the kernel's own causal mask (R == C, diagonal blocks), GQA
// 1/4/8, head_dim 64/128/256, f16 and bf16, soft-cap and sinks, e4m3 keys and values; bad layouts
// are named errors that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_util.h"
#include "common/test_util.h"
#include "flashkv/block_sparse.h"
#include "flashkv/merge.h"
#include "flashkv/prefill.h"
#include "flashkv/reference_block_sparse.h"
#include "gpu/prefill_case.h"

namespace flashkv::test {
namespace {

class BlockSparseGpu : public GpuTest {};

struct BsCase {
  int R = 16, C = 16;
  int64_t MB = 8, NB = 8;
  double density = 0.3;
  bool causal = false, element_mask = false, cap_and_sinks = false;
  bool diagonal = false;  // every non-empty block row holds its diagonal block (MB == NB)
  bool alibi = false, rope = false;  // at the tokens' own positions (sparse_positions_variant.h)
  int hq = 8, hkv = 2, d = 128;
  DType dt = DType::f16;
  DType fp8_kv = DType::f32;  // e4m3 / e5m2: k, v in fp8 (scales 0.5, 2)
  uint64_t seed = 1;
  std::string str() const {
    return "R " + std::to_string(R) + " C " + std::to_string(C) + " MB " + std::to_string(MB) +
           " NB " + std::to_string(NB) + " density " + std::to_string(density) +
           (causal ? " causal" : "") + (element_mask ? " mask" : "") +
           (cap_and_sinks ? " cap+sinks" : "") + (diagonal ? " diagonal" : "") +
           (alibi ? " alibi" : "") + (rope ? " rope" : "") + " H " + std::to_string(hq) + "/" +
           std::to_string(hkv) + " D " + std::to_string(d) + " " + dtype_name(dt) +
           (is_fp8_dtype(fp8_kv) ? std::string(" kv ") + dtype_name(fp8_kv) : "");
  }
};

struct Pattern {
  std::vector<int32_t> indptr = {0}, indices;
  std::vector<uint8_t> mask;
  BlockSparseLayout layout;
};

Pattern make_pattern(const BsCase& c) {
  Pattern p;
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < c.MB; ++i) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < c.NB; ++j)
      if (i != c.MB / 2 && ((c.diagonal && j == i) || u(rng) < c.density))
        row.push_back(static_cast<int32_t>(j));
    std::shuffle(row.begin(), row.end(), rng);
    p.indices.insert(p.indices.end(), row.begin(), row.end());
    p.indptr.push_back(static_cast<int32_t>(p.indices.size()));
  }
  p.layout = {p.indptr.data(), p.indices.data(), c.R * c.MB, c.C * c.NB, c.R, c.C};
  if (c.element_mask) {
    p.mask.resize(p.indices.size() * c.R * c.C);
    for (auto& b : p.mask) b = u(rng) < 0.7;
    for (int64_t t = p.indptr[0]; t < p.indptr[1]; ++t)  // row 0 keeps nothing
      for (int cc = 0; cc < c.C; ++cc) p.mask[(t * c.R) * c.C + cc] = 0;
    p.layout.block_mask = p.mask.data();
  }
  return p;
}

void run_case(const BsCase& c) {
  SCOPED_TRACE(c.str());
  const Pattern pat = make_pattern(c);
  const BlockSparseLayout& l = pat.layout;
  const DType kv_dt = is_fp8_dtype(c.fp8_kv) ? c.fp8_kv : c.dt;
  HostTensor q(c.dt, {l.M, c.hq, c.d}), k(kv_dt, {l.N, c.hkv, c.d}), v(kv_dt, {l.N, c.hkv, c.d});
  q.fill_random(c.seed + 1);
  k.fill_random(c.seed + 2);
  v.fill_random(c.seed + 3);
  const HostTensor sinks = make_tensor(DType::f32, {c.hq}, std::vector<double>(c.hq, 0.5));
  const DeviceTensor d_sinks = to_device(sinks);
  BlockSparseOptions host_o, dev_o;
  host_o.causal = dev_o.causal = c.causal;
  if (c.cap_and_sinks) {
    host_o.logits_soft_cap = dev_o.logits_soft_cap = 4.0f;
    host_o.sinks = sinks.view();
    dev_o.sinks = d_sinks.view;
  }
  if (is_fp8_dtype(c.fp8_kv)) {
    host_o.kv_scale = dev_o.kv_scale = {0.5f, 2.0f, {}, {}};
  }
  std::vector<double> slope_vals;
  for (int h = 0; h < c.hq; ++h) slope_vals.push_back(std::ldexp(1.0, -(h % 8) - 1));
  const HostTensor slopes = make_tensor(DType::f32, {c.hq}, slope_vals);
  const DeviceTensor d_slopes = to_device(slopes);
  if (c.alibi) {
    host_o.alibi_slopes = slopes.view();
    dev_o.alibi_slopes = d_slopes.view;
  }
  if (c.rope) host_o.rope.mode = dev_o.rope.mode = RopeMode::llama;
  HostTensor ref(DType::f32, {l.M, c.hq, c.d}), ref_lse(DType::f32, {l.M, c.hq});
  reference::block_sparse_attention(q.view(), k.view(), v.view(), l, ref.view(), ref_lse.view(),
                                    host_o);
  const HostTensor ref_lowp = rounded_to(ref, c.dt);

  BlockSparseConfig cfg;
  cfg.max_rows = l.M;
  cfg.max_block_rows = c.MB;
  cfg.max_blocks = std::max<int64_t>(1, static_cast<int64_t>(pat.indices.size()));
  cfg.max_mask_bytes = block_sparse_mask_bytes(l, c.causal);
  cfg.num_qo_heads = c.hq;
  cfg.head_dim = c.d;
  DeviceBuffer ws(BlockSparseAttention::workspace_bytes(cfg));
  BlockSparseAttention bsa(cfg, ws.data(), ws.size());
  const DeviceTensor dq = to_device(q), dk = to_device(k), dv = to_device(v);
  HostTensor out(c.dt, {l.M, c.hq, c.d}), lse(DType::f32, {l.M, c.hq});
  DeviceTensor dout = poisoned_like(out), dlse = poisoned_like(lse);
  ScopedStream s;
  bsa.plan(l,
           {.num_qo_heads = c.hq,
            .num_kv_heads = c.hkv,
            .head_dim = c.d,
            .q_dtype = c.dt,
            .kv_dtype = kv_dt,
            .o_dtype = c.dt},
           dev_o, s);
  bsa.run(dq.view, dk.view, dv.view, dout.view, dlse.view, s);
  synchronize(s);
  to_host(dout, out);
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

TEST_F(BlockSparseGpu, RandomPatternsBlockSizesAndDensities) {
  uint64_t seed = 10;
  const BsCase cases[] = {
      {1, 1, 64, 256, 0.05},                    // vector sparsity
      {3, 3, 40, 40, 0.5, true},                // causal, odd block sizes
      {16, 64, 8, 6, 1.0, true},                // full density, causal, R != C
      {64, 16, 4, 20, 0.3, false, true},        // element mask
      {128, 128, 3, 4, 0.5},                    // large blocks
      {200, 200, 2, 3, 0.7, true, true},        // any size, not a power of two
      {16, 3, 10, 100, 0.01},                   // 1 %
      {64, 64, 4, 8, 0.4, false, false, true},  // soft-cap and sinks
  };
  for (BsCase c : cases) {
    c.seed = seed++;
    run_case(c);
  }
  // R == C, M == N, causal with every diagonal block: the kernel's own causal mask (no custom
  // mask: bsr_paged_plan.h), at 128 x 128 and 1 x 1.
  for (int b : {128, 1}) {
    BsCase d{b, b, b == 1 ? 256 : 8, b == 1 ? 256 : 8, 0.2, true};
    d.diagonal = true;
    d.seed = seed++;
    run_case(d);
  }
}

// ALiBi and RoPE at the tokens' own positions: blocks gathered out of order with gaps (where a
// key's index among its gathered keys is not its position), causal with R != C, with the
// kernel's own causal mask, with an element mask, soft-cap and sinks, over e4m3.
TEST_F(BlockSparseGpu, AlibiAndRopeAtTokenPositions) {
  uint64_t seed = 60;
  BsCase cases[] = {
      {16, 16, 6, 8, 0.5},                     // plain
      {3, 16, 10, 8, 0.5, true},               // causal, R != C: custom mask
      {16, 16, 8, 8, 0.4, true},               // diagonal below: the kernel's causal mask
      {16, 64, 4, 6, 0.5, false, true, true},  // element mask, soft-cap and sinks
  };
  cases[2].diagonal = true;
  for (BsCase c : cases)
    for (const auto& [alibi, rope] :
         {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
      c.alibi = alibi;
      c.rope = rope;
      c.seed = seed++;
      run_case(c);
    }
  BsCase f{16, 16, 6, 6, 0.5, true};  // e4m3 keys: RoPE stages them widened
  f.fp8_kv = DType::e4m3;
  f.rope = f.alibi = true;
  f.seed = seed++;
  run_case(f);
  BsCase g{32, 32, 4, 4, 0.6, true};  // head_dim 256, GQA 8
  g.d = 256;
  g.hq = 16;
  g.hkv = 2;
  g.rope = g.alibi = true;
  g.seed = seed++;
  run_case(g);
}

TEST_F(BlockSparseGpu, HeadDimsGroupsDtypesAndFp8) {
  uint64_t seed = 40;
  for (int d : {64, 128, 256})
    for (int group : {1, 4, 8}) {
      BsCase c;
      c.d = d;
      c.hkv = 2;
      c.hq = 2 * group;
      c.dt = group == 4 ? DType::bf16 : DType::f16;
      c.causal = d != 64;
      c.seed = seed++;
      run_case(c);
    }
  BsCase f;
  f.fp8_kv = DType::e4m3;
  f.causal = true;
  f.seed = seed++;
  run_case(f);
}

TEST_F(BlockSparseGpu, BadLayoutsAreNamedAndWriteNothing) {
  BsCase c;
  Pattern pat = make_pattern(c);
  BlockSparseConfig cfg;
  cfg.max_rows = pat.layout.M;
  cfg.max_block_rows = c.MB;
  cfg.max_blocks = static_cast<int64_t>(pat.indices.size()) + 1;
  cfg.num_qo_heads = c.hq;
  DeviceBuffer ws(BlockSparseAttention::workspace_bytes(cfg));
  BlockSparseAttention bsa(cfg, ws.data(), ws.size());
  const AttentionShape shape{.num_qo_heads = c.hq, .num_kv_heads = c.hkv, .head_dim = c.d};
  HostTensor q(c.dt, {pat.layout.M, c.hq, c.d}), k(c.dt, {pat.layout.N, c.hkv, c.d});
  q.fill_random(1);
  k.fill_random(2);
  const DeviceTensor dq = to_device(q), dk = to_device(k);
  DeviceTensor dout = poisoned_like(q);
  EXPECT_NE(error_of([&] { bsa.run(dq.view, dk.view, dk.view, dout.view, {}); }).find("plan"),
            std::string::npos);
  std::vector<int32_t> far = pat.indices;
  far[0] = static_cast<int32_t>(c.NB);
  BlockSparseLayout bad = pat.layout;
  bad.indices = far.data();
  EXPECT_NE(error_of([&] { bsa.plan(bad, shape); }).find("outside [0, N / C"), std::string::npos);
  std::vector<int32_t> dec = pat.indptr;
  std::swap(dec[1], dec[2]);
  bad = pat.layout;
  bad.indptr = dec.data();
  if (dec[1] > dec[2])
    EXPECT_NE(error_of([&] { bsa.plan(bad, shape); }).find("non-decreasing"), std::string::npos);
  bad = pat.layout;
  bad.M += 1;
  EXPECT_NE(error_of([&] { bsa.plan(bad, shape); }).find("not a multiple of R"), std::string::npos);
  BlockSparseOptions causal;
  causal.causal = true;  // needs mask bytes the config has none of
  EXPECT_NE(error_of([&] { bsa.plan(pat.layout, shape, causal); }).find("max_mask_bytes"),
            std::string::npos);
  EXPECT_TRUE(all_bytes_are(dout)) << "a refused call wrote its output";
  // A good plan, then k of the wrong length.
  bsa.plan(pat.layout, shape);
  HostTensor short_k(c.dt, {pat.layout.N - c.C, c.hkv, c.d});
  const DeviceTensor dks = to_device(short_k);
  EXPECT_NE(error_of([&] {
              bsa.run(dq.view, dks.view, dks.view, dout.view, {});
            }).find("k: expected [N = "),
            std::string::npos);
  EXPECT_TRUE(all_bytes_are(dout));
}

// A cascade's shared-prefix level plus a sparse level, merged with ⊕ on the GPU, equals
// block-sparse attention over the prefix's blocks followed by the sparse layout's (shifted):
// prefill over the prefix (every row sees it) and BlockSparseAttention (causal) each return
// (out, lse); merge_state composes them.
TEST_F(BlockSparseGpu, SharedPrefixLevelPlusSparseLevelComposeUnderMerge) {
  BsCase c{16, 16, 8, 10, 0.4, true};  // N = 160 >= M = 128: the prefix is visible to every row
  c.seed = 77;
  const Pattern pat = make_pattern(c);
  const BlockSparseLayout& l = pat.layout;
  const int64_t prefix_blocks = 5, Lp = prefix_blocks * c.C;
  HostTensor q(c.dt, {l.M, c.hq, c.d}), kp(c.dt, {Lp, c.hkv, c.d}), vp(c.dt, {Lp, c.hkv, c.d}),
      k(c.dt, {l.N, c.hkv, c.d}), v(c.dt, {l.N, c.hkv, c.d});
  q.fill_random(1);
  kp.fill_random(2);
  vp.fill_random(3);
  k.fill_random(4);
  v.fill_random(5);
  // The reference: one layout over [prefix; keys], each row's prefix blocks then its own + 5.
  HostTensor kc(c.dt, {Lp + l.N, c.hkv, c.d}), vc(c.dt, {Lp + l.N, c.hkv, c.d});
  for (int64_t i = 0; i < Lp * c.hkv * c.d; ++i) {
    kc.set(i, kp.get(i));
    vc.set(i, vp.get(i));
  }
  for (int64_t i = 0; i < l.N * c.hkv * c.d; ++i) {
    kc.set(Lp * c.hkv * c.d + i, k.get(i));
    vc.set(Lp * c.hkv * c.d + i, v.get(i));
  }
  std::vector<int32_t> indptr = {0}, indices;
  for (int64_t i = 0; i < c.MB; ++i) {
    for (int32_t b = 0; b < prefix_blocks; ++b) indices.push_back(b);
    for (int32_t t = pat.indptr[i]; t < pat.indptr[i + 1]; ++t)
      indices.push_back(pat.indices[t] + static_cast<int32_t>(prefix_blocks));
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  const BlockSparseLayout lc{indptr.data(), indices.data(), l.M, Lp + l.N, c.R, c.C};
  BlockSparseOptions causal;
  causal.causal = true;
  HostTensor ref(DType::f32, {l.M, c.hq, c.d}), ref_lse(DType::f32, {l.M, c.hq});
  reference::block_sparse_attention(q.view(), kc.view(), vc.view(), lc, ref.view(), ref_lse.view(),
                                    causal);
  // The GPU: the two levels and their merge.
  const DeviceTensor dq = to_device(q), dkp = to_device(kp), dvp = to_device(vp), dk = to_device(k),
                     dv = to_device(v);
  HostTensor out(c.dt, {l.M, c.hq, c.d}), lse(DType::f32, {l.M, c.hq});
  DeviceTensor o1 = poisoned_like(out), s1 = poisoned_like(lse), o2 = poisoned_like(out),
               s2 = poisoned_like(lse), o = poisoned_like(out), so = poisoned_like(lse);
  ScopedStream s;
  single_prefill(dq.view, dkp.view, dvp.view, o1.view, s1.view, KVLayout::NHD, {}, s);
  BlockSparseConfig cfg;
  cfg.max_rows = l.M;
  cfg.max_block_rows = c.MB;
  cfg.max_blocks = static_cast<int64_t>(pat.indices.size());
  cfg.max_mask_bytes = block_sparse_mask_bytes(l, true);
  cfg.num_qo_heads = c.hq;
  DeviceBuffer ws(BlockSparseAttention::workspace_bytes(cfg));
  BlockSparseAttention bsa(cfg, ws.data(), ws.size());
  bsa.plan(l, {.num_qo_heads = c.hq, .num_kv_heads = c.hkv, .head_dim = c.d}, causal, s);
  bsa.run(dq.view, dk.view, dv.view, o2.view, s2.view, s);
  merge_state(o1.view, s1.view, o2.view, s2.view, o.view, so.view, s);
  synchronize(s);
  to_host(o, out);
  to_host(so, lse);
  const HostTensor ref_lowp = rounded_to(ref, c.dt);
  const ToleranceCheck t = check_tolerance(out.to_doubles(), ref.to_doubles(),
                                           ref_lowp.to_doubles(), tolerance_floor(c.dt));
  EXPECT_TRUE(t.pass) << t.str();
  const auto got = lse.to_doubles(), want = ref_lse.to_doubles();
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-3 * std::max(1.0, std::abs(want[i]))) << "lse[" << i << "]";
}

}  // namespace
}  // namespace flashkv::test
