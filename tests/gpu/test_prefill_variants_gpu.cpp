// Batch prefill with the built-in attention variants (PrefillPlanOptions.variant) on the GPU vs the
// CPU reference of variants.h (reference::batch_prefill_paged_variant), paged (page sizes 1, 16)
// and ragged KV on the same data: window (left; left + right), soft-cap, ALiBi, sinks, sigmoid,
// custom mask, RoPE llama / llama31 with and without rope offsets, and window + soft-cap + sinks;
// causal (from the options or from the built-in) and not; GQA 32/8 and MHA 8/8; head_dim 64, 128,
// 256; f16 and bf16; query tiles of 16 and 32 rows (warps split KV tiles) and the heuristic's;
// RoPE over e4m3 / e5m2 caches (the reference on the dequantized values).
// Split-KV is always on (fixed_split_size 64: the long requests split and merge).
//
// Outputs: the tolerance rule of tests/common/test_util.h (error at most 2x that of the reference
// rounded to the dtype, plus a floor; never looser than 1e-2). lse within 1e-4 relative, except
// with RoPE: the kernel keeps the rotated q and k in 16 bits (variant.cuh), the reference in
// double, so there lse gets the dtype's unit roundoff. Rows that see no key: out exactly 0, lse
// -inf (softmax) or the sink. Outputs are poisoned with NaN before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashkv/reference_variants.h"
#include "gpu/prefill_case.h"

