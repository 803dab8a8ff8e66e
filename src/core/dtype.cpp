// Element types and bit-exact host conversions.
//
// All narrowing conversions go through one encoder that works on doubles: a float widens to a
// double exactly, so float inputs are rounded once, and store_from_double() rounds a double
// straight to the target format (double -> float -> f16 would round twice and can differ from a
// single rounding on ties). Special values follow the CUDA headers (cuda_fp16.hpp, cuda_bf16.hpp,
// cuda_fp8.hpp) so the CPU reference stores the bits the GPU stores:
//   NaN  -> the positive canonical NaN of the format (0x7fff for f16/bf16, 0x7f for fp8);
//   fp8 overflow (incl. ±inf) -> ±max finite when saturating (cvt.rn.satfinite), else e4m3 ±NaN
//   (0x7f/0xff) and e5m2 ±inf.
#include "flashkv/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "flashkv/error.h"

namespace flashkv {
namespace {

// A binary floating-point format with `mbits` stored mantissa bits and exponent bias `bias`.
struct Format {
  int mbits;
  int bias;
  uint32_t max_finite;  // magnitude code of the largest finite value
};

constexpr Format kF16{10, 15, 0x7bff};
constexpr Format kBF16{7, 127, 0x7f7f};
constexpr Format kE4M3{3, 7, 0x7e};
constexpr Format kE5M2{2, 15, 0x7b};

// Round-to-nearest-even of a non-negative double below 2^53, independent of the FPU's rounding
// mode (std::nearbyint would depend on it).
double round_half_even(double x) {
  const double lo = std::floor(x);
  const double diff = x - lo;  // exact: x < 2^53
  if (diff > 0.5 || (diff == 0.5 && std::fmod(lo, 2.0) != 0.0)) return lo + 1.0;
  return lo;
}

// Magnitude code (exponent and mantissa fields, no sign) of the finite, non-negative `a` in
// `fmt`, rounded to nearest even. Subnormals fall out of the same formula: below the smallest
// normal the quantum stays 2^(1 - bias - mbits) and the exponent field is 0. A result above
// fmt.max_finite means overflow; the caller decides what that becomes.
uint64_t encode_magnitude(double a, const Format& fmt) {
  if (a == 0.0) return 0;
  const int e = std::ilogb(a);                          // a in [2^e, 2^(e+1))
  const int q = std::max(e, 1 - fmt.bias) - fmt.mbits;  // log2 of the quantum at a
  const double n = round_half_even(std::ldexp(a, -q));  // exact scaling by a power of two
  // In the normal range n is in [2^mbits, 2^(mbits+1)], so adding it to the exponent field minus
  // one supplies the implicit bit; a carry out of the mantissa bumps the exponent, as it should.
  const int64_t exp_field = std::max(e + fmt.bias - 1, 0);
  return (static_cast<uint64_t>(exp_field) << fmt.mbits) + static_cast<uint64_t>(n);
}

// Decodes magnitude code `code` of a format whose all-ones exponent is reserved (f16, bf16, e5m2)
// or not (e4m3) — the caller handles the special codes first.
double decode_magnitude(uint32_t code, const Format& fmt) {
  const uint32_t exp_field = code >> fmt.mbits;
  const uint32_t mant = code & ((1u << fmt.mbits) - 1);
  if (exp_field == 0) return std::ldexp(static_cast<double>(mant), 1 - fmt.bias - fmt.mbits);
  return std::ldexp(static_cast<double>(mant | (1u << fmt.mbits)),
                    static_cast<int>(exp_field) - fmt.bias - fmt.mbits);
}

uint16_t double_to_ieee16(double x, const Format& fmt, uint16_t inf_code) {
  if (std::isnan(x)) return 0x7fff;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isinf(x)) return sign | inf_code;
  const uint64_t code = encode_magnitude(std::fabs(x), fmt);
  // IEEE overflow: everything at or past max + half an ulp rounds to infinity.
  return sign | (code > fmt.max_finite ? inf_code : static_cast<uint16_t>(code));
}

uint8_t double_to_e4m3(double x, bool saturate) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const uint64_t code =
      std::isinf(x) ? kE4M3.max_finite + 1 : encode_magnitude(std::fabs(x), kE4M3);
  if (code > kE4M3.max_finite) return sign | (saturate ? 0x7e : 0x7f);  // no inf in e4m3
  return sign | static_cast<uint8_t>(code);
}

uint8_t double_to_e5m2(double x, bool saturate) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const uint64_t code =
      std::isinf(x) ? kE5M2.max_finite + 1 : encode_magnitude(std::fabs(x), kE5M2);
  if (code > kE5M2.max_finite) return sign | (saturate ? 0x7b : 0x7c);
  return sign | static_cast<uint8_t>(code);
}

float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

