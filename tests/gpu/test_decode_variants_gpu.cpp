// Batch decode with attention variants (issue 5) on the GPU vs the CPU reference of every
// built-in (reference_variants.h): each built-in alone and combined, both decode kernels, head
// dims 64/128/256, GQA groups 1-16 and MQA, pages 1/16, NHD/HND, f16/bf16, split-KV forced
// (fixed_split_size 64: the sink must enter exactly one chunk), empty and fully masked rows. A
// user variant exercising every hook is checked against the plain reference it must equal. RoPE
// and the user variant's key / value transforms also over e4m3 / e5m2 caches.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "flashkv/decode.h"
#include "flashkv/reference.h"
#include "flashkv/reference_variants.h"
#include "gpu/decode_case.h"
#include "runtime/driver.h"

namespace flashkv::test {
namespace {

class DecodeVariantsGpu : public GpuTest {};

// The variant's tensors on the host (for the reference) and on the device (for the kernel).
struct VariantInputs {
  HostTensor alibi, sinks, mask_indptr, k_rope_offset, q_rope_offset;
  std::vector<uint8_t> mask_bits;
  DeviceTensor d_alibi, d_sinks, d_mask_indptr, d_k_rope_offset, d_q_rope_offset;
  DeviceBuffer d_mask;
  AttentionVariant host, device;
};

struct VariantCase {
  DecodeCase base;
  std::function<void(AttentionVariant&)> scalars;  // window, soft-cap, sigmoid, rope mode ...
  bool alibi = false, sinks = false, custom_mask = false, rope_offsets = false;
  std::string name;
};

void make_inputs(const VariantCase& vc, VariantInputs& in) {
  const DecodeCase& c = vc.base;
  const int64_t B = static_cast<int64_t>(c.kv_lens.size());
  std::mt19937 rng(static_cast<uint32_t>(c.seed * 31 + 5));
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  AttentionVariant v;
  if (vc.scalars) vc.scalars(v);
  AttentionVariant dv = v;
  if (vc.alibi) {
    std::vector<double> s(c.num_qo_heads);
    for (int h = 0; h < c.num_qo_heads; ++h) s[h] = std::exp2(-8.0 * (h + 1) / c.num_qo_heads);
    in.alibi = make_tensor(DType::f32, {c.num_qo_heads}, s);
    in.d_alibi = to_device(in.alibi);
    v.alibi_slopes = in.alibi.view();
    dv.alibi_slopes = in.d_alibi.view;
  }
  if (vc.sinks) {
    std::vector<double> s(c.num_qo_heads);
    for (double& x : s) x = u(rng);
    in.sinks = make_tensor(DType::f32, {c.num_qo_heads}, s);
    in.d_sinks = to_device(in.sinks);
    v.sinks = in.sinks.view();
    dv.sinks = in.d_sinks.view;
  }
  if (vc.custom_mask) {
    // ~70% of keys kept; request 0 keeps none (an empty row: out 0, lse -inf or the sink).
    std::vector<bool> bits;
    std::vector<int64_t> qo(B, 1);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < c.kv_lens[b]; ++j) bits.push_back(b != 0 && (rng() % 10) < 7);
    std::vector<int32_t> indptr;
    in.mask_bits = pack_custom_mask(bits, qo, c.kv_lens, indptr);
    if (in.mask_bits.empty()) in.mask_bits.push_back(0);
    in.mask_indptr = make_i32(std::vector<int64_t>(indptr.begin(), indptr.end()));
    in.d_mask_indptr = to_device(in.mask_indptr);
    in.d_mask = DeviceBuffer(in.mask_bits.size());
    in.d_mask.copy_from_host(in.mask_bits.data(), in.mask_bits.size());
    v.custom_mask = {in.mask_bits.data(), static_cast<int64_t>(in.mask_bits.size()),
                     in.mask_indptr.view()};
    dv.custom_mask = {static_cast<const uint8_t*>(in.d_mask.data()),
                      static_cast<int64_t>(in.mask_bits.size()), in.d_mask_indptr.view};
  }
  if (vc.rope_offsets) {
    std::vector<int64_t> ko(B), qo(B);
    for (int64_t b = 0; b < B; ++b) {
      ko[b] = rng() % 5000;
      qo[b] = ko[b] + c.kv_lens[b] + rng() % 7;
    }
    in.k_rope_offset = make_i32(ko);
    in.q_rope_offset = make_i32(qo);
    in.d_k_rope_offset = to_device(in.k_rope_offset);
    in.d_q_rope_offset = to_device(in.q_rope_offset);
    v.rope.k_rope_offset = in.k_rope_offset.view();
    v.rope.q_rope_offset = in.q_rope_offset.view();
    dv.rope.k_rope_offset = in.d_k_rope_offset.view;
    dv.rope.q_rope_offset = in.d_q_rope_offset.view;
  }
  in.host = v;
  in.device = dv;
}

// Runs the case on the GPU and the reference; checks out (tolerance rule) and lse (-inf where
// the reference has -inf, else 1e-3 relative).
void run_and_check(const VariantCase& vc) {
  const DecodeCase& c = vc.base;
  SCOPED_TRACE(vc.name + ": " + c.str());
  const int64_t B = static_cast<int64_t>(c.kv_lens.size());
  PagedCacheHost cache = make_paged_cache(c.kv_lens, c.page_size, c.num_kv_heads, c.head_dim,
                                          c.layout, c.kv_dtype(), c.seed, true, c.interleaved);
  set_kv_scale(cache, c.scale, c.seed);
  HostTensor q(c.dtype, {B, c.num_qo_heads, c.head_dim});
  q.fill_random(c.seed * 7 + 1);
  VariantInputs in;
  make_inputs(vc, in);
  const bool softmax = in.host.use_softmax();

  HostTensor ref(DType::f32, {B, c.num_qo_heads, c.head_dim});
  HostTensor ref_lowp(c.dtype, {B, c.num_qo_heads, c.head_dim});
  HostTensor ref_lse(DType::f32, {B, c.num_qo_heads});
  reference::batch_decode_variant(q.view(), cache.cache, ref.view(),
                                  softmax ? ref_lse.view() : TensorView{}, in.host);
  for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));

  DeviceCache dc = to_device(cache);
  DeviceTensor dq = to_device(q);
  HostTensor out(c.dtype, {B, c.num_qo_heads, c.head_dim}), lse(DType::f32, {B, c.num_qo_heads});
  DeviceTensor dout = poisoned_like(out), dlse = poisoned_like(lse);
  BatchDecodeConfig cfg;
  cfg.max_batch = static_cast<int>(B);
  cfg.num_qo_heads = c.num_qo_heads;
  cfg.head_dim = c.head_dim;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  DecodePlanOptions opts = c.opts;
  opts.variant = Variant::builtin(in.device);
  Stream s = create_stream();
  dec.plan({.kv_indptr = cache.indptr.view().data_as<int32_t>(),
            .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
            .batch_size = static_cast<int>(B),
            .page_size = c.page_size},
           {.num_qo_heads = c.num_qo_heads,
            .num_kv_heads = c.num_kv_heads,
            .head_dim = c.head_dim,
            .q_dtype = c.dtype,
            .kv_dtype = c.kv_dtype(),
            .o_dtype = c.dtype},
           opts, s);
  if (c.opts.fixed_split_size > 0 && *std::max_element(c.kv_lens.begin(), c.kv_lens.end()) > 64)
    EXPECT_GT(dec.plan_info().num_split_tiles, 0) << "the case must exercise split-KV";
  dec.run(dq.view, dc.cache, dout.view, softmax ? dlse.view : TensorView{}, s);
  synchronize(s);
  destroy_stream(s);
  to_host(dout, out);
  const ToleranceCheck t = check_tolerance(out.to_doubles(), ref.to_doubles(),
                                           ref_lowp.to_doubles(), tolerance_floor(c.dtype));
  EXPECT_TRUE(t.pass) << t.str();
  if (!softmax) return;
  to_host(dlse, lse);
  const auto got = lse.to_doubles(), want = ref_lse.to_doubles();
  // With RoPE the kernel rounds the rotated q and k to the input dtype (as it stores them), so
  // each logit carries that rounding: ~2^-9 relative in bf16, which shows in the lse.
  const double lse_tol =
      in.host.rope.mode != RopeMode::none ? std::max(1e-3, 2 * tolerance_floor(c.dtype)) : 1e-3;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isinf(want[i])
                        ? got[i] == want[i]
                        : std::abs(got[i] - want[i]) <= lse_tol * std::max(1.0, std::abs(want[i]));
    if (!ok && bad++ < 3)
      ADD_FAILURE() << "lse[" << i << "] = " << got[i] << ", expected " << want[i];
  }
}