namespace flashkv::test {
namespace {

class PrefillVariantsGpu : public GpuTest {};

using Requests = PrefillRequests;

// qo_len 1, 17, 128 over up to 1000 keys; (40, 13): the first 27 rows sit before key 0 (empty
// when causal or with a right window bound); (5, 5): a short prompt. Sized so that every split
// chunk of 64 keys fits the workspace's slots at the heuristic's tile.
const Requests kRequests = {{1, 1000}, {17, 600}, {128, 200}, {40, 13}, {5, 5}};
// For 16- and 32-row tiles (more tiles per request, so more slots): no 128-query request.
const Requests kSmallTileRequests = {{1, 1000}, {17, 600}, {40, 13}, {3, 130}};
// For the wgmma kernel: the same and a long prompt, whose window leaves most KV tiles of its last
// query tiles unseen (the kernel skips them) and which dynamic splitting cuts into chunks.
const Requests kWgmmaRequests = {{1, 1000}, {17, 600}, {128, 200}, {40, 13}, {5, 5}, {300, 2600}};

struct Builtins {
  int window_left = -1, window_right = -1;
  float soft_cap = 0.f;
  bool alibi = false, sinks = false, sigmoid = false, custom_mask = false;
  RopeMode rope = RopeMode::none;
  bool rope_offsets = false;
};

struct VCase {
  Builtins b;
  bool causal = false;
  bool causal_in_variant = false;  // the built-in's causal (and sm_scale), not the options'
  int hqo = 32, hkv = 8, d = 128, page = 16;
  DType dt = DType::f16;
  int tile_rows = 0;
  bool expect_empty_rows = false;  // the case is built to have rows that see no key
  uint64_t seed = 1;
  DType fp8_kv = DType::f32;  // e4m3 / e5m2: an fp8 cache (staged widened when the variant
  KVScaleCase scale;          // rotates keys), with these scales; else the cache in dt
  // kWgmma: the Hopper kernel (skipped off sm_90a), dynamic splitting (its TMA path at page 16)
  // and the long-request set; kAuto keeps fixed_split_size 64 / 128 and the heuristic's tile.
  PrefillBackend backend = PrefillBackend::kAuto;
  DType kv_dtype() const { return is_fp8_dtype(fp8_kv) ? fp8_kv : dt; }
};

std::string describe(const VCase& c) {
  const Builtins& b = c.b;
  std::string s = std::string(dtype_name(c.dt)) + " H" + std::to_string(c.hqo) + "/" +
                  std::to_string(c.hkv) + " D" + std::to_string(c.d) + " page " +
                  std::to_string(c.page) + " tile_rows " + std::to_string(c.tile_rows) +
                  (c.causal ? (c.causal_in_variant ? " causal(variant)" : " causal") : "");
  if (b.window_left >= 0 || b.window_right >= 0)
    s += " window(" + std::to_string(b.window_left) + "," + std::to_string(b.window_right) + ")";
  if (b.soft_cap > 0) s += " softcap " + std::to_string(b.soft_cap);
  if (b.alibi) s += " alibi";
  if (b.sinks) s += " sinks";
  if (b.sigmoid) s += " sigmoid";
  if (b.custom_mask) s += " custom_mask";
  if (b.rope != RopeMode::none) s += std::string(" rope ") + rope_mode_name(b.rope);
  if (b.rope_offsets) s += " +offsets";
  if (is_fp8_dtype(c.fp8_kv)) s += std::string(" kv ") + dtype_name(c.fp8_kv) + c.scale.str();
  if (c.backend == PrefillBackend::kWgmma) s += " wgmma";
  return s;
}

// The variant's tensors on the host (for the reference) and on the device (for the kernel).
struct VariantData {
  HostTensor slopes, sinks, mask_indptr, q_off, k_off;
  std::vector<uint8_t> mask_bytes;
  DeviceTensor d_slopes, d_sinks, d_mask_indptr, d_q_off, d_k_off;
  DeviceBuffer d_mask;
  AttentionVariant host, device;
};

void make_variant(const VCase& c, const Requests& reqs, VariantData& v) {
  const Builtins& b = c.b;
  std::mt19937_64 rng(c.seed * 31 + 7);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  AttentionVariant a;
  a.window_left = b.window_left;
  a.window_right = b.window_right;
  a.logits_soft_cap = b.soft_cap;
  a.sigmoid = b.sigmoid;
  a.sigmoid_bias = b.sigmoid ? -1.0f : 0.0f;
  a.causal = c.causal;
  if (c.causal_in_variant) a.sm_scale = 0.15f;  // differs from 1/sqrt(d): the built-in's applies
  a.rope.mode = b.rope;
  if (b.rope == RopeMode::llama31) {
    a.rope.rope_scale = 8.f;
    a.rope.rope_theta = 5e5f;
  }
  AttentionVariant dv = a;
  dv.causal = c.causal_in_variant && c.causal;
  if (b.alibi) {  // the ALiBi paper's slopes 2^(-8 (h + 1) / H)
    std::vector<double> s(c.hqo);
    for (int h = 0; h < c.hqo; ++h) s[h] = std::exp2(-8.0 * (h + 1) / c.hqo);
    v.slopes = make_tensor(DType::f32, {c.hqo}, s);
    v.d_slopes = to_device(v.slopes);
    a.alibi_slopes = v.slopes.view();
    dv.alibi_slopes = v.d_slopes.view;
  }
  if (b.sinks) {  // large enough to matter next to short (windowed) rows
    v.sinks = HostTensor(DType::f32, {c.hqo});
    v.sinks.fill_random(c.seed * 13 + 1, 0.0, 4.0);
    v.d_sinks = to_device(v.sinks);
    a.sinks = v.sinks.view();
    dv.sinks = v.d_sinks.view;
  }
  std::vector<int64_t> qo_lens, kv_lens;
  for (auto [qo, kv] : reqs) {
    qo_lens.push_back(qo);
    kv_lens.push_back(kv);
  }
  if (b.custom_mask) {  // 80% kept; the middle row of every request keeps nothing
    std::vector<bool> mask;
    for (auto [qo, kv] : reqs)
      for (int64_t i = 0; i < qo; ++i)
        for (int64_t j = 0; j < kv; ++j) mask.push_back(i != qo / 2 && uni(rng) < 0.8);
    std::vector<int32_t> indptr;
    v.mask_bytes = pack_custom_mask(mask, qo_lens, kv_lens, indptr);
    v.mask_indptr = make_i32(std::vector<int64_t>(indptr.begin(), indptr.end()));
    v.d_mask_indptr = to_device(v.mask_indptr);
    v.d_mask = DeviceBuffer(std::max<size_t>(v.mask_bytes.size(), 16));
    v.d_mask.copy_from_host(v.mask_bytes.data(), v.mask_bytes.size());
    a.custom_mask = {v.mask_bytes.data(), static_cast<int64_t>(v.mask_bytes.size()),
                     v.mask_indptr.view()};
    dv.custom_mask = {static_cast<const uint8_t*>(v.d_mask.data()),
                      static_cast<int64_t>(v.mask_bytes.size()), v.d_mask_indptr.view};
  }
  if (b.rope_offsets) {  // positions far from the causal ones, different per request
    std::vector<int64_t> q_off, k_off;
    for (size_t r = 0; r < reqs.size(); ++r) {
      k_off.push_back(700 * static_cast<int64_t>(r) + 3);
      for (int64_t i = 0; i < reqs[r].first; ++i) q_off.push_back(4000 + 5 * i + 11 * r);
    }
    v.q_off = make_i32(q_off);
    v.k_off = make_i32(k_off);
    v.d_q_off = to_device(v.q_off);
    v.d_k_off = to_device(v.k_off);
    a.rope.q_rope_offset = v.q_off.view();
    a.rope.k_rope_offset = v.k_off.view();
    dv.rope.q_rope_offset = v.d_q_off.view;
    dv.rope.k_rope_offset = v.d_k_off.view;
  }
  v.host = a;
  v.device = dv;
}

// (row, head) pairs whose reference output is exactly zero (no key kept: the reference sums in
// double, so only an empty row is exactly 0) must be exactly 0 here too, with lse -inf when the
// reference's is, else (sinks) close to it. Returns how many such pairs there are.
int64_t check_empty_rows(const HostTensor& out, const HostTensor* lse, const HostTensor& ref,
                         const HostTensor& ref_lse, int d, const std::string& tag) {
  const int64_t pairs = ref.numel() / d;
  int64_t empty = 0, bad = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    bool ref_zero = true;
    for (int e = 0; e < d && ref_zero; ++e) ref_zero = ref.get(p * d + e) == 0.0;
    if (!ref_zero) continue;
    ++empty;
    bool ok = true;
    for (int e = 0; e < d && ok; ++e) ok = out.get(p * d + e) == 0.0;
    if (lse != nullptr) {
      const double r = ref_lse.get(p), g = lse->get(p);
      ok = ok && (std::isinf(r) ? g == r : std::abs(g - r) <= 1e-5 * std::abs(r) + 1e-6);
    }
    bad += ok ? 0 : 1;
  }
  EXPECT_EQ(bad, 0) << tag << ": of the " << empty << " (row, head) pairs that see no key, these "
                    << "are not exactly out = 0 with lse -inf (or the sink)";
  return empty;
}

void run_case(const VCase& c) {
  const bool wgmma = c.backend == PrefillBackend::kWgmma;
  const Requests& reqs = wgmma                                    ? kWgmmaRequests
                         : c.tile_rows == 16 || c.tile_rows == 32 ? kSmallTileRequests
                                                                  : kRequests;
  const std::string tag = describe(c);
  std::vector<int64_t> qo_lens, kv_lens;
  for (auto [qo, kv] : reqs) {
    qo_lens.push_back(qo);
    kv_lens.push_back(kv);
  }
  const int B = static_cast<int>(reqs.size());
  int64_t nnz = 0;
  for (int64_t l : qo_lens) nnz += l;
  const bool softmax = !c.b.sigmoid;

  PagedCacheHost cache = make_paged_cache(kv_lens, c.page, c.hkv, c.d, KVLayout::NHD, c.kv_dtype(),
                                          c.seed, true, false);
  set_kv_scale(cache, c.scale, c.seed);
  const HostTensor qo_indptr = indptr_of(qo_lens);
  HostTensor q(c.dt, {nnz, c.hqo, c.d});
  q.fill_random(c.seed * 7919 + 17);
  VariantData vd;
  make_variant(c, reqs, vd);

  HostTensor ref(DType::f32, {nnz, c.hqo, c.d}), ref_lse(DType::f32, {nnz, c.hqo});
  reference::batch_prefill_paged_variant(q.view(), qo_indptr.view(), cache.cache, ref.view(),
                                         softmax ? ref_lse.view() : TensorView(), vd.host);
  const HostTensor ref_lowp = rounded_to(ref, c.dt);
  const std::vector<double> ref_d = ref.to_doubles(), ref_lowp_d = ref_lowp.to_doubles();
  const double lse_tol = c.b.rope != RopeMode::none ? tolerance_floor(c.dt) : 1e-4;

  const DeviceCache dcache = to_device(cache);
  const DeviceTensor dq = to_device(q), dk = to_device(cache.k_ragged),
                     dv = to_device(cache.v_ragged);
  PrefillPlanOptions opts;
  opts.causal = c.causal && !c.causal_in_variant;
  // Small query tiles make many tiles: chunks of 64 would exceed the workspace's work-item bound
  // (prefill.h: fixed_split_size), 128 still splits the long requests.
  opts.fixed_split_size = wgmma ? 0 : c.tile_rows == 16 || c.tile_rows == 32 ? 128 : 64;
  opts.tile_rows = c.tile_rows;
  opts.backend = c.backend;
  opts.variant = Variant::builtin(vd.device);
  const BatchPrefillConfig cfg = prefill_config(B, nnz, c.hqo, c.d);
  const int32_t* qo_ptr = qo_indptr.view().data_as<int32_t>();

  for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
    const std::string what = tag + " [" + prefill_kv_name(kv) + "]";
    HostTensor out(c.dt, {nnz, c.hqo, c.d}), lse(DType::f32, {nnz, c.hqo});
    DeviceTensor dout = poisoned_like(out), dlse = poisoned_like(lse);
    const TensorView lse_view = softmax ? dlse.view : TensorView();
    PrefillPlanInfo info;
    ScopedStream s;
    DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
    if (kv == PrefillKV::kPaged) {
      BatchPrefillPaged pf(cfg, ws.data(), ws.size());
      pf.plan({.qo_indptr = qo_ptr,
               .kv_indptr = cache.indptr.view().data_as<int32_t>(),
               .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
               .batch_size = B,
               .page_size = c.page},
              {.num_qo_heads = c.hqo,
               .num_kv_heads = c.hkv,
               .head_dim = c.d,
               .q_dtype = c.dt,
               .kv_dtype = c.kv_dtype(),
               .o_dtype = c.dt},
              opts, s);
      pf.run(dq.view, dcache.cache, dout.view, lse_view, s);
      synchronize(s);
      info = pf.plan_info();
    } else {
      BatchPrefillRagged pf(cfg, ws.data(), ws.size());
      pf.plan({.qo_indptr = qo_ptr,
               .kv_indptr = cache.kv_indptr.view().data_as<int32_t>(),
               .kv_last_page_len = nullptr,
               .batch_size = B,
               .page_size = 0},
              {.num_qo_heads = c.hqo,
               .num_kv_heads = c.hkv,
               .head_dim = c.d,
               .q_dtype = c.dt,
               .kv_dtype = c.kv_dtype(),
               .o_dtype = c.dt},
              opts, s);
      pf.run(dq.view, dk.view, dv.view, dout.view, lse_view, dcache.cache.scale, s);
      synchronize(s);
      info = pf.plan_info();
    }
    // A window the schedule follows can leave every tile shorter than a chunk.
    const bool window_short =
        c.b.window_left >= 0 && (wgmma || c.b.window_left <= opts.fixed_split_size);
    if (!window_short) EXPECT_GT(info.num_split_tiles, 0) << what << ": split-KV was not exercised";
    if (wgmma) {
      EXPECT_TRUE(info.wgmma) << what;
      // Pages of 16 and ragged KV go by TMA under dynamic splitting (chunks start on tiles).
      EXPECT_EQ(info.kv_tma, c.page >= 16 || kv == PrefillKV::kRagged) << what;
    }
    to_host(dout, out);
    to_host(dlse, lse);

    const std::vector<double> out_d = out.to_doubles();
    const ToleranceCheck t = check_tolerance(out_d, ref_d, ref_lowp_d, tolerance_floor(c.dt));
    EXPECT_TRUE(t.pass) << what << ": " << t.str() << "; NaN in out: " << any_nan(out_d);
    if (softmax) {
      const std::vector<double> lse_d = lse.to_doubles();
      EXPECT_FALSE(any_nan(lse_d)) << what << ": lse has NaN (unwritten rows?)";
      EXPECT_LE(rel_err(lse_d, ref_lse.to_doubles()), lse_tol) << what << ": lse";
    }
    const int64_t empty = check_empty_rows(out, softmax ? &lse : nullptr, ref, ref_lse, c.d, what);
    if (c.expect_empty_rows) EXPECT_GT(empty, 0) << what << ": the case has no empty rows";
  }
}

