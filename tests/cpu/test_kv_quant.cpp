// The quantized KV formats (kv_quant.h) and their host quantizers (kv_quantize.h): e2m1's codes
// and ties, names, the format checks, closed-form quantizations (groups whose scales and codes
// are known exactly), round-trip error bounds per format, and the quantizers' refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/kv_quant_util.h"
#include "common/test_util.h"
#include "flashkv/error.h"
#include "flashkv/kv_quant.h"
#include "flashkv/kv_quantize.h"

namespace flashkv {
namespace {

using test::error_of;

constexpr KVQuantFormat kFp8Tok{KVQuant::kFp8PerTokenHead, 0};
constexpr KVQuantFormat kInt4G32{KVQuant::kInt4, 32};
constexpr KVQuantFormat kInt4G64{KVQuant::kInt4, 64};
constexpr KVQuantFormat kInt4G128{KVQuant::kInt4, 128};
constexpr KVQuantFormat kNvfp4{KVQuant::kNvfp4, 16};

TEST(KvQuantE2m1, EveryCodeRoundTrips) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t c = 0; c < 16; ++c) {
    const float x = e2m1_to_float(c);
    EXPECT_EQ(x, (c & 8) ? -mags[c & 7] : mags[c & 7]) << int(c);
    if ((c & 7) != 0) EXPECT_EQ(float_to_e2m1(x), c) << int(c);
  }
}

TEST(KvQuantE2m1, TiesGoToTheEvenCodeAndLargeValuesSaturate) {
  // Midpoints: the neighbour whose mantissa bit is 0 wins.
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(0.25f)), 0.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(0.75f)), 1.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(1.25f)), 1.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(1.75f)), 2.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(2.5f)), 2.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(3.5f)), 4.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(5.0f)), 4.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(-0.75f)), -1.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(5.01f)), 6.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(1e9f)), 6.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(-1e9f)), -6.0f);
}

TEST(KvQuantFormat, NamesRoundTrip) {
  EXPECT_EQ(kv_format_name(kFp8Tok, DType::e4m3), "e4m3-per-token");
  EXPECT_EQ(kv_format_name(kFp8Tok, DType::e5m2), "e5m2-per-token");
  EXPECT_EQ(kv_format_name(kInt4G64, DType::u8), "int4-g64");
  EXPECT_EQ(kv_format_name(kNvfp4, DType::u8), "nvfp4");
  EXPECT_EQ(kv_format_name({}, DType::bf16), "bf16");
  for (const char* n : {"e4m3-per-token", "e5m2-per-token", "int4-g32", "int4-g64", "int4-g128",
                        "nvfp4", "f16", "e4m3"}) {
    const KVFormatSpec s = parse_kv_format(n);
    EXPECT_EQ(kv_format_name(s.format, s.value_dtype), n);
  }
  EXPECT_EQ(parse_kv_format("fp8_e5m2_per_token").format, kFp8Tok);
  EXPECT_EQ(parse_kv_format("nvfp4").format, (KVQuantFormat{KVQuant::kNvfp4, 0}));  // 0 means 16
  EXPECT_ERROR_HAS(parse_kv_format("int4-g48"), "int4-g32, int4-g64, int4-g128, nvfp4");
  EXPECT_ERROR_HAS(parse_kv_format("uint8"), "a u8 cache is a packed format");
}