const std::vector<int64_t> kLens = {0, 1, 17, 300, 1000, 129};

// The built-ins one at a time, then the Gemma / gpt-oss combination.
std::vector<VariantCase> builtin_cases(const DecodeCase& base) {
  std::vector<VariantCase> v;
  auto add = [&](std::string name, std::function<void(AttentionVariant&)> f, bool alibi = false,
                 bool sinks = false, bool mask = false, bool offsets = false) {
    VariantCase c{base, std::move(f), alibi, sinks, mask, offsets, std::move(name)};
    v.push_back(std::move(c));
  };
  add("window", [](AttentionVariant& a) { a.window_left = 100; });
  add("soft-cap", [](AttentionVariant& a) {
    a.logits_soft_cap = 1.5f;  // small enough to bite on these logits
    a.sm_scale = 0.5f;
  });
  add("alibi", nullptr, true);
  add("sinks", nullptr, false, true);
  add("sigmoid", [](AttentionVariant& a) {
    a.sigmoid = true;
    a.sigmoid_bias = -1.0f;
  });
  add("custom-mask", nullptr, false, false, true);
  add("custom-mask+sinks", nullptr, false, true, true);
  add("rope-llama", [](AttentionVariant& a) { a.rope.mode = RopeMode::llama; });
  add(
      "rope-llama31+offsets",
      [](AttentionVariant& a) {
        a.rope.mode = RopeMode::llama31;
        a.rope.rope_theta = 5e5f;
        a.rope.rope_scale = 8.f;
      },
      false, false, false, true);
  add(
      "window+soft-cap+sinks",
      [](AttentionVariant& a) {
        a.window_left = 64;
        a.logits_soft_cap = 2.0f;
        a.sm_scale = 0.4f;
      },
      false, true);
  return v;
}