template <class T>
T load(const void* data, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(data) + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <class T>
void store(void* data, int64_t i, T v) {
  std::memcpy(static_cast<char*>(data) + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::e4m3:
    case DType::e5m2:
    case DType::u8:
      return 1;
  }
  fail("dtype_size: invalid DType value ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::e4m3:
      return "e4m3";
    case DType::e5m2:
      return "e5m2";
    case DType::i32:
      return "i32";
    case DType::u8:
      return "u8";
  }
  return "invalid";
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  // Short names first, then the spellings of PyTorch / NumPy / FlashInfer users pass around.
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},
      {"f16", DType::f16},
      {"bf16", DType::bf16},
      {"e4m3", DType::e4m3},
      {"e5m2", DType::e5m2},
      {"i32", DType::i32},
      {"u8", DType::u8},
      {"float32", DType::f32},
      {"float", DType::f32},
      {"fp32", DType::f32},
      {"float16", DType::f16},
      {"half", DType::f16},
      {"fp16", DType::f16},
      {"bfloat16", DType::bf16},
      {"int32", DType::i32},
      {"fp8_e4m3", DType::e4m3},
      {"fp8_e5m2", DType::e5m2},
      {"float8_e4m3fn", DType::e4m3},
      {"float8_e5m2", DType::e5m2},
      {"uint8", DType::u8},
  };
  for (const Alias& a : kAliases) {
    if (a.name == name) return a.dtype;
  }
  fail("unknown dtype '", name,
       "': expected one of f32, f16, bf16, e4m3, e5m2, i32, u8 (or float32, float, fp32, float16, "
       "half, fp16, bfloat16, int32, fp8_e4m3, fp8_e5m2, float8_e4m3fn, float8_e5m2, uint8)");
}

bool is_floating(DType t) { return t != DType::i32 && t != DType::u8; }

uint16_t float_to_f16(float x) { return double_to_ieee16(x, kF16, 0x7c00); }

float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t code = bits & 0x7fff;
  if (code >= 0x7c00) {
    // inf / NaN: keep the payload in the top mantissa bits, as cvt.f32.f16 does.
    return bits_to_float(sign | 0x7f800000u | ((code & 0x3ff) << 13));
  }
  const float mag = static_cast<float>(decode_magnitude(code, kF16));  // exact in float
  return sign ? -mag : mag;
}

uint16_t float_to_bf16(float x) { return double_to_ieee16(x, kBF16, 0x7f80); }

float bf16_to_float(uint16_t bits) { return bits_to_float(static_cast<uint32_t>(bits) << 16); }

uint8_t float_to_e4m3(float x, bool saturate) { return double_to_e4m3(x, saturate); }

float e4m3_to_float(uint8_t bits) {
  const uint32_t code = bits & 0x7f;
  if (code == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  const float mag = static_cast<float>(decode_magnitude(code, kE4M3));
  return (bits & 0x80) ? -mag : mag;
}

uint8_t float_to_e5m2(float x, bool saturate) { return double_to_e5m2(x, saturate); }

uint8_t float_to_e2m1(float x) {
  // The 8 magnitudes, and the midpoints between neighbours: a tie goes to the even code (the
  // one whose mantissa bit is 0), as round-to-nearest-even does in every wider format.
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const uint8_t sign = std::signbit(x) ? 0x8 : 0;
  const float a = std::fabs(x);
  uint8_t code = 7;  // saturate: everything past the last midpoint (5) is 6
  for (uint8_t c = 0; c < 7; ++c) {
    const float mid = 0.5f * (kMag[c] + kMag[c + 1]);  // exact in f32
    if (a < mid || (a == mid && (c & 1) == 0)) {
      code = c;
      break;
    }
  }
  return static_cast<uint8_t>(sign | code);
}

float e2m1_to_float(uint8_t nibble) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kMag[nibble & 0x7];
  return (nibble & 0x8) ? -mag : mag;
}

float e5m2_to_float(uint8_t bits) {
  // e5m2 is the top byte of an f16, so the f16 decoder handles inf, NaN and subnormals.
  return f16_to_float(static_cast<uint16_t>(bits) << 8);
}

double load_as_double(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return load<float>(data, i);
    case DType::f16:
      return f16_to_float(load<uint16_t>(data, i));
    case DType::bf16:
      return bf16_to_float(load<uint16_t>(data, i));
    case DType::e4m3:
      return e4m3_to_float(load<uint8_t>(data, i));
    case DType::e5m2:
      return e5m2_to_float(load<uint8_t>(data, i));
    case DType::i32:
      return load<int32_t>(data, i);
    case DType::u8:
      return load<uint8_t>(data, i);
  }
  fail("load_as_double: invalid DType value ", static_cast<int>(t));
}

void store_from_double(void* data, DType t, int64_t i, double x) {
  switch (t) {
    case DType::f32:
      store(data, i, static_cast<float>(x));  // IEEE conversion: round to nearest even
      return;
    case DType::f16:
      store(data, i, double_to_ieee16(x, kF16, 0x7c00));
      return;
    case DType::bf16:
      store(data, i, double_to_ieee16(x, kBF16, 0x7f80));
      return;
    case DType::e4m3:
      store(data, i, double_to_e4m3(x, /*saturate=*/true));
      return;
    case DType::e5m2:
      store(data, i, double_to_e5m2(x, /*saturate=*/true));
      return;
    case DType::i32: {
      check(!std::isnan(x), "store_from_double: cannot store NaN as i32 (element ", i, ")");
      // Saturate like a clamped cast; round ties to even like the float formats.
      const double clamped = std::fmin(std::fmax(x, -2147483648.0), 2147483647.0);
      const double r =
          std::signbit(clamped) ? -round_half_even(-clamped) : round_half_even(clamped);
      store(data, i, static_cast<int32_t>(r));
      return;
    }
    case DType::u8: {
      check(!std::isnan(x), "store_from_double: cannot store NaN as u8 (element ", i, ")");
      const double r = round_half_even(std::fmin(std::fmax(x, 0.0), 255.0));
      store(data, i, static_cast<uint8_t>(r));
      return;
    }
  }
  fail("store_from_double: invalid DType value ", static_cast<int>(t));
}

}  // namespace flashkv
