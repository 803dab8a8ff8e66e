// The CPU reference over the quantized KV formats (kv_quant.h): batch decode and paged prefill over
// a quantized cache equal the same ops over an f32 cache of the dequantized values (NHD and HND,
// GQA and MHA, pages 1 and 16); the quantizing append writes what the host quantizer writes; the
// group-scale checks (shape, dtype, bad values, missing / extra pools) name the argument and
// leave the outputs untouched; plan checks refuse the formats on the GPU (NotImplementedError,
// naming issue 42) and take them on the host; a CUDA cache in a format is refused at run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/cuda_view.h"
#include "common/kv_quant_util.h"
#include "common/test_util.h"
#include "flashkv/error.h"
#include "flashkv/kv_quant.h"
#include "flashkv/plan_checks.h"
#include "flashkv/reference.h"
#include "flashkv/reference_kv_ops.h"

namespace flashkv {
namespace {

using test::error_of;

struct FormatCase {
  const char* name;
  KVQuantFormat f;
  DType value, scale;
  float tensor_scale;
};

const FormatCase kCases[] = {
    {"e4m3-per-token f32", {KVQuant::kFp8PerTokenHead, 0}, DType::e4m3, DType::f32, 1.0f},
    {"e5m2-per-token bf16", {KVQuant::kFp8PerTokenHead, 0}, DType::e5m2, DType::bf16, 0.5f},
    {"int4-g32 f32", {KVQuant::kInt4, 32}, DType::u8, DType::f32, 1.0f},
    {"int4-g64 bf16", {KVQuant::kInt4, 64}, DType::u8, DType::bf16, 1.0f},
    {"int4-g128 f16", {KVQuant::kInt4, 128}, DType::u8, DType::f16, 2.0f},
    {"nvfp4", {KVQuant::kNvfp4, 16}, DType::u8, DType::e4m3, 1.0f / 2688.0f},
};

TEST(KvQuantReference, DecodeAndPrefillEqualTheDequantizedCache) {
  const std::vector<int64_t> lens = {1, 37, 0, 130};
  for (const FormatCase& c : kCases) {
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
      for (auto [page, heads] : {std::pair{16, 2}, std::pair{1, 4}}) {
        const int d = 128, h_qo = 4;
        const test::QuantizedCache q = test::make_quantized_cache(
            lens, page, heads, d, layout, c.f, c.value, c.scale, c.tensor_scale, 7);
        const std::string what = std::string(c.name) + " " + kv_layout_name(layout) + " page " +
                                 std::to_string(page) + " H_kv " + std::to_string(heads);
        const int64_t b = static_cast<int64_t>(lens.size());
        HostTensor qd(DType::f16, {b, h_qo, d});
        qd.fill_random(3);
        HostTensor o1(DType::f32, {b, h_qo, d}), o2(DType::f32, {b, h_qo, d});
        HostTensor l1(DType::f32, {b, h_qo}), l2(DType::f32, {b, h_qo});
        reference::batch_decode(qd.view(), q.cache, o1.view(), l1.view());
        reference::batch_decode(qd.view(), q.dequantized, o2.view(), l2.view());
        // The dequantized cache holds the exact values rounded to f32 (~6e-8 relative).
        EXPECT_LE(test::rel_err(o1.to_doubles(), o2.to_doubles()), 1e-6) << what;
        EXPECT_LE(test::rel_err(l1.to_doubles(), l2.to_doubles()), 1e-6) << what;

        const HostTensor qo_indptr = test::make_i32({0, 1, 9, 9, 12});
        HostTensor qp(DType::bf16, {12, h_qo, d});
        qp.fill_random(4);
        HostTensor p1(DType::f32, {12, h_qo, d}), p2(DType::f32, {12, h_qo, d});
        const AttentionOptions causal{.causal = true};
        reference::batch_prefill_paged(qp.view(), qo_indptr.view(), q.cache, p1.view(), {}, causal);
        reference::batch_prefill_paged(qp.view(), qo_indptr.view(), q.dequantized, p2.view(), {},
                                       causal);
        EXPECT_LE(test::rel_err(p1.to_doubles(), p2.to_doubles()), 1e-6) << what;
      }
    }
  }
}

TEST(KvQuantReference, QuantizingAppendWritesWhatTheHostQuantizerWrites) {
  for (const FormatCase& c : kCases) {
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
      const int d = 128, heads = 2;
      const std::vector<int64_t> lens = {5, 20};
      test::QuantizedCache q =
          test::make_quantized_cache(lens, 8, heads, d, layout, c.f, c.value, c.scale, 1.0f, 9);
      q.cache.scale.k = q.cache.scale.v = c.tensor_scale;
      // New rows for positions 4 of request 0 and 19 of request 1 (the last slot of each).
      HostTensor k_new(DType::bf16, {2, heads, d}), v_new(DType::bf16, {2, heads, d});
      k_new.fill_random(21, -4.0, 4.0);
      v_new.fill_random(22, -4.0, 4.0);
      const HostTensor batch = test::make_i32({0, 1}), pos = test::make_i32({4, 19});
      const std::vector<double> k_before = q.kq.to_doubles();
      reference::append_paged_kv_cache(k_new.view(), v_new.view(), batch.view(), pos.view(),
                                       q.cache);
      // Expected: quantize_kv of the same rows.
      const int64_t vlast = c.f.packed() ? d / 2 : d, groups = c.f.groups(d);
      HostTensor ev(c.value, {2, heads, vlast}), es(c.scale, {2, heads, groups}),
          ez(c.scale, {2, heads, groups});
      const TensorView ezv = c.f.has_zero_point() ? ez.view() : TensorView();
      quantize_kv(k_new.view(), c.f, c.tensor_scale, ev.view(), es.view(), ezv);
      const std::string what = std::string(c.name) + " " + kv_layout_name(layout);
      const int page_size = 8;
      int64_t changed = 0;
      const std::vector<double> k_after = q.kq.to_doubles();
      for (size_t i = 0; i < k_after.size(); ++i) changed += k_after[i] != k_before[i];
      EXPECT_LE(changed, 2 * heads * vlast) << what;  // nothing outside the two slots
      for (int t = 0; t < 2; ++t) {
        const int64_t p = t == 0 ? 4 : 19;
        const int64_t entry = q.src.indptr.get(t) + p / page_size;
        const int64_t page = static_cast<int64_t>(q.src.indices.get(entry)), slot = p % page_size;
        for (int h = 0; h < heads; ++h) {
          const int64_t row = layout == KVLayout::NHD ? (page * page_size + slot) * heads + h
                                                      : (page * heads + h) * page_size + slot;
          for (int64_t e = 0; e < vlast; ++e) {
            ASSERT_EQ(q.kq.get(row * vlast + e), ev.get((t * heads + h) * vlast + e)) << what;
          }
          for (int64_t g = 0; g < groups; ++g) {
            ASSERT_EQ(q.ks.get(row * groups + g), es.get((t * heads + h) * groups + g)) << what;
            if (c.f.has_zero_point()) {
              ASSERT_EQ(q.kz.get(row * groups + g), ez.get((t * heads + h) * groups + g)) << what;
            }
          }
        }
      }
    }
  }
}