TEST_F(DecodeVariantsGpu, EveryBuiltinOnBothKernelsWithSplitKV) {
  uint64_t seed = 500;
  for (DecodeBackend b : {DecodeBackend::kTensorCores, DecodeBackend::kCudaCores}) {
    DecodeCase base;
    base.kv_lens = kLens;
    base.opts.backend = b;
    base.opts.fixed_split_size = 64;
    base.seed = seed++;
    for (const VariantCase& vc : builtin_cases(base)) run_and_check(vc);
  }
}

TEST_F(DecodeVariantsGpu, ShapesLayoutsPagesDtypes) {
  struct Shape {
    int qo, kv, d;
  };
  // GQA 1/4/8/16 and MQA; head_dim 64/128/256 (256: the CUDA-core kernel).
  const Shape shapes[] = {{8, 8, 64}, {32, 8, 128}, {32, 4, 256}, {32, 2, 128}, {32, 1, 64}};
  uint64_t seed = 900;
  for (DType dt : {DType::f16, DType::bf16}) {
    for (Shape sh : shapes) {
      {
        const int page = seed % 2 ? 16 : 1;
        DecodeCase base;
        base.kv_lens = {1, 77, 700, 0, 33};
        base.num_qo_heads = sh.qo;
        base.num_kv_heads = sh.kv;
        base.head_dim = sh.d;
        base.page_size = page;
        base.dtype = dt;
        base.layout = seed % 2 ? KVLayout::HND : KVLayout::NHD;
        base.opts.fixed_split_size = seed % 3 == 0 ? 0 : 64;
        base.seed = seed++;
        // The combination and RoPE with offsets cover every hook family.
        for (const VariantCase& vc : builtin_cases(base)) {
          if (vc.name == "window+soft-cap+sinks" || vc.name == "rope-llama31+offsets" ||
              vc.name == "sigmoid" || vc.name == "custom-mask+sinks" || vc.name == "alibi")
            run_and_check(vc);
        }
      }
    }
  }
}

TEST_F(DecodeVariantsGpu, VeryLongRequestSplitOverAllSMs) {
  DecodeCase base;
  base.kv_lens = {32768};
  base.seed = 77;
  for (const VariantCase& vc : builtin_cases(base)) {
    if (vc.name == "window+soft-cap+sinks" || vc.name == "rope-llama") run_and_check(vc);
  }
}

