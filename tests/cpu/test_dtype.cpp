// Bit-exact conversions. Besides hand-picked edges, every encoder is checked against a brute-force
// oracle that knows nothing about bit layouts: the nearest representable value, ties to the even
// code, with overflow modelled as one virtual value past the largest finite one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/error.h"

namespace flashkv {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// The non-negative finite values of a format, in code order (which is value order).
struct Table {
  std::vector<uint32_t> codes;
  std::vector<double> values;
};

Table finite_table(uint32_t max_finite, const std::function<double(uint32_t)>& decode) {
  Table t;
  for (uint32_t c = 0; c <= max_finite; ++c) {
    t.codes.push_back(c);
    t.values.push_back(decode(c));
  }
  // One ulp past the largest finite value: rounding to it means "overflow".
  const size_t n = t.values.size();
  t.codes.push_back(max_finite + 1);
  t.values.push_back(2 * t.values[n - 1] - t.values[n - 2]);
  return t;
}

// Nearest value to |x|, ties to the even code; returns a code, max_finite + 1 on overflow.
uint32_t oracle(const Table& t, double x) {
  const double a = std::fabs(x);
  if (a >= t.values.back()) return t.codes.back();
  auto it = std::upper_bound(t.values.begin(), t.values.end(), a);
  const size_t hi = it - t.values.begin();  // values[hi - 1] <= a < values[hi]
  const size_t lo = hi - 1;
  const double dlo = a - t.values[lo], dhi = t.values[hi] - a;
  if (dlo < dhi) return t.codes[lo];
  if (dhi < dlo) return t.codes[hi];
  return (t.codes[lo] % 2 == 0) ? t.codes[lo] : t.codes[hi];
}

// Floats probing every rounding boundary of `t`: each value, each midpoint, and the float
// neighbours of both, plus random floats across the range.
std::vector<float> probes(const Table& t) {
  std::vector<float> out;
  for (size_t i = 0; i + 1 < t.values.size(); ++i) {
    for (double v : {t.values[i], (t.values[i] + t.values[i + 1]) / 2}) {
      const float f = static_cast<float>(v);
      out.push_back(f);
      out.push_back(std::nextafter(f, 0.0f));
      out.push_back(std::nextafter(f, kInf));
    }
  }
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> log_mag(std::log2(t.values[1]) - 4,
                                                 std::log2(t.values.back()) + 2);
  for (int i = 0; i < 20000; ++i) out.push_back(static_cast<float>(std::exp2(log_mag(rng))));
  return out;
}

// --- names ------------------------------------------------------------------------------------

TEST(Dtype, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::e5m2), 1u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::i32}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(is_floating(t), t != DType::i32);
  }
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
}

TEST(Dtype, ParseAliases) {
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("int32"), DType::i32);
  EXPECT_EQ(parse_dtype("fp8_e4m3"), DType::e4m3);
  EXPECT_EQ(parse_dtype("fp8_e5m2"), DType::e5m2);
  try {
    parse_dtype("f64");
    FAIL() << "expected flashkv::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'f64'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
  }
}

// --- f16 --------------------------------------------------------------------------------------

TEST(DtypeF16, Edges) {
  EXPECT_EQ(float_to_f16(0.0f), 0x0000);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);  // max finite
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // max + half ulp ties to the even code: inf
  EXPECT_EQ(float_to_f16(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_f16(kInf), 0x7c00);
  EXPECT_EQ(float_to_f16(-kInf), 0xfc00);
  EXPECT_EQ(float_to_f16(kNaN), 0x7fff);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -14)), 0x0400);         // min normal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);         // min subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1023.0f, -24)), 0x03ff);      // max subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);         // tie -> even (0)
  EXPECT_EQ(float_to_f16(std::ldexp(1.0001f, -25)), 0x0001);      // just above the tie
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);         // tie 1|2 -> 2
  EXPECT_EQ(float_to_f16(-std::ldexp(1.0f, -26)), 0x8000);        // underflow keeps the sign
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(f16_to_float(0x8000)));
  EXPECT_EQ(f16_to_float(0x7c00), kInf);
  EXPECT_EQ(f16_to_float(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0xfc01)));
}

TEST(DtypeF16, AllBitPatternsRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = f16_to_float(static_cast<uint16_t>(b));
    if ((b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_EQ(float_to_f16(f), 0x7fff) << std::hex << b;
    } else {
      ASSERT_EQ(float_to_f16(f), b) << std::hex << b;
    }
  }
}