TEST_F(PrefillVariantsGpu, SlidingWindow) {
  VCase c;  // left only, causal (Mistral / Gemma local layers)
  c.b.window_left = 32;
  c.causal = true;
  c.seed = 11;
  run_case(c);
  // left + right, not causal: with the right bound, the first rows of (40, 13) see nothing.
  VCase lr;
  lr.b.window_left = 8;
  lr.b.window_right = 4;
  lr.hqo = lr.hkv = 8;
  lr.d = 64;
  lr.page = 1;
  lr.dt = DType::bf16;
  lr.tile_rows = 16;
  lr.expect_empty_rows = true;
  lr.seed = 12;
  run_case(lr);
}

TEST_F(PrefillVariantsGpu, SoftCap) {
  VCase c;  // causal from the built-in, with its own sm_scale
  c.b.soft_cap = 1.0f;
  c.causal = c.causal_in_variant = true;
  c.d = 256;
  c.dt = DType::bf16;
  c.seed = 21;
  run_case(c);
  VCase m;
  m.b.soft_cap = 2.0f;
  m.hqo = m.hkv = 8;
  m.d = 64;
  m.page = 1;
  m.tile_rows = 32;
  m.seed = 22;
  run_case(m);
}

TEST_F(PrefillVariantsGpu, Alibi) {
  VCase c;
  c.b.alibi = true;
  c.causal = true;
  c.hqo = c.hkv = 8;
  c.page = 1;
  c.tile_rows = 32;
  c.seed = 31;
  run_case(c);
  VCase g;
  g.b.alibi = true;
  g.d = 64;
  g.dt = DType::bf16;
  g.seed = 32;
  run_case(g);
}