TEST(KvQuantFormat, GroupsAndChecks) {
  EXPECT_EQ(kInt4G64.groups(128), 2);
  EXPECT_EQ(kInt4G32.groups(128), 4);
  EXPECT_EQ(kNvfp4.groups(128), 8);
  EXPECT_EQ((KVQuantFormat{KVQuant::kNvfp4, 0}).groups(64), 4);
  EXPECT_EQ(kFp8Tok.groups(128), 1);
  EXPECT_NO_THROW(check_kv_format(kInt4G128, DType::u8, 128, "kv_format"));
  EXPECT_ERROR_HAS(check_kv_format(kInt4G128, DType::u8, 64, "kv_format"),
                   "kv_format: int4-g128's group of 128 elements does not divide head_dim 64");
  EXPECT_ERROR_HAS(check_kv_format({KVQuant::kInt4, 48}, DType::u8, 96, "kv_format"),
                   "kv_format.group_size: expected 32, 64 or 128 for int4, got 48");
  EXPECT_ERROR_HAS(check_kv_format({KVQuant::kNvfp4, 32}, DType::u8, 128, "kv_format"),
                   "nvfp4's groups are 16 elements");
  EXPECT_ERROR_HAS(check_kv_format(kNvfp4, DType::u8, 40, "kv_format"), "does not divide");
  EXPECT_ERROR_HAS(check_kv_format(kInt4G64, DType::e4m3, 128, "kv_format"),
                   "int4-g64 stores u8 (two 4-bit values per byte) values, got a e4m3 cache");
  EXPECT_ERROR_HAS(check_kv_format(kFp8Tok, DType::u8, 128, "kv_format"),
                   "stores e4m3 or e5m2 values");
  EXPECT_ERROR_HAS(check_kv_format({KVQuant::kFp8PerTokenHead, 16}, DType::e4m3, 128, "f"),
                   "f.group_size: e4m3-per-token has one scale per (token, head): expected 0");
}

// A [1, D] row through quantize_kv and back; returns the dequantized values.
struct Quantized {
  HostTensor vals, scales, zeros, out;
};

Quantized quantize_row(const std::vector<double>& x, const KVQuantFormat& f, DType value_dtype,
                       DType scale_dtype, float tensor_scale = 1.0f) {
  const int64_t d = static_cast<int64_t>(x.size());
  const HostTensor xt = test::make_tensor(DType::f32, {1, d}, x);
  Quantized q;
  q.vals = HostTensor(value_dtype, {1, f.packed() ? d / 2 : d});
  q.scales = HostTensor(scale_dtype, {1, f.groups(static_cast<int>(d))});
  if (f.has_zero_point()) q.zeros = HostTensor(scale_dtype, {1, f.groups(static_cast<int>(d))});
  q.out = HostTensor(DType::f32, {1, d});
  const TensorView zv = f.has_zero_point() ? q.zeros.view() : TensorView();
  quantize_kv(xt.view(), f, tensor_scale, q.vals.view(), q.scales.view(), zv);
  dequantize_kv(q.vals.view(), q.scales.view(), zv, f, tensor_scale, q.out.view());
  return q;
}

TEST(KvQuantClosedForm, Int4GroupOnAGridIsExact) {
  // x = -3 + 0.5 i, i = 0..15 twice per group of 32: min -3, max 4.5, so s = 7.5 / 15 = 0.5
  // and z = -3 exactly, every code is i, and the dequantized row is x itself.
  for (DType sd : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<double> x(64);
    for (int j = 0; j < 64; ++j) x[j] = -3.0 + 0.5 * (j % 16) + (j >= 32 ? 10.0 : 0.0);
    const Quantized q = quantize_row(x, kInt4G32, DType::u8, sd);
    EXPECT_EQ(q.scales.get(0), 0.5);
    EXPECT_EQ(q.zeros.get(0), -3.0);
    EXPECT_EQ(q.scales.get(1), 0.5);
    EXPECT_EQ(q.zeros.get(1), 7.0);
    // Element 2i in the low nibble of byte i: codes (0, 1) -> 0x10, (2, 3) -> 0x32.
    EXPECT_EQ(q.vals.get(0), 0x10);
    EXPECT_EQ(q.vals.get(1), 0x32);
    EXPECT_EQ(q.out.to_doubles(), x) << dtype_name(sd);
  }
}

