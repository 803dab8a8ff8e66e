// Helpers of the fp8 KV-cache tests (tests/cpu/test_kv_fp8.cpp, tests/gpu/test_kv_fp8_gpu.cpp):
// rows whose values exercise the quantizing append (every magnitude of the format, exact ties,
// values that saturate, infinities, zeros of both signs and, on request, NaN of both signs), a
// byte pattern for cache storage that an append must leave alone, and the element addresses of a
// paged cache.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "flashkv/attention.h"
#include "flashkv/dtype.h"
#include "flashkv/host_tensor.h"
#include "flashkv/paged_kv.h"

namespace flashkv::test {

// The f32 scale of KV head `h` as the kernels and the reference form it: the float times the
// tensor's entry (f32 * f32), written out here rather than taken from the library.
inline float fp8_head_scale(float factor, const TensorView& t, int64_t h) {
  if (!t.defined()) return factor;
  const float entry = t.data_as<const float>()[t.size(0) == 1 ? 0 : h];
  return factor * entry;
}

// What the quantizing append stores for a row element `x` (read from the row's dtype as a float)
// under scale `scale`: float(x) / scale in f32, then float_to_e4m3 / float_to_e5m2, saturating.
inline uint8_t fp8_quantized(float x, float scale, DType fp8) {
  const float q = x / scale;
  return fp8 == DType::e4m3 ? float_to_e4m3(q, /*saturate=*/true)
                            : float_to_e5m2(q, /*saturate=*/true);
}

// Element i of a f16 / bf16 / f32 host tensor as the float a kernel reads (exact).
inline float element_as_float(const HostTensor& t, int64_t i) {
  return static_cast<float>(t.get(i));
}

// Every byte of `t` from a seeded pattern (all 256 values occur, fp8 NaN codes included): a slot
// an append must not write keeps its byte, whatever the dtype.
inline void fill_bytes(HostTensor& t, uint64_t seed) {
  SplitMix64 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data());
  uint64_t word = 0;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    if (i % 8 == 0) word = rng.next();
    p[i] = static_cast<uint8_t>(word >> (8 * (i % 8)));
  }
}

// A NaN of the given sign stored in element i of a f16 / bf16 / f32 tensor, bit for bit (a quiet
// NaN with a payload bit below the quiet bit, so a conversion that keeps payload bits shows it).
inline void set_nan(HostTensor& t, int64_t i, bool negative) {
  switch (t.dtype()) {
    case DType::f32: {
      const uint32_t bits = (negative ? 0xffc00001u : 0x7fc00001u);
      std::memcpy(static_cast<uint8_t*>(t.data()) + 4 * i, &bits, 4);
      return;
    }
    case DType::f16: {
      const uint16_t bits = negative ? 0xfe01 : 0x7e01;
      std::memcpy(static_cast<uint8_t*>(t.data()) + 2 * i, &bits, 2);
      return;
    }
    case DType::bf16: {
      const uint16_t bits = negative ? 0xffc1 : 0x7fc1;
      std::memcpy(static_cast<uint8_t*>(t.data()) + 2 * i, &bits, 2);
      return;
    }
    default:
      t.set(i, std::nan(""));
  }
}

// Values in units of the fp8 format (multiplied by the head's scale before they are stored) that
// sit exactly half-way between two neighbours: round-to-nearest-even decides them. With a
// power-of-two scale they stay exact ties after the division.
inline const std::vector<double>& fp8_ties(DType fp8) {
  static const std::vector<double> e4m3 = {
      1.0625,   // 1 | 1.125 -> 1
      1.1875,   // 1.125 | 1.25 -> 1.25
      248.0,    // 240 | 256 -> 256
      0x1p-10,  // 0 | 2^-9 (smallest subnormal) -> 0
      0x3p-10,  // 2^-9 | 2^-8 -> 2^-8
      0x5p-10,  // 2^-8 | 3 * 2^-9 -> 2^-8
      464.0,    // 448 (max) | past it -> 448
  };
  static const std::vector<double> e5m2 = {
      1.125,     // 1 | 1.25 -> 1
      1.375,     // 1.25 | 1.5 -> 1.5
      0x1p-17,   // 0 | 2^-16 -> 0
      0x3p-17,   // 2^-16 | 2^-15 -> 2^-15
      61440.0,   // 57344 (max) | past it -> 57344
      0.171875,  // 0.15625 | 0.1875 -> 0.1875
  };
  return fp8 == DType::e4m3 ? e4m3 : e5m2;
}