TEST_F(PrefillVariantsGpu, Sinks) {
  VCase c;  // 32-row tiles: the sink folds in after the warps' merge
  c.b.sinks = true;
  c.tile_rows = 32;
  c.seed = 41;
  run_case(c);
  VCase m;  // causal: the first rows of (40, 13) see only the sink (lse = sink)
  m.b.sinks = true;
  m.causal = true;
  m.hqo = m.hkv = 8;
  m.d = 64;
  m.page = 1;
  m.dt = DType::bf16;
  m.expect_empty_rows = true;
  m.seed = 42;
  run_case(m);
}

TEST_F(PrefillVariantsGpu, Sigmoid) {
  VCase c;
  c.b.sigmoid = true;
  c.causal = true;
  c.seed = 51;
  run_case(c);
  VCase m;  // 16-row tiles: sums across the warps; split partial states sum in the merge
  m.b.sigmoid = true;
  m.hqo = m.hkv = 8;
  m.d = 64;
  m.page = 1;
  m.dt = DType::bf16;
  m.tile_rows = 16;
  m.seed = 52;
  run_case(m);
}

TEST_F(PrefillVariantsGpu, CustomMask) {
  VCase c;  // every request's middle row is all zeros: out 0, lse -inf
  c.b.custom_mask = true;
  c.dt = DType::bf16;
  c.expect_empty_rows = true;
  c.seed = 61;
  run_case(c);
  VCase m;
  m.b.custom_mask = true;
  m.causal = true;
  m.hqo = m.hkv = 8;
  m.d = 256;
  m.page = 1;
  m.expect_empty_rows = true;
  m.seed = 62;
  run_case(m);
}