TEST(KvQuantClosedForm, Int4ConstantGroupStoresItsOffset) {
  const std::vector<double> x(32, 1.25);
  const Quantized q = quantize_row(x, kInt4G32, DType::u8, DType::f32);
  EXPECT_EQ(q.scales.get(0), 0.0);
  EXPECT_EQ(q.zeros.get(0), 1.25);
  EXPECT_EQ(q.out.to_doubles(), x);
}

TEST(KvQuantClosedForm, Int4RoundsToNearestEvenCode) {
  // min 0, max 15: s = 1, z = 0; 2.5 -> 2 and 3.5 -> 4 (ties to even), 7.25 -> 7.
  std::vector<double> x(32, 0.0);
  x[1] = 15.0;
  x[2] = 2.5;
  x[3] = 3.5;
  x[4] = 7.25;
  const Quantized q = quantize_row(x, kInt4G32, DType::u8, DType::f32);
  EXPECT_EQ(q.out.get(2), 2.0);
  EXPECT_EQ(q.out.get(3), 4.0);
  EXPECT_EQ(q.out.get(4), 7.0);
}

TEST(KvQuantClosedForm, Int4TensorScaleDividesScaleAndOffset) {
  std::vector<double> x(32);
  for (int j = 0; j < 32; ++j) x[j] = -3.0 + 0.5 * (j % 16);
  const Quantized q = quantize_row(x, kInt4G32, DType::u8, DType::f32, 0.25f);
  EXPECT_EQ(q.scales.get(0), 2.0);  // 0.5 / 0.25
  EXPECT_EQ(q.zeros.get(0), -12.0);
  EXPECT_EQ(q.out.to_doubles(), x);
}

TEST(KvQuantClosedForm, Fp8PerTokenScaleIsAbsmaxOverTheLargestCode) {
  // absmax 896 = 2 * 448: s = 2, values 2 * e4m3 codes; e5m2: 57344 * 0.25 -> s = 0.25.
  std::vector<double> x = {896.0, -448.0, 2.0, 0.5, 3.0, -896.0, 0.0, 100.0};
  const Quantized q = quantize_row(x, kFp8Tok, DType::e4m3, DType::f32);
  EXPECT_EQ(q.scales.get(0), 2.0);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(q.out.get(j), 2.0 * e4m3_to_float(float_to_e4m3(static_cast<float>(x[j]) / 2.0f)));
  }
  EXPECT_EQ(q.out.get(0), 896.0);
  EXPECT_EQ(q.out.get(7), 2.0 * 48.0);  // 50: a tie of 48 and 52, to the even 48
  std::vector<double> y = {14336.0, -1.0, 0.25, 7.0};
  const Quantized r = quantize_row(y, kFp8Tok, DType::e5m2, DType::bf16);
  EXPECT_EQ(r.scales.get(0), 0.25);
  EXPECT_EQ(r.out.to_doubles(), y);
}

TEST(KvQuantClosedForm, Fp8PerTokenZeroRowHasScaleZero) {
  const Quantized q = quantize_row(std::vector<double>(8, 0.0), kFp8Tok, DType::e4m3, DType::f32);
  EXPECT_EQ(q.scales.get(0), 0.0);
  EXPECT_EQ(q.out.to_doubles(), std::vector<double>(8, 0.0));
}

TEST(KvQuantClosedForm, Nvfp4BlockOfE2m1ValuesIsExact) {
  // Block 0: amax 6 with g = 1 -> s = e4m3(1) = 1, codes exact. Block 1: the same values times 3
  // -> s = 3. Block 2: times 1/64 under g = 1/64... here g = 1, so s = 1/64 (an e4m3 value).
  const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, 0};
  std::vector<double> x(48);
  for (int j = 0; j < 16; ++j) {
    x[j] = e2m1[j];
    x[16 + j] = 3.0 * e2m1[j];
    x[32 + j] = e2m1[j] / 64.0;
  }
  const Quantized q = quantize_row(x, kNvfp4, DType::u8, DType::e4m3);
  EXPECT_EQ(q.scales.get(0), 1.0);
  EXPECT_EQ(q.scales.get(1), 3.0);
  EXPECT_EQ(q.scales.get(2), 1.0 / 64.0);
  EXPECT_EQ(q.out.to_doubles(), x);
  // With a per-tensor scale: block scales divide by it.
  const Quantized t = quantize_row(x, kNvfp4, DType::u8, DType::e4m3, 0.5f);
  EXPECT_EQ(t.scales.get(1), 6.0);
  EXPECT_EQ(t.out.to_doubles(), x);
}