// The fused-RoPE variant over fp8 caches on both kernels (tiles staged widened:
// kv/kv_chunk_copy.cuh), head_dim 64/128/256, scales far from 1, per tensor and per KV head.
TEST_F(DecodeVariantsGpu, RopeOverFp8CacheOnBothKernels) {
  struct Shape {
    int qo, kv, d, page;
    DType dt, kv_dt;
    KVScaleCase scale;
  };
  const Shape shapes[] = {{32, 8, 128, 16, DType::f16, DType::e4m3, {0.01f, 50.0f, 0}},
                          {8, 8, 64, 1, DType::bf16, DType::e5m2, {2.0f, 0.5f, 2}},
                          {32, 2, 256, 16, DType::f16, DType::e4m3, {0.5f, 1.5f, 1}}};
  uint64_t seed = 950;
  for (DecodeBackend b : {DecodeBackend::kTensorCores, DecodeBackend::kCudaCores}) {
    for (const Shape& sh : shapes) {
      if (b == DecodeBackend::kTensorCores && sh.d == 256) continue;  // CUDA cores only
      DecodeCase base;
      base.kv_lens = {1, 77, 700, 0, 33};
      base.num_qo_heads = sh.qo;
      base.num_kv_heads = sh.kv;
      base.head_dim = sh.d;
      base.page_size = sh.page;
      base.dtype = sh.dt;
      base.fp8_kv = sh.kv_dt;
      base.scale = sh.scale;
      base.layout = seed % 2 ? KVLayout::HND : KVLayout::NHD;
      base.opts.backend = b;
      base.opts.fixed_split_size = 64;
      base.seed = seed++;
      for (const VariantCase& vc : builtin_cases(base))
        if (vc.name == "rope-llama" || vc.name == "rope-llama31+offsets") run_and_check(vc);
    }
  }
}

// Every built-in over an e4m3 cache on each kernel (GQA 32/8, d128, per-head scales).
void every_builtin_over_fp8(DecodeBackend b, uint64_t seed) {
  DecodeCase base;
  base.kv_lens = kLens;
  base.fp8_kv = DType::e4m3;
  base.scale = {0.5f, 2.0f, 2};
  base.opts.backend = b;
  base.opts.fixed_split_size = 64;
  base.seed = seed;
  for (const VariantCase& vc : builtin_cases(base)) run_and_check(vc);
}
TEST_F(DecodeVariantsGpu, EveryBuiltinOverFp8CacheOnTensorCores) {
  every_builtin_over_fp8(DecodeBackend::kTensorCores, 970);
}
TEST_F(DecodeVariantsGpu, EveryBuiltinOverFp8CacheOnCudaCores) {
  every_builtin_over_fp8(DecodeBackend::kCudaCores, 971);
}

// A user variant with every hook: q * 2, k * 0.25, v * 2, out * 0.5, a logits transform that is
// the identity and a mask that keeps all. Softmax is invariant to none of these scalings except
// through sm_scale, so the result equals plain attention with sm_scale * 0.5.
VariantSpec every_hook_spec() {
  VariantSpec s;
  s.name = "EveryHook";
  s.params = {{"qs", VariantParam::Kind::kF32},
              {"ks", VariantParam::Kind::kF32},
              {"vs", VariantParam::Kind::kF32},
              {"os", VariantParam::Kind::kF32},
              {"bias", VariantParam::Kind::kTensor, DType::f32}};
  s.source = R"(
struct EveryHook {
  using Args = Params;
  __device__ static void query_transform(const Args& a, const flashkv::VariantRow&, int, float& x1, float& x2) {
    x1 *= a.qs; x2 *= a.qs;
  }
  __device__ static void key_transform(const Args& a, const flashkv::VariantKey&, int, float& x1, float& x2) {
    x1 *= a.ks; x2 *= a.ks;
  }
  __device__ static float value_transform(const Args& a, const flashkv::VariantKey&, int, float v) { return v * a.vs; }
  __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition& p, float s) {
    return s + a.bias[p.qo_head];  // bias[h] = 0: a per-row constant would cancel anyway
  }
  __device__ static bool logits_mask(const Args&, const flashkv::VariantPosition& p) { return p.kv_idx >= 0; }
  __device__ static float output_transform(const Args& a, const flashkv::VariantRow&, int, float o) { return o * a.os; }
};
)";
  return s;
}