TEST_F(PrefillVariantsGpu, RopeLlamaAndLlama31WithAndWithoutOffsets) {
  uint64_t seed = 71;
  for (RopeMode mode : {RopeMode::llama, RopeMode::llama31}) {
    for (bool offsets : {false, true}) {
      VCase c;
      c.b.rope = mode;
      c.b.rope_offsets = offsets;
      c.causal = !offsets;
      c.causal_in_variant = mode == RopeMode::llama31;
      if (offsets) {  // MHA, the other dtype and head_dim
        c.hqo = c.hkv = 8;
        c.d = mode == RopeMode::llama ? 64 : 256;
        c.dt = DType::bf16;
        c.page = 1;
        c.tile_rows = mode == RopeMode::llama31 ? 32 : 0;
      }
      c.seed = seed++;
      run_case(c);
    }
  }
}

// The fused-RoPE variant over an fp8 cache: the tiles are staged widened (kv/kv_chunk_copy.cuh),
// rotated there once in the query's dtype; scales far from 1, per tensor and per KV head.
TEST_F(PrefillVariantsGpu, RopeOverFp8Cache) {
  VCase c;
  c.b.rope = RopeMode::llama;
  c.causal = true;
  c.fp8_kv = DType::e4m3;
  c.scale = {0.01f, 50.0f, 0};
  c.seed = 91;
  run_case(c);
  VCase m;  // llama31 with offsets, MHA, bf16 over e5m2, pages of 1, 32-row tiles
  m.b.rope = RopeMode::llama31;
  m.b.rope_offsets = true;
  m.hqo = m.hkv = 8;
  m.d = 64;
  m.dt = DType::bf16;
  m.page = 1;
  m.tile_rows = 32;
  m.fp8_kv = DType::e5m2;
  m.scale = {2.0f, 0.5f, 2};
  m.seed = 92;
  run_case(m);
  VCase w;  // head_dim 256 with a window and soft-cap besides
  w.b.rope = RopeMode::llama;
  w.b.window_left = 64;
  w.b.soft_cap = 5.0f;
  w.causal = true;
  w.hqo = 16;
  w.hkv = 1;
  w.d = 256;
  w.fp8_kv = DType::e4m3;
  w.scale = {0.5f, 1.5f, 1};
  w.seed = 93;
  run_case(w);
}