TEST(KvQuantReference, AppendRefusesNonFiniteRowsAndWritesNothing) {
  const FormatCase& c = kCases[3];  // int4-g64
  test::QuantizedCache q =
      test::make_quantized_cache({8}, 8, 2, 64, KVLayout::NHD, c.f, c.value, c.scale, 1.0f, 2);
  HostTensor k_new(DType::f32, {1, 2, 64}), v_new(DType::f32, {1, 2, 64});
  k_new.fill_random(1);
  v_new.fill_random(2);
  v_new.set(64 + 3, std::numeric_limits<double>::infinity());
  const HostTensor batch = test::make_i32({0}), pos = test::make_i32({7});
  const std::vector<double> before = q.kq.to_doubles(), s_before = q.ks.to_doubles();
  EXPECT_ERROR_HAS(reference::append_paged_kv_cache(k_new.view(), v_new.view(), batch.view(),
                                                    pos.view(), q.cache),
                   "append_value[0, 1, 3] = inf: expected finite values");
  EXPECT_EQ(q.kq.to_doubles(), before);
  EXPECT_EQ(q.ks.to_doubles(), s_before);
  // Stored bytes cannot be copied in: rows must be f16 / bf16 / f32.
  HostTensor raw(DType::u8, {1, 2, 32});
  EXPECT_ERROR_HAS(
      reference::append_paged_kv_cache(raw.view(), raw.view(), batch.view(), pos.view(), q.cache),
      "append_key: expected dtype f16 or bf16 or f32, got u8");
}

// --- checks ------------------------------------------------------------------------------------

struct Bad {
  test::QuantizedCache q;
  HostTensor qd, out;
  Bad(const FormatCase& c)
      : q(test::make_quantized_cache({20, 3}, 16, 2, 64, KVLayout::NHD, c.f, c.value, c.scale,
                                     c.tensor_scale, 5)),
        qd(DType::f16, {2, 4, 64}),
        out(DType::f32, {2, 4, 64}) {
    qd.fill_random(1);
    out.fill(42.0);
  }
  std::string decode_error(const PagedKVCache& kv) {
    const std::string msg =
        error_of([&] { reference::batch_decode(qd.view(), kv, out.view(), {}); });
    EXPECT_EQ(out.to_doubles(), std::vector<double>(out.numel(), 42.0)) << "output written";
    return msg;
  }
};

