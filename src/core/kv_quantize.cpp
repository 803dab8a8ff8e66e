// The quantized KV formats' arithmetic (kv_quant_rows.h) and the host quantizers over tensors
// (kv_quantize.h).
#include "flashkv/kv_quantize.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/kv_quant_rows.h"
#include "flashkv/error.h"

namespace flashkv {
namespace detail {
namespace {

float load_f32(const GroupEntries& e, int group) {
  return static_cast<float>(load_as_double(e.data, e.dtype, group * e.stride));
}

// Rounds `x` to `e`'s dtype, stores it as entry `group` and returns the stored value.
float store_entry(const GroupEntries& e, int group, float x) {
  store_from_double(e.data, e.dtype, group * e.stride, x);
  return load_f32(e, group);
}

uint8_t fp8_code(DType t, float x) {
  return t == DType::e4m3 ? float_to_e4m3(x, /*saturate=*/true)
                          : float_to_e5m2(x, /*saturate=*/true);
}

double fp8_value(DType t, uint8_t code) {
  return t == DType::e4m3 ? e4m3_to_float(code) : e5m2_to_float(code);
}

// Sets nibble `d` (even: low, odd: high) of the packed row.
void set_nibble(uint8_t* row, int d, uint8_t code) {
  uint8_t& b = row[d / 2];
  b = (d % 2 == 0) ? static_cast<uint8_t>((b & 0xf0) | code)
                   : static_cast<uint8_t>((b & 0x0f) | (code << 4));
}

uint8_t nibble(const uint8_t* row, int d) {
  return static_cast<uint8_t>((row[d / 2] >> (4 * (d % 2))) & 0xf);
}

}  // namespace

void quantize_row(const KVQuantFormat& f, DType value_dtype, const float* x, int dim, float g,
                  void* values, const GroupEntries& scales, const GroupEntries& zeros) {
  const int gs = f.effective_group_size(dim);
  auto* bytes = static_cast<uint8_t*>(values);
  for (int group = 0; group * gs < dim; ++group) {
    const float* gx = x + group * gs;
    float lo = gx[0], hi = gx[0], amax = 0.0f;
    for (int i = 0; i < gs; ++i) {
      lo = std::min(lo, gx[i]);
      hi = std::max(hi, gx[i]);
      amax = std::max(amax, std::fabs(gx[i]));
    }
    switch (f.quant) {
      case KVQuant::kFp8PerTokenHead: {
        const float qmax = value_dtype == DType::e4m3 ? 448.0f : 57344.0f;
        const float s = store_entry(scales, group, amax / (qmax * g));
        const float eff = g * s;
        for (int i = 0; i < gs; ++i) {
          bytes[group * gs + i] = eff == 0.0f ? 0 : fp8_code(value_dtype, gx[i] / eff);
        }
        break;
      }
      case KVQuant::kInt4: {
        const float s = store_entry(scales, group, (hi - lo) / (15.0f * g));
        const float z = store_entry(zeros, group, lo / g);
        const float eff_s = g * s, eff_z = g * z;
        for (int i = 0; i < gs; ++i) {
          float code = 0.0f;
          if (eff_s != 0.0f) {
            // nearbyint: round to nearest even (the default rounding mode), then clamp: the
            // stored scale and offset are rounded, so a code may fall just outside [0, 15].
            code = std::clamp(std::nearbyint((gx[i] - eff_z) / eff_s), 0.0f, 15.0f);
          }
          set_nibble(bytes, group * gs + i, static_cast<uint8_t>(code));
        }
        break;
      }
      case KVQuant::kNvfp4: {
        const float s = store_entry(scales, group, amax / (6.0f * g));  // e4m3, saturating
        const float eff = g * s;
        for (int i = 0; i < gs; ++i) {
          set_nibble(bytes, group * gs + i, eff == 0.0f ? 0 : float_to_e2m1(gx[i] / eff));
        }
        break;
      }
      case KVQuant::kNone:
        fail("quantize_row: format none has no group scales");
    }
  }
}

void dequantize_row(const KVQuantFormat& f, DType value_dtype, const void* values, int dim, float g,
                    const GroupEntries& scales, const GroupEntries& zeros, double* out) {
  const int gs = f.effective_group_size(dim);
  const auto* bytes = static_cast<const uint8_t*>(values);
  for (int group = 0; group * gs < dim; ++group) {
    // The effective scale is formed in f32 (float * float), as the kernels and quantize_row do;
    // each product below is then exact in double (at most 24 + 4 significant bits).
    const double eff = static_cast<double>(g * load_f32(scales, group));
    double* o = out + group * gs;
    switch (f.quant) {
      case KVQuant::kFp8PerTokenHead:
        for (int i = 0; i < gs; ++i) o[i] = eff * fp8_value(value_dtype, bytes[group * gs + i]);
        break;
      case KVQuant::kInt4: {
        const double eff_z = static_cast<double>(g * load_f32(zeros, group));
        for (int i = 0; i < gs; ++i) o[i] = eff * nibble(bytes, group * gs + i) + eff_z;
        break;
      }
      case KVQuant::kNvfp4:
        for (int i = 0; i < gs; ++i) o[i] = eff * e2m1_to_float(nibble(bytes, group * gs + i));
        break;
      case KVQuant::kNone:
        fail("dequantize_row: format none has no group scales");
    }
  }
}

}  // namespace detail

namespace {

// Element offsets of every row (every index of the leading dims) of `t`, in row-major order.
std::vector<int64_t> row_offsets(const TensorView& t) {
  std::vector<int64_t> offsets{0};
  for (int d = 0; d + 1 < t.ndim(); ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * t.size(d));
    for (int64_t base : offsets) {
      for (int64_t i = 0; i < t.size(d); ++i) next.push_back(base + i * t.stride(d));
    }
    offsets.swap(next);
  }
  return offsets;
}

// `t` has x's leading dims and last dim `last`, on the host, last dim contiguous.
void check_like(const TensorView& t, const TensorView& x, int64_t last, const char* name) {
  check_defined(t, name);
  check_device(t, name, Device::cpu());
  bool ok = t.ndim() == x.ndim() && t.size(-1) == last;
  for (int d = 0; ok && d + 1 < x.ndim(); ++d) ok = t.size(d) == x.size(d);
  if (!ok) {
    std::string want = "[";
    for (int d = 0; d + 1 < x.ndim(); ++d) want += std::to_string(x.size(d)) + ", ";
    fail(name, ": expected shape ", want, last, "] (x's leading dims), got ", t.shape_str());
  }
}

struct Layout {
  int dim = 0, groups = 0;
  int64_t value_last = 0;
};

// The shapes of quantize_kv / dequantize_kv's tensors, checked; `x` is the [..., D] side.
Layout check_tensors(const TensorView& x, const KVQuantFormat& f, float tensor_scale,
                     const TensorView& values, const TensorView& scales, const TensorView& zeros,
                     const char* x_name) {
  check(!f.is_none(), "format: expected a quantized format (e4m3-per-token, int4-g64, nvfp4, ...)",
        ", got none (per-tensor / per-head fp8 needs no group scales)");
  check_defined(x, x_name);
  check(x.ndim() >= 1, x_name, ": expected [..., head_dim], got ", x.shape_str());
  Layout l;
  l.dim = static_cast<int>(x.size(-1));
  check_defined(values, "values");
  check_kv_format(f, values.dtype(), l.dim, "format");
  check(std::isfinite(tensor_scale) && tensor_scale > 0.0f,
        "tensor_scale: expected a finite scale > 0, got ", tensor_scale);
  l.groups = f.groups(l.dim);
  l.value_last = f.packed() ? l.dim / 2 : l.dim;
  check_like(values, x, l.value_last, "values");
  check_last_dim_contiguous(values, "values");
  check_like(scales, x, l.groups, "scales");
  check(kv_format_takes_scale_dtype(f, scales.dtype()),
        "scales: ", kv_format_name(f, values.dtype()), " does not take ",
        dtype_name(scales.dtype()),
        " scales (per-token fp8: f32 / bf16; int4: f32 / bf16 / f16; nvfp4: e4m3)");
  if (f.has_zero_point()) {
    check_like(zeros, x, l.groups, "zeros");
    check(zeros.dtype() == scales.dtype(), "zeros: expected dtype ", dtype_name(scales.dtype()),
          " (that of the scales), got ", dtype_name(zeros.dtype()));
  } else {
    check(!zeros.defined(), "zeros: ", kv_format_name(f, values.dtype()),
          " has no zero points: expected none, got ", zeros.str());
  }
  return l;
}

detail::GroupEntries entries(const TensorView& t, int64_t row_offset) {
  if (!t.defined()) return {};
  auto* p = static_cast<char*>(t.data()) + row_offset * static_cast<int64_t>(dtype_size(t.dtype()));
  return {p, t.dtype(), t.stride(-1)};
}

}  // namespace