// Every logits hook over fp8 caches (the tiles stay fp8 there: nothing rewrites them): ALiBi,
// sinks, sigmoid, custom mask, window + soft-cap.
TEST_F(PrefillVariantsGpu, LogitsHooksOverFp8Cache) {
  uint64_t seed = 94;
  for (int i = 0; i < 5; ++i) {
    VCase c;
    c.causal = true;
    c.fp8_kv = i % 2 ? DType::e5m2 : DType::e4m3;
    c.scale = {0.25f, 3.0f, i % 3};
    c.seed = seed++;
    if (i == 0) c.b.alibi = true;
    if (i == 1) c.b.sinks = true;
    if (i == 2) c.b.sigmoid = true;
    if (i == 3) {
      c.b.custom_mask = true;
      c.expect_empty_rows = true;
      c.dt = DType::bf16;
    }
    if (i == 4) {
      c.b.window_left = 48;
      c.b.soft_cap = 3.0f;
      c.tile_rows = 16;
    }
    run_case(c);
  }
}

TEST_F(PrefillVariantsGpu, WindowSoftCapSinks) {
  VCase c;  // gpt-oss / Gemma-like: causal local window, soft-cap, sinks
  c.b.window_left = 64;
  c.b.soft_cap = 5.0f;
  c.b.sinks = true;
  c.causal = true;
  c.seed = 81;
  run_case(c);
  VCase m;  // left + right: empty rows keep the sink (lse = sink)
  m.b.window_left = 8;
  m.b.window_right = 4;
  m.b.soft_cap = 2.0f;
  m.b.sinks = true;
  m.hqo = m.hkv = 8;
  m.d = 64;
  m.page = 1;
  m.dt = DType::bf16;
  m.tile_rows = 16;
  m.expect_empty_rows = true;
  m.seed = 82;
  run_case(m);
}