TEST(KvQuantChecks, BadScaleValuesAreNamedAndOutputsUntouched) {
  Bad b(kCases[3]);  // int4-g64, bf16 scales
  b.q.ks.set(5, -0.5);
  EXPECT_NE(b.decode_error(b.q.cache).find("paged_kv.scale.k_group_scale[0, 2, 1, 0] = -0.5: "
                                           "expected a finite scale >= 0"),
            std::string::npos);
  b.q.ks.set(5, 0.25);
  b.q.vs.set(0, std::numeric_limits<double>::quiet_NaN());
  EXPECT_NE(b.decode_error(b.q.cache).find("paged_kv.scale.v_group_scale[0, 0, 0, 0] = nan"),
            std::string::npos);
  b.q.vs.set(0, 0.25);
  b.q.kz.set(1, std::numeric_limits<double>::infinity());
  EXPECT_NE(b.decode_error(b.q.cache).find("paged_kv.scale.k_zero[0, 0, 1, 0] = inf: expected a "
                                           "finite zero point"),
            std::string::npos);
  b.q.kz.set(1, -1.0);  // negative zero points (offsets) are fine
  EXPECT_NO_THROW(reference::batch_decode(b.qd.view(), b.q.cache, b.out.view(), {}));
}

TEST(KvQuantChecks, WrongShapeDtypeAndMissingPoolsAreNamed) {
  Bad b(kCases[3]);
  PagedKVCache kv = b.q.cache;
  HostTensor wrong(DType::bf16, {b.q.ks.shape()[0], 16, 2, 2});
  kv.scale.k_group_scale = wrong.view();
  EXPECT_NE(b.decode_error(kv).find("paged_kv.scale.k_group_scale: expected shape [" +
                                    std::to_string(b.q.ks.shape()[0]) +
                                    ", 16, 2, 1] (paged_kv.k's NHD shape with head_dim 64 -> 1 "
                                    "groups of 64), got "),
            std::string::npos);
  HostTensor e4(DType::e4m3, b.q.ks.shape());
  kv = b.q.cache;
  kv.scale.k_group_scale = e4.view();
  EXPECT_NE(b.decode_error(kv).find("int4-g64 takes f32, bf16 or f16 scales, got e4m3"),
            std::string::npos);
  HostTensor f32z(DType::f32, b.q.kz.shape());
  kv = b.q.cache;
  kv.scale.k_zero = f32z.view();
  EXPECT_NE(b.decode_error(kv).find("paged_kv.scale.k_zero: expected dtype bf16 (that of the "
                                    "scales), got f32"),
            std::string::npos);
  kv = b.q.cache;
  kv.scale.v_zero = {};
  EXPECT_NE(b.decode_error(kv).find("paged_kv.scale.v_zero: int4-g64 needs this pool"),
            std::string::npos);
  kv = b.q.cache;
  kv.scale.format = {};
  EXPECT_NE(b.decode_error(kv).find("paged_kv.k: a u8 cache holds packed 4-bit values"),
            std::string::npos);
  kv = b.q.cache;
  kv.scale.format = {KVQuant::kInt4, 128};
  EXPECT_NE(b.decode_error(kv).find("int4-g128's group of 128 elements does not divide head_dim "
                                    "64"),
            std::string::npos);
  kv = b.q.cache;
  kv.scale.format = {KVQuant::kNvfp4, 16};
  EXPECT_NE(b.decode_error(kv).find("k_group_scale: nvfp4 takes e4m3 scales, got bf16"),
            std::string::npos);

  Bad f(kCases[0]);  // e4m3-per-token, f32 scales
  kv = f.q.cache;
  HostTensor f16s(DType::f16, f.q.ks.shape());
  kv.scale.k_group_scale = f16s.view();
  EXPECT_NE(f.decode_error(kv).find("e4m3-per-token takes f32 or bf16 scales, got f16"),
            std::string::npos);
  kv = f.q.cache;
  kv.scale.format = {};
  EXPECT_NE(f.decode_error(kv).find("paged_kv.scale.format: group scales"), std::string::npos);
}