void quantize_kv(const TensorView& x, const KVQuantFormat& format, float tensor_scale,
                 const TensorView& values, const TensorView& scales, const TensorView& zeros) {
  const Layout l = check_tensors(x, format, tensor_scale, values, scales, zeros, "x");
  check_device(x, "x", Device::cpu());
  check_dtype_in(x, "x", {DType::f32, DType::f16, DType::bf16});
  const std::vector<int64_t> xr = row_offsets(x), vr = row_offsets(values),
                             sr = row_offsets(scales);
  const std::vector<int64_t> zr = zeros.defined() ? row_offsets(zeros) : std::vector<int64_t>();
  // Every element read (and checked finite) before anything is written.
  std::vector<float> rows(xr.size() * l.dim);
  const int64_t xs = x.stride(-1);
  for (size_t r = 0; r < xr.size(); ++r) {
    for (int d = 0; d < l.dim; ++d) {
      const float v = static_cast<float>(load_as_double(x.data(), x.dtype(), xr[r] + d * xs));
      if (!std::isfinite(v)) {
        fail("x: row ", r, ", element ", d, " is ", v, ": expected finite values (",
             kv_format_name(format, values.dtype()), " has no NaN / inf code)");
      }
      rows[r * l.dim + d] = v;
    }
  }
  for (size_t r = 0; r < xr.size(); ++r) {
    auto* v = static_cast<char*>(values.data()) + vr[r];  // 1-byte elements
    detail::quantize_row(format, values.dtype(), rows.data() + r * l.dim, l.dim, tensor_scale, v,
                         entries(scales, sr[r]),
                         zeros.defined() ? entries(zeros, zr[r]) : detail::GroupEntries{});
  }
}