// Every variant the Hopper wgmma kernel runs (softmax, no key / value rewrites), forced onto it:
// window (left; left + right: the key-range form), soft-cap, ALiBi, sinks, custom mask, window +
// ALiBi and window + soft-cap + sinks (the mask-hook form), over GQA, MHA and MQA, head_dim 64 /
// 128 / 256, f16 / bf16, pages of 16 (TMA) and 1 (the producer's gather), causal and not.
TEST_F(PrefillVariantsGpu, WgmmaKernelVariants) {
  if (device_info(0).arch != "sm_90a") GTEST_SKIP() << "the wgmma kernel needs an sm_90a GPU";
  uint64_t seed = 201;
  const auto run = [&](VCase c) {
    c.backend = PrefillBackend::kWgmma;
    c.seed = seed++;
    run_case(c);
  };
  VCase window;  // Mistral-style local attention, causal
  window.b.window_left = 100;
  window.causal = true;
  run(window);
  VCase lr;  // left + right, not causal, MHA, d64 bf16, page 1: rows that see nothing
  lr.b.window_left = 8;
  lr.b.window_right = 4;
  lr.hqo = lr.hkv = 8;
  lr.d = 64;
  lr.page = 1;
  lr.dt = DType::bf16;
  lr.expect_empty_rows = true;
  run(lr);
  VCase cap;  // Gemma: soft-cap, causal from the built-in, d256
  cap.b.soft_cap = 30.0f;
  cap.causal = cap.causal_in_variant = true;
  cap.d = 256;
  cap.dt = DType::bf16;
  run(cap);
  VCase alibi;
  alibi.b.alibi = true;
  alibi.causal = true;
  alibi.hqo = alibi.hkv = 16;
  run(alibi);
  VCase sinks;  // causal: the first rows of (40, 13) see only the sink
  sinks.b.sinks = true;
  sinks.causal = true;
  sinks.d = 64;
  sinks.page = 1;
  sinks.expect_empty_rows = true;
  run(sinks);
  VCase group16;  // window and ALiBi at group 16
  group16.b.window_left = 300;
  group16.b.alibi = true;
  group16.causal = true;
  group16.hqo = 32;
  group16.hkv = 2;
  run(group16);
  VCase mask;
  mask.b.custom_mask = true;
  mask.causal = true;
  mask.dt = DType::bf16;
  mask.expect_empty_rows = true;
  run(mask);
  VCase gemma;  // window + soft-cap + sinks, MQA
  gemma.b.window_left = 200;
  gemma.b.soft_cap = 5.0f;
  gemma.b.sinks = true;
  gemma.causal = true;
  gemma.hqo = 8;
  gemma.hkv = 1;
  gemma.d = 256;
  run(gemma);
}

}  // namespace
}  // namespace flashkv::test