TEST(KvQuantChecks, ContiguousOpsRefuseGroupScales) {
  HostTensor q(DType::f16, {4, 64}), k(DType::e4m3, {10, 2, 64}), out(DType::f32, {4, 64});
  AttentionOptions opts;
  opts.kv_scale.format = {KVQuant::kFp8PerTokenHead, 0};
  EXPECT_ERROR_HAS(
      reference::single_decode(q.view(), k.view(), k.view(), out.view(), {}, KVLayout::NHD, opts),
      "opts.kv_scale.format: e4m3-per-token (group scales) is read from a "
      "PagedKVCache only");
}

TEST(KvQuantChecks, GpuPlansRefuseEveryFormatNamingIssue42) {
  const std::vector<int32_t> indptr = {0, 2}, last = {5};
  for (const FormatCase& c : kCases) {
    const std::string fmt = kv_format_name(c.f, c.value);
    bool not_implemented = false;
    std::string msg;
    try {
      check_decode_plan(indptr.data(), last.data(), 1, 32, 8, 128, 16, DType::f16, c.value,
                        DType::f16, PlanTarget::kGpu, {}, c.f);
    } catch (const NotImplementedError& e) {
      not_implemented = true;
      msg = e.what();
    }
    EXPECT_TRUE(not_implemented) << fmt;
    EXPECT_NE(msg.find("kv_format: " + fmt + " has no GPU kernel yet (issue 42)"),
              std::string::npos)
        << msg;
    EXPECT_THROW(
        check_prefill_plan(indptr.data(), indptr.data(), last.data(), 1, 32, 8, 128, 16, true,
                           DType::bf16, c.value, DType::bf16, PlanTarget::kGpu, {}, c.f),
        NotImplementedError);
    // The host path (CPU reference) takes them.
    EXPECT_NO_THROW(check_decode_plan(indptr.data(), last.data(), 1, 32, 8, 128, 16, DType::f16,
                                      c.value, DType::f16, PlanTarget::kHost, {}, c.f));
    EXPECT_NO_THROW(check_prefill_plan(indptr.data(), indptr.data(), last.data(), 1, 32, 8, 128, 16,
                                       true, DType::f32, c.value, DType::f32, PlanTarget::kHost, {},
                                       c.f));
    CascadeBatch cb{.kv_indptr = indptr.data(), .kv_last_page_len = last.data(), .batch_size = 1};
    CascadeShape cs{.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128, .kv_dtype = c.value};
    cs.kv_format = c.f;
    EXPECT_THROW(check_cascade_plan(cb, cs, PlanTarget::kGpu), NotImplementedError) << fmt;
  }
  // A bad format is a ValueError-style Error on either target, not NotImplementedError.
  const std::string msg = error_of([&] {
    check_decode_plan(indptr.data(), last.data(), 1, 32, 8, 64, 16, DType::f16, DType::u8,
                      DType::f16, PlanTarget::kGpu, {}, {KVQuant::kInt4, 128});
  });
  EXPECT_NE(msg.find("int4-g128's group of 128 elements does not divide head_dim 64"),
            std::string::npos)
      << msg;
  EXPECT_ERROR_HAS(
      check_prefill_plan(indptr.data(), indptr.data(), nullptr, 1, 32, 8, 128, 0, false, DType::f16,
                         DType::u8, DType::f16, PlanTarget::kHost, {}, {KVQuant::kNvfp4, 16}),
      "kv_format: nvfp4 is read from a paged cache only");
  // u8 without a format is still the plain dtype error.
  EXPECT_ERROR_HAS(check_decode_plan(indptr.data(), last.data(), 1, 32, 8, 128, 16, DType::f16,
                                     DType::u8, DType::f16, PlanTarget::kHost),
                   "kv_dtype: expected f16 (the q dtype) or an fp8 dtype");
}

TEST(KvQuantChecks, CudaCacheInAFormatIsNotImplementedAtRun) {
  for (const FormatCase& c : kCases) {
    const test::QuantizedCache q =
        test::make_quantized_cache({4}, 16, 2, 128, KVLayout::NHD, c.f, c.value, c.scale, 1.0f, 1);
    PagedKVCache kv = q.cache;
    kv.k = test::as_cuda_view(kv.k);
    kv.v = test::as_cuda_view(kv.v);
    kv.scale.k_group_scale = test::as_cuda_view(kv.scale.k_group_scale);
    kv.scale.v_group_scale = test::as_cuda_view(kv.scale.v_group_scale);
    if (c.f.has_zero_point()) {
      kv.scale.k_zero = test::as_cuda_view(kv.scale.k_zero);
      kv.scale.v_zero = test::as_cuda_view(kv.scale.v_zero);
    }
    EXPECT_THROW(kv.validate_shapes(), NotImplementedError) << c.name;
  }
}

}  // namespace
}  // namespace flashkv