TEST(KvQuantClosedForm, Nvfp4TensorScaleMapsTheAbsmaxToTheLargestBlockScale) {
  const HostTensor x = test::make_tensor(DType::f32, {2, 16}, std::vector<double>(32, -2688.0));
  EXPECT_EQ(nvfp4_tensor_scale(x.view()), 1.0f);  // 2688 / (6 * 448)
  const HostTensor z = test::make_tensor(DType::f32, {1, 16}, std::vector<double>(16, 0.0));
  EXPECT_EQ(nvfp4_tensor_scale(z.view()), 1.0f);
}

// Random rows: the dequantized error per element is within each format's bound.
TEST(KvQuantRoundTrip, ErrorWithinEachFormatsBound) {
  const int d = 128, rows = 37;
  HostTensor x(DType::f32, {rows, d});
  x.fill_random(11, -3.0, 3.0);
  const std::vector<double> xs = x.to_doubles();
  struct Case {
    KVQuantFormat f;
    DType value, scale;
  };
  for (const Case& c :
       {Case{kFp8Tok, DType::e4m3, DType::f32}, Case{kFp8Tok, DType::e5m2, DType::bf16},
        Case{kInt4G32, DType::u8, DType::f32}, Case{kInt4G64, DType::u8, DType::bf16},
        Case{kInt4G128, DType::u8, DType::f16}, Case{kNvfp4, DType::u8, DType::e4m3}}) {
    const int gs = c.f.effective_group_size(d);
    const float g = c.f.quant == KVQuant::kNvfp4 ? nvfp4_tensor_scale(x.view()) : 1.0f;
    HostTensor vals(c.value, {rows, c.f.packed() ? d / 2 : d});
    HostTensor sc(c.scale, {rows, c.f.groups(d)}), zp(c.scale, {rows, c.f.groups(d)});
    HostTensor out(DType::f32, {rows, d});
    const TensorView zv = c.f.has_zero_point() ? zp.view() : TensorView();
    quantize_kv(x.view(), c.f, g, vals.view(), sc.view(), zv);
    dequantize_kv(vals.view(), sc.view(), zv, c.f, g, out.view());
    const std::vector<double> ys = out.to_doubles();
    for (int r = 0; r < rows; ++r) {
      for (int grp = 0; grp < d / gs; ++grp) {
        double amax = 0, lo = 1e30, hi = -1e30;
        for (int i = 0; i < gs; ++i) {
          const double v = xs[r * d + grp * gs + i];
          amax = std::max(amax, std::fabs(v));
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
        for (int i = 0; i < gs; ++i) {
          const int64_t e = r * d + grp * gs + i;
          const double err = std::fabs(ys[e] - xs[e]);
          double bound = 0;
          switch (c.f.quant) {
            case KVQuant::kFp8PerTokenHead:  // half an ulp of the code, relative (+ subnormals)
              bound =
                  std::fabs(xs[e]) * (c.value == DType::e4m3 ? 0.0625 : 0.125) * 1.02 + amax * 1e-3;
              break;
            case KVQuant::kInt4:  // half a step, plus the rounding of the stored scale / offset
              bound = (hi - lo) / 15.0 * 0.5 + (hi - lo) * (c.scale == DType::f32 ? 1e-6 : 0.02);
              break;
            case KVQuant::kNvfp4:  // half the widest e2m1 step (2 of 6) at the block scale
              bound = amax / 6.0 * 1.07 + 1e-6;
              break;
            default:
              break;
          }
          ASSERT_LE(err, bound) << kv_format_name(c.f, c.value) << " row " << r << " elem "
                                << grp * gs + i;
        }
      }
    }
  }
}

TEST(KvQuantRoundTrip, FourDimensionalPoolQuantizesRowByRow) {
  // A pool [pages, page_size, H, D] quantizes as [pages * page_size * H] rows: the same bytes.
  HostTensor x4(DType::bf16, {3, 4, 2, 64});
  x4.fill_random(5);
  HostTensor x2(DType::bf16, {24, 64});
  for (int64_t i = 0; i < x4.numel(); ++i) x2.set(i, x4.get(i));
  HostTensor v4(DType::u8, {3, 4, 2, 32}), s4(DType::bf16, {3, 4, 2, 1}),
      z4(DType::bf16, {3, 4, 2, 1});
  HostTensor v2(DType::u8, {24, 32}), s2(DType::bf16, {24, 1}), z2(DType::bf16, {24, 1});
  quantize_kv(x4.view(), kInt4G64, 1.0f, v4.view(), s4.view(), z4.view());
  quantize_kv(x2.view(), kInt4G64, 1.0f, v2.view(), s2.view(), z2.view());
  EXPECT_EQ(v4.to_doubles(), v2.to_doubles());
  EXPECT_EQ(s4.to_doubles(), s2.to_doubles());
  EXPECT_EQ(z4.to_doubles(), z2.to_doubles());
}

TEST(KvQuantErrors, QuantizerRefusalsNameTheArgumentAndWriteNothing) {
  HostTensor x(DType::f32, {2, 64});
  x.fill_random(1);
  HostTensor v(DType::u8, {2, 32}), s(DType::f32, {2, 1}), z(DType::f32, {2, 1});
  v.fill(7);
  EXPECT_ERROR_HAS(quantize_kv(x.view(), kInt4G64, 1.0f, v.view(), s.view(), {}),
                   "zeros: expected a tensor, got an undefined (empty) view");
  HostTensor s_bad(DType::f32, {2, 2});
  EXPECT_ERROR_HAS(quantize_kv(x.view(), kInt4G64, 1.0f, v.view(), s_bad.view(), z.view()),
                   "scales: expected shape [2, 1] (x's leading dims), got [2, 2]");
  HostTensor s_e4(DType::e4m3, {2, 1});
  EXPECT_ERROR_HAS(quantize_kv(x.view(), kInt4G64, 1.0f, v.view(), s_e4.view(), z.view()),
                   "scales: int4-g64 does not take e4m3 scales");
  EXPECT_ERROR_HAS(quantize_kv(x.view(), kInt4G64, -1.0f, v.view(), s.view(), z.view()),
                   "tensor_scale: expected a finite scale > 0, got -1");
  EXPECT_ERROR_HAS(quantize_kv(x.view(), kInt4G128, 1.0f, v.view(), s.view(), z.view()),
                   "int4-g128's group of 128 elements does not divide head_dim 64");
  EXPECT_ERROR_HAS(quantize_kv(x.view(), {}, 1.0f, v.view(), s.view(), z.view()),
                   "format: expected a quantized format");
  HostTensor sn(DType::e4m3, {2, 4});
  EXPECT_ERROR_HAS(quantize_kv(x.view(), kNvfp4, 1.0f, v.view(), sn.view(), z.view()),
                   "zeros: nvfp4 has no zero points");
  x.set(70, std::numeric_limits<double>::quiet_NaN());
  EXPECT_ERROR_HAS(quantize_kv(x.view(), kInt4G64, 1.0f, v.view(), s.view(), z.view()),
                   "x: row 1, element 6 is nan: expected finite values");
  EXPECT_EQ(v.to_doubles(), std::vector<double>(64, 7.0));  // untouched
}

}  // namespace
}  // namespace flashkv