void dequantize_kv(const TensorView& values, const TensorView& scales, const TensorView& zeros,
                   const KVQuantFormat& format, float tensor_scale, const TensorView& out) {
  const Layout l = check_tensors(out, format, tensor_scale, values, scales, zeros, "out");
  check_device(out, "out", Device::cpu());
  check_device(values, "values", Device::cpu());
  check_dtype_in(out, "out", {DType::f32, DType::f16, DType::bf16});
  const std::vector<int64_t> orow = row_offsets(out), vr = row_offsets(values),
                             sr = row_offsets(scales);
  const std::vector<int64_t> zr = zeros.defined() ? row_offsets(zeros) : std::vector<int64_t>();
  std::vector<double> row(l.dim);
  const int64_t os = out.stride(-1);
  for (size_t r = 0; r < orow.size(); ++r) {
    const auto* v = static_cast<const char*>(values.data()) + vr[r];
    detail::dequantize_row(format, values.dtype(), v, l.dim, tensor_scale, entries(scales, sr[r]),
                           zeros.defined() ? entries(zeros, zr[r]) : detail::GroupEntries{},
                           row.data());
    for (int d = 0; d < l.dim; ++d)
      store_from_double(out.data(), out.dtype(), orow[r] + d * os, row[d]);
  }
}

float nvfp4_tensor_scale(const TensorView& x) {
  check_defined(x, "x");
  check_device(x, "x", Device::cpu());
  check_dtype_in(x, "x", {DType::f32, DType::f16, DType::bf16});
  const std::vector<int64_t> xr = row_offsets(x);
  float amax = 0.0f;
  for (int64_t base : xr) {
    for (int64_t d = 0; d < x.size(-1); ++d) {
      amax = std::max(amax, static_cast<float>(std::fabs(
                                load_as_double(x.data(), x.dtype(), base + d * x.stride(-1)))));
    }
  }
  return amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
}

}  // namespace flashkv