TEST_F(DecodeVariantsGpu, UserVariantWithEveryHookOnBothKernels) {
  // Over f16 and over an e4m3 cache (its key and value transforms: the widened tiles).
  for (int i = 0; i < 4; ++i) {
    const DecodeBackend b = i % 2 ? DecodeBackend::kCudaCores : DecodeBackend::kTensorCores;
    DecodeCase c;
    if (i >= 2) {
      c.fp8_kv = DType::e4m3;
      c.scale = {0.5f, 1.5f, 2};
    }
    c.kv_lens = {1, 300, 1000, 65};
    c.opts.backend = b;
    c.opts.fixed_split_size = 64;
    c.opts.sm_scale = 0.125f;
    c.seed = 11;
    HostTensor bias =
        make_tensor(DType::f32, {c.num_qo_heads}, std::vector<double>(c.num_qo_heads, 0.0));
    DeviceTensor d_bias = to_device(bias);
    c.opts.variant = Variant::user(every_hook_spec(), VariantArgs()
                                                          .set("qs", 2.f)
                                                          .set("ks", 0.25f)
                                                          .set("vs", 2.f)
                                                          .set("os", 0.5f)
                                                          .set("bias", d_bias.view));
    // run_decode_case's reference uses c.opts.sm_scale: give it the equivalent plain scale.
    DecodeCase plain = c;
    plain.opts.variant = Variant();
    plain.opts.sm_scale = 0.0625f;
    DecodeOutcome want = run_decode_case(plain);  // plain GPU run also checked below
    DecodeOutcome got = run_decode_case(c);
    // The reference inside run_decode_case(c) used sm_scale 0.125: compare the variant's output
    // with the plain case's reference-checked output instead (same tolerance floor).
    expect_decode_ok(plain, want);
    const auto a = got.out_host.to_doubles(), e = want.out_host.to_doubles();
    EXPECT_LE(rel_err(a, e), 2 * tolerance_floor(c.dtype))
        << (b == DecodeBackend::kCudaCores ? "cuda cores" : "tensor cores") << " " << c.str();
    EXPECT_FALSE(any_nan(a));
  }
}

TEST_F(DecodeVariantsGpu, BadVariantInputIsNamed) {
  DecodeCase c;
  c.kv_lens = {10, 20};
  HostTensor host_slopes = make_tensor(DType::f32, {32}, std::vector<double>(32, 0.5));
  AttentionVariant v;
  v.alibi_slopes = host_slopes.view();  // on the host: the kernel cannot read it
  c.opts.variant = Variant::builtin(v);
  const std::string msg = error_of([&] { run_decode_case(c); });
  EXPECT_NE(msg.find("variant.alibi_slopes"), std::string::npos) << msg;
  AttentionVariant sig;
  sig.sigmoid = true;
  c.opts.variant = Variant::builtin(sig);
  const std::string msg2 = error_of([&] { run_decode_case(c); });  // run_decode_case passes an lse
  EXPECT_NE(msg2.find("lse"), std::string::npos) << msg2;
}

// A captured graph keeps the variant's arguments by value: a later plan with the same kernel but
// other arguments is refused (it would replay the old ones); a window change is not (decode's
// window lives in the schedule, which every plan rewrites).
TEST_F(DecodeVariantsGpu, PlanRefusesOtherVariantArgumentsUnderACapturedGraph) {
  const DType dt = DType::f16;
  constexpr int kHqo = 32, kHkv = 8, kD = 128, kPage = 16;
  BatchDecodeConfig cfg{4, kHqo, kD};
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  PagedCacheHost cache = make_paged_cache({300, 7}, kPage, kHkv, kD, KVLayout::NHD, dt, 5);
  DeviceCache dc = to_device(cache);
  HostTensor q(dt, {2, kHqo, kD}), out(dt, {2, kHqo, kD});
  q.fill_random(6);
  DeviceTensor dq = to_device(q), dout = poisoned_like(out);
  const int32_t* ip = cache.indptr.view().data_as<int32_t>();
  const int32_t* lp = cache.last_page_len.view().data_as<int32_t>();
  auto plan_with = [&](float cap, int window_left) {
    AttentionVariant v;
    v.logits_soft_cap = cap;
    v.window_left = window_left;
    DecodePlanOptions o;
    o.enable_cuda_graph = true;
    o.variant = Variant::builtin(v);
    dec.plan({.kv_indptr = ip, .kv_last_page_len = lp, .batch_size = 2, .page_size = kPage},
             {.num_qo_heads = kHqo,
              .num_kv_heads = kHkv,
              .head_dim = kD,
              .q_dtype = dt,
              .kv_dtype = dt,
              .o_dtype = dt},
             o, nullptr);
  };
  Stream s = create_stream();
  plan_with(30.f, -1);
  const auto& d = runtime::driver();
  runtime::check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
  dec.run(dq.view, dc.cache, dout.view, TensorView(), s);
  CUgraph g = nullptr;
  runtime::check_cu(d.cuStreamEndCapture(s, &g), "end capture");
  EXPECT_NE(error_of([&] { plan_with(50.f, -1); }).find("variant arguments"), std::string::npos);
  EXPECT_NO_THROW(plan_with(30.f, 100));
  d.cuGraphDestroy(g);
  dec.forget_captured_graphs();
  EXPECT_NO_THROW(plan_with(50.f, -1));
  synchronize(s);
  destroy_stream(s);
}

}  // namespace
}  // namespace flashkv::test