TEST(DtypeF16, MatchesOracle) {
  const Table t = finite_table(0x7bff, [](uint32_t c) { return f16_to_float(c); });
  for (float x : probes(t)) {
    for (float s : {x, -x}) {
      uint32_t want = oracle(t, s);
      if (want > 0x7bff) want = 0x7c00;
      ASSERT_EQ(float_to_f16(s), want | (std::signbit(s) ? 0x8000 : 0)) << s;
    }
  }
}

#ifdef __FLT16_MAX__
// The compiler's own _Float16 conversion is an independent IEEE implementation.
TEST(DtypeF16, MatchesCompilerFloat16) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float f = from_bits(rng());
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, sizeof(bits));
    ASSERT_EQ(float_to_f16(f), bits) << f;
  }
}
#endif

// --- bf16 -------------------------------------------------------------------------------------

TEST(DtypeBF16, KnownValues) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(3.14159265f), 0x4049);
  EXPECT_EQ(float_to_bf16(1.0f / 3.0f), 0x3eab);            // 0x3eaaaaab rounds up
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7f7fff)), 0x7f7f);  // max finite bf16
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7fffff)), 0x7f80);  // FLT_MAX overflows to inf
  EXPECT_EQ(float_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(float_to_bf16(-kInf), 0xff80);
  EXPECT_EQ(float_to_bf16(kNaN), 0x7fff);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(from_bits(0x00010000)), 0x0001);  // min subnormal
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000)), 0x0002);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(from_bits(0x007fffff)), 0x0080);  // max float subnormal -> min normal
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_float(0xff80), -kInf);
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
}

TEST(DtypeBF16, AllBitPatternsRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_float(static_cast<uint16_t>(b));
    ASSERT_EQ(to_bits(f), b << 16);
    if (std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), 0x7fff);
    } else {
      ASSERT_EQ(float_to_bf16(f), b) << std::hex << b;
    }
  }
}

TEST(DtypeBF16, MatchesOracle) {
  const Table t = finite_table(0x7f7f, [](uint32_t c) { return bf16_to_float(c); });
  for (float x : probes(t)) {
    if (std::isinf(x)) continue;
    for (float s : {x, -x}) {
      uint32_t want = oracle(t, s);
      if (want > 0x7f7f) want = 0x7f80;
      ASSERT_EQ(float_to_bf16(s), want | (std::signbit(s) ? 0x8000 : 0)) << s;
    }
  }
}

// --- fp8 e4m3 ---------------------------------------------------------------------------------

TEST(DtypeE4M3, Edges) {
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);  // max + half ulp ties to the even code: 448
  EXPECT_EQ(float_to_e4m3(464.0f, false), 0x7e);
  EXPECT_EQ(float_to_e4m3(465.0f), 0x7e);         // saturates
  EXPECT_EQ(float_to_e4m3(465.0f, false), 0x7f);  // overflow -> NaN
  EXPECT_EQ(float_to_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(float_to_e4m3(-1000.0f, false), 0xff);
  EXPECT_EQ(float_to_e4m3(kInf), 0x7e);
  EXPECT_EQ(float_to_e4m3(-kInf), 0xfe);
  EXPECT_EQ(float_to_e4m3(kInf, false), 0x7f);
  EXPECT_EQ(float_to_e4m3(kNaN), 0x7f);
  EXPECT_EQ(float_to_e4m3(kNaN, false), 0x7f);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -6)), 0x08);    // min normal
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);    // min subnormal
  EXPECT_EQ(float_to_e4m3(std::ldexp(7.0f, -9)), 0x07);    // max subnormal
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);   // tie -> even (0)
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);   // tie 1|2 -> 2
  EXPECT_EQ(float_to_e4m3(std::ldexp(15.0f, -10)), 0x08);  // tie 7|8 -> 8 (rounds into normal)
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);                 // tie 1|1.125 -> even
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);                 // tie 1.125|1.25 -> even
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // exponent field 15 is finite in e4m3
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
}

TEST(DtypeE4M3, AllBitPatternsRoundTrip) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float f = e4m3_to_float(static_cast<uint8_t>(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << b;
      continue;
    }
    EXPECT_EQ(float_to_e4m3(f, true), b) << b;
    EXPECT_EQ(float_to_e4m3(f, false), b) << b;
  }
}

TEST(DtypeE4M3, MatchesOracle) {
  const Table t = finite_table(0x7e, [](uint32_t c) { return e4m3_to_float(c); });
  for (float x : probes(t)) {
    for (float s : {x, -x}) {
      const uint32_t sign = std::signbit(s) ? 0x80 : 0;
      const uint32_t want = oracle(t, s);
      ASSERT_EQ(float_to_e4m3(s, true), (want > 0x7e ? 0x7e : want) | sign) << s;
      ASSERT_EQ(float_to_e4m3(s, false), (want > 0x7e ? 0x7f : want) | sign) << s;
    }
  }
}