inline double fp8_max(DType fp8) { return fp8 == DType::e4m3 ? 448.0 : 57344.0; }

// Fills rows [nnz, H, D + pad] (f16 / bf16 / f32; the last `pad` elements of each head row are
// padding the op must not read: they hold NaN) with values for a cache of `fp8` whose head h has
// scale scale_of(h): every magnitude from far below the smallest subnormal to far past the
// largest finite value (in units of the scale), exact ties, the largest finite value itself,
// zeros and infinities of both signs, and with `with_nan` NaN of both signs.
template <class ScaleOf>
void fill_quantize_rows(HostTensor& rows, int64_t pad, DType fp8, ScaleOf scale_of, bool with_nan,
                        uint64_t seed) {
  SplitMix64 rng(seed);
  const int64_t heads = rows.shape()[1], row = rows.shape()[2], dim = row - pad;
  const std::vector<double>& ties = fp8_ties(fp8);
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const int64_t d = i % row, h = (i / row) % heads;
    if (d >= dim) {
      set_nan(rows, i, false);
      continue;
    }
    const double s = scale_of(h);
    const uint64_t r = rng.next();
    const double sign = (r >> 63) ? -1.0 : 1.0;
    const double u = static_cast<double>((r >> 8) & 0xffffff) / 0x1p24;  // [0, 1)
    double x = 0;
    switch (r % 16) {
      case 0:
        x = sign * 0.0;
        break;
      case 1:
        x = sign * inf;
        break;
      case 2:
        if (with_nan) {
          set_nan(rows, i, sign < 0);
          continue;
        }
        x = sign * u * s;
        break;
      case 3:
      case 4:
        x = sign * ties[(r >> 40) % ties.size()] * s;
        break;
      case 5:
        x = sign * fp8_max(fp8) * s;
        break;
      case 6:  // past the largest finite value: saturates
        x = sign * fp8_max(fp8) * (1.0 + 4.0 * u) * s;
        break;
      default:  // 2^-20 .. 2^18 times the scale: subnormals, normals, saturation
        x = sign * std::exp2(-20.0 + 38.0 * u) * s;
    }
    rows.set(i, x);
  }
}

// Element addresses of a paged cache's storage: (page, k or v, slot, head, d) -> flat index in
// its tensor (k / v, or kv when interleaved).
struct CacheGeometry {
  KVLayout layout = KVLayout::NHD;
  bool interleaved = false;
  int64_t page_size = 1, heads = 1, dim = 1;
  int64_t index(int64_t page, bool is_v, int64_t slot, int64_t h, int64_t d) const {
    const int64_t inner =
        layout == KVLayout::NHD ? (slot * heads + h) * dim + d : (h * page_size + slot) * dim + d;
    const int64_t page_elems = page_size * heads * dim;
    return interleaved ? (page * 2 + (is_v ? 1 : 0)) * page_elems + inner
                       : page * page_elems + inner;
  }
};

// The slot each new token t goes to (kv_ops.h): page indices[indptr[b] + p / page_size], slot
// p % page_size, for b = batch_indices[t], p = positions[t] (host i32 tensors).
struct AppendSlot {
  int64_t page, slot;
};
inline std::vector<AppendSlot> append_slots(const HostTensor& indptr, const HostTensor& indices,
                                            const HostTensor& batch_indices,
                                            const HostTensor& positions, int64_t page_size) {
  std::vector<AppendSlot> out;
  for (int64_t t = 0; t < batch_indices.numel(); ++t) {
    const auto b = static_cast<int64_t>(batch_indices.get(t));
    const auto p = static_cast<int64_t>(positions.get(t));
    const auto entry = static_cast<int64_t>(indptr.get(b)) + p / page_size;
    out.push_back({static_cast<int64_t>(indices.get(entry)), p % page_size});
  }
  return out;
}

}  // namespace flashkv::test