// --- fp8 e5m2 ---------------------------------------------------------------------------------

TEST(DtypeE5M2, Edges) {
  EXPECT_EQ(float_to_e5m2(0.0f), 0x00);
  EXPECT_EQ(float_to_e5m2(-0.0f), 0x80);
  EXPECT_EQ(float_to_e5m2(1.0f), 0x3c);
  EXPECT_EQ(float_to_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(float_to_e5m2(61439.0f), 0x7b);
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7b);         // tie rounds to inf, then saturates
  EXPECT_EQ(float_to_e5m2(61440.0f, false), 0x7c);  // ... or stays inf
  EXPECT_EQ(float_to_e5m2(-1e9f), 0xfb);
  EXPECT_EQ(float_to_e5m2(-1e9f, false), 0xfc);
  // Saturation follows CUDA's __NV_SATFINITE / cvt.rn.satfinite: infinities clamp too.
  EXPECT_EQ(float_to_e5m2(kInf), 0x7b);
  EXPECT_EQ(float_to_e5m2(-kInf), 0xfb);
  EXPECT_EQ(float_to_e5m2(kInf, false), 0x7c);
  EXPECT_EQ(float_to_e5m2(-kInf, false), 0xfc);
  EXPECT_EQ(float_to_e5m2(kNaN), 0x7f);
  EXPECT_EQ(float_to_e5m2(kNaN, false), 0x7f);
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -14)), 0x04);  // min normal
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -16)), 0x01);  // min subnormal
  EXPECT_EQ(float_to_e5m2(std::ldexp(3.0f, -16)), 0x03);  // max subnormal
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -17)), 0x00);  // tie -> even (0)
  EXPECT_EQ(float_to_e5m2(std::ldexp(3.0f, -17)), 0x02);  // tie 1|2 -> 2
  EXPECT_EQ(float_to_e5m2(1.125f), 0x3c);                 // tie 1|1.25 -> even
  EXPECT_EQ(float_to_e5m2(1.375f), 0x3e);                 // tie 1.25|1.5 -> even
  EXPECT_EQ(e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x7c), kInf);
  EXPECT_EQ(e5m2_to_float(0xfc), -kInf);
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  for (uint8_t nan : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) {
    EXPECT_TRUE(std::isnan(e5m2_to_float(nan))) << int(nan);
  }
}

TEST(DtypeE5M2, AllBitPatternsRoundTrip) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float f = e5m2_to_float(static_cast<uint8_t>(b));
    if ((b & 0x7c) == 0x7c && (b & 0x03) != 0) {
      EXPECT_TRUE(std::isnan(f)) << b;
      EXPECT_EQ(float_to_e5m2(f), 0x7f) << b;
      continue;
    }
    EXPECT_EQ(float_to_e5m2(f, false), b) << b;
    // Saturation maps the infinities to ±max; every finite code round-trips.
    const uint32_t sat = (b & 0x7f) == 0x7c ? (b & 0x80) | 0x7b : b;
    EXPECT_EQ(float_to_e5m2(f, true), sat) << b;
  }
}

TEST(DtypeE5M2, MatchesOracle) {
  const Table t = finite_table(0x7b, [](uint32_t c) { return e5m2_to_float(c); });
  for (float x : probes(t)) {
    for (float s : {x, -x}) {
      const uint32_t sign = std::signbit(s) ? 0x80 : 0;
      const uint32_t want = oracle(t, s);
      ASSERT_EQ(float_to_e5m2(s, true), (want > 0x7b ? 0x7b : want) | sign) << s;
      ASSERT_EQ(float_to_e5m2(s, false), (want > 0x7b ? 0x7c : want) | sign) << s;
    }
  }
}

// --- load / store -----------------------------------------------------------------------------

TEST(DtypeLoadStore, EveryDtype) {
  alignas(8) uint8_t buf[64] = {};
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::i32}) {
    for (double x : {0.0, 1.0, -2.0, 3.5, 0.25, -96.0, 448.0}) {
      if (!is_floating(t) && x != std::floor(x)) continue;
      store_from_double(buf, t, 3, x);
      EXPECT_EQ(load_as_double(buf, t, 3), x) << dtype_name(t) << " " << x;
    }
  }
  // Elements are addressed by index, not byte offset.
  store_from_double(buf, DType::f16, 5, 1.0);
  uint16_t h;
  std::memcpy(&h, buf + 10, 2);
  EXPECT_EQ(h, 0x3c00);
}

TEST(DtypeLoadStore, RoundsOnceFromDouble) {
  // 1 + 2^-11 + 2^-40 is above the f16 midpoint 1 + 2^-11, so it rounds up to 1 + 2^-10.
  // Rounding through float first would land exactly on the midpoint and tie down to 1.
  alignas(8) uint8_t buf[8] = {};
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  store_from_double(buf, DType::f16, 0, x);
  EXPECT_EQ(load_as_double(buf, DType::f16, 0), 1.0 + std::ldexp(1.0, -10));
  store_from_double(buf, DType::bf16, 0, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40));
  EXPECT_EQ(load_as_double(buf, DType::bf16, 0), 1.0 + std::ldexp(1.0, -7));
  store_from_double(buf, DType::e4m3, 0, 1.0 + std::ldexp(1.0, -4) + std::ldexp(1.0, -40));
  EXPECT_EQ(load_as_double(buf, DType::e4m3, 0), 1.125);
  store_from_double(buf, DType::e4m3, 0, 1e6);  // the store path saturates
  EXPECT_EQ(load_as_double(buf, DType::e4m3, 0), 448.0);
  store_from_double(buf, DType::e5m2, 0, -1e6);
  EXPECT_EQ(load_as_double(buf, DType::e5m2, 0), -57344.0);
#ifdef __FLT16_MAX__
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-70000.0, 70000.0);
  for (int i = 0; i < 100000; ++i) {
    const double d = u(rng) * std::exp2(-static_cast<int>(rng() % 40));
    store_from_double(buf, DType::f16, 0, d);
    const _Float16 want = static_cast<_Float16>(d);
    ASSERT_EQ(load_as_double(buf, DType::f16, 0), static_cast<double>(want)) << d;
  }
#endif
}

TEST(DtypeLoadStore, Int32) {
  alignas(8) uint8_t buf[8] = {};
  const std::pair<double, int32_t> cases[] = {
      {2.5, 2}, {3.5, 4},   {-2.5, -2},         {-3.5, -4},
      {2.4, 2}, {-7.6, -8}, {1e12, 2147483647}, {-1e12, -2147483647 - 1}};
  for (auto [x, want] : cases) {
    store_from_double(buf, DType::i32, 1, x);
    int32_t got;
    std::memcpy(&got, buf + 4, 4);
    EXPECT_EQ(got, want) << x;
    EXPECT_EQ(load_as_double(buf, DType::i32, 1), want);
  }
  EXPECT_THROW(store_from_double(buf, DType::i32, 0, std::nan("")), Error);
}

TEST(DtypeLoadStore, SpecialValues) {
  alignas(8) uint8_t buf[8] = {};
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2}) {
    store_from_double(buf, t, 0, std::nan(""));
    EXPECT_TRUE(std::isnan(load_as_double(buf, t, 0))) << dtype_name(t);
    store_from_double(buf, t, 0, -0.0);
    EXPECT_TRUE(std::signbit(load_as_double(buf, t, 0))) << dtype_name(t);
  }
  store_from_double(buf, DType::f16, 0, 1e300);
  EXPECT_EQ(load_as_double(buf, DType::f16, 0), std::numeric_limits<double>::infinity());
  store_from_double(buf, DType::f16, 0, 1e-300);
  EXPECT_EQ(load_as_double(buf, DType::f16, 0), 0.0);
}

TEST(DtypeU8, RawBytesOfPackedFormats) {
  // u8: the packed 4-bit pairs of INT4 / NVFP4 caches (kv_quant.h), not a floating dtype.
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_STREQ(dtype_name(DType::u8), "u8");
  EXPECT_EQ(parse_dtype("uint8"), DType::u8);
  EXPECT_EQ(parse_dtype("u8"), DType::u8);
  EXPECT_FALSE(is_floating(DType::u8));
  EXPECT_FALSE(is_fp8_dtype(DType::u8));
  alignas(8) uint8_t buf[2] = {};
  store_from_double(buf, DType::u8, 1, 171.5);  // rounds to even, 172
  EXPECT_EQ(buf[1], 172);
  EXPECT_EQ(load_as_double(buf, DType::u8, 1), 172.0);
  store_from_double(buf, DType::u8, 0, -3.0);  // saturates
  EXPECT_EQ(buf[0], 0);
  store_from_double(buf, DType::u8, 0, 1e9);
  EXPECT_EQ(buf[0], 255);
  EXPECT_THROW(store_from_double(buf, DType::u8, 0, std::nan("")), Error);
}

}  // namespace
}  // namespace flashkv
