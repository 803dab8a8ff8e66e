// Quantized KV formats (kv_quant.h): names, the format against a cache, and the group-scale
// pools' checks.
#include "flashkv/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "flashkv/attention.h"
#include "flashkv/error.h"
#include "flashkv/paged_kv.h"

namespace flashkv {

int KVQuantFormat::canonical_group_size() const {
  switch (quant) {
    case KVQuant::kInt4:
      return group_size;
    case KVQuant::kNvfp4:
      return kNvfp4GroupSize;
    default:
      return 0;
  }
}

int KVQuantFormat::effective_group_size(int head_dim) const {
  const int g = canonical_group_size();
  return g > 0 ? g : head_dim;
}

int KVQuantFormat::groups(int head_dim) const {
  const int g = effective_group_size(head_dim);
  return g > 0 ? head_dim / g : 0;
}

std::string kv_format_name(const KVQuantFormat& f, DType value_dtype) {
  switch (f.quant) {
    case KVQuant::kNone:
      return dtype_name(value_dtype);
    case KVQuant::kFp8PerTokenHead:
      return std::string(is_fp8_dtype(value_dtype) ? dtype_name(value_dtype) : "fp8") +
             "-per-token";
    case KVQuant::kInt4:
      return "int4-g" + std::to_string(f.group_size);
    case KVQuant::kNvfp4:
      return "nvfp4";
  }
  return "invalid";
}

KVFormatSpec parse_kv_format(const std::string& name) {
  struct Named {
    const char* name;
    DType dtype;
    KVQuantFormat format;
  };
  static const Named kNamed[] = {
      {"e4m3-per-token", DType::e4m3, {KVQuant::kFp8PerTokenHead, 0}},
      {"e5m2-per-token", DType::e5m2, {KVQuant::kFp8PerTokenHead, 0}},
      {"fp8_e4m3_per_token", DType::e4m3, {KVQuant::kFp8PerTokenHead, 0}},
      {"fp8_e5m2_per_token", DType::e5m2, {KVQuant::kFp8PerTokenHead, 0}},
      {"int4-g32", DType::u8, {KVQuant::kInt4, 32}},
      {"int4-g64", DType::u8, {KVQuant::kInt4, 64}},
      {"int4-g128", DType::u8, {KVQuant::kInt4, 128}},
      {"nvfp4", DType::u8, {KVQuant::kNvfp4, kNvfp4GroupSize}},
  };
  for (const Named& n : kNamed) {
    if (name == n.name) return {n.dtype, n.format};
  }
  check(name != "u8" && name != "uint8", "kv_data_type '", name, "': a u8 cache is a packed ",
        "format; expected int4-g32, int4-g64, int4-g128 or nvfp4");
  try {
    return {parse_dtype(name), {}};
  } catch (const Error&) {
    fail("unknown KV format '", name,
         "': expected a dtype (f16, bf16, f32, e4m3, e5m2, ...) or a quantized format: ",
         "e4m3-per-token, e5m2-per-token, int4-g32, int4-g64, int4-g128, nvfp4");
  }
}

bool kv_format_takes_value_dtype(const KVQuantFormat& f, DType value_dtype) {
  switch (f.quant) {
    case KVQuant::kNone:
      return value_dtype != DType::u8 && value_dtype != DType::i32;
    case KVQuant::kFp8PerTokenHead:
      return is_fp8_dtype(value_dtype);
    case KVQuant::kInt4:
    case KVQuant::kNvfp4:
      return value_dtype == DType::u8;
  }
  return false;
}

bool kv_format_takes_scale_dtype(const KVQuantFormat& f, DType scale_dtype) {
  switch (f.quant) {
    case KVQuant::kFp8PerTokenHead:
      return scale_dtype == DType::f32 || scale_dtype == DType::bf16;
    case KVQuant::kInt4:
      return scale_dtype == DType::f32 || scale_dtype == DType::bf16 || scale_dtype == DType::f16;
    case KVQuant::kNvfp4:
      return scale_dtype == DType::e4m3;
    case KVQuant::kNone:
      return false;
  }
  return false;
}

namespace {

const char* expected_value_dtypes(const KVQuantFormat& f) {
  switch (f.quant) {
    case KVQuant::kFp8PerTokenHead:
      return "e4m3 or e5m2";
    case KVQuant::kInt4:
    case KVQuant::kNvfp4:
      return "u8 (two 4-bit values per byte)";
    default:
      return "f32, f16, bf16, e4m3 or e5m2";
  }
}

const char* expected_scale_dtypes(const KVQuantFormat& f) {
  switch (f.quant) {
    case KVQuant::kFp8PerTokenHead:
      return "f32 or bf16";
    case KVQuant::kInt4:
      return "f32, bf16 or f16";
    case KVQuant::kNvfp4:
      return "e4m3";
    default:
      return "none";
  }
}

}  // namespace

void check_kv_format(const KVQuantFormat& f, DType value_dtype, int head_dim, const char* name) {
  const std::string fmt = kv_format_name(f, value_dtype);
  check(f.quant == KVQuant::kNone || f.quant == KVQuant::kFp8PerTokenHead ||
            f.quant == KVQuant::kInt4 || f.quant == KVQuant::kNvfp4,
        name, ": invalid KVQuant value ", static_cast<int>(f.quant));
  check(kv_format_takes_value_dtype(f, value_dtype), name, ": ", fmt, " stores ",
        expected_value_dtypes(f), " values, got a ", dtype_name(value_dtype), " cache");
  if (f.quant == KVQuant::kInt4) {
    const bool known = std::find(std::begin(kInt4GroupSizes), std::end(kInt4GroupSizes),
                                 f.group_size) != std::end(kInt4GroupSizes);
    check(known, name, ".group_size: expected 32, 64 or 128 for int4, got ", f.group_size);
  } else if (f.quant == KVQuant::kNvfp4) {
    check(f.group_size == 0 || f.group_size == kNvfp4GroupSize, name,
          ".group_size: nvfp4's groups are 16 elements (0 means 16), got ", f.group_size);
  } else {
    check(f.group_size == 0, name, ".group_size: ", fmt, " has one scale per ",
          f.quant == KVQuant::kNone ? "tensor or head" : "(token, head)", ": expected 0, got ",
          f.group_size);
  }
  const int g = f.effective_group_size(head_dim);
  check(head_dim > 0 && head_dim % g == 0, name, ": ", fmt, "'s group of ", g,
        " elements does not divide head_dim ", head_dim);
  check(!f.packed() || head_dim % 2 == 0, name, ": ", fmt,
        " packs two values per byte: ", "head_dim must be even, got ", head_dim);
}

namespace {

// One group-scale or zero-point pool of `kv` (kv_quant.h): present iff the format has it, the
// cache's shape with head_dim -> groups, a dtype the format takes (and `same_dtype_as`'s, when
// given: the other pools match the key scales), on the cache's device.
void check_pool(const PagedKVCache& kv, const TensorView& t, bool wanted, const char* name,
                const char* which, std::optional<DType> same_dtype_as) {
  const KVQuantFormat& f = kv.scale.format;
  const std::string fmt = kv_format_name(f, kv.k.dtype());
  if (!wanted) {
    check(!t.defined(), name, ".", which, ": ", fmt, " has no ", which,
          " pool: expected none, got ", t.str());
    return;
  }
  check(t.defined(), name, ".", which, ": ", fmt, " needs this pool (", kv_layout_name(kv.layout),
        " [num_pages, ", kv.layout == KVLayout::NHD ? "page_size, H_kv" : "H_kv, page_size", ", ",
        f.groups(kv.head_dim()), "]), got none");
  check(kv_format_takes_scale_dtype(f, t.dtype()), name, ".", which, ": ", fmt, " takes ",
        expected_scale_dtypes(f), " scales, got ", dtype_name(t.dtype()));
  check(!same_dtype_as || *same_dtype_as == t.dtype(), name, ".", which, ": expected dtype ",
        dtype_name(same_dtype_as.value_or(t.dtype())), " (that of the scales), got ",
        dtype_name(t.dtype()));
  const int64_t want[4] = {kv.k.size(0), kv.k.size(1), kv.k.size(2), f.groups(kv.head_dim())};
  const bool ok = t.ndim() == 4 && t.size(0) == want[0] && t.size(1) == want[1] &&
                  t.size(2) == want[2] && t.size(3) == want[3];
  if (!ok) {
    fail(name, ".", which, ": expected shape [", want[0], ", ", want[1], ", ", want[2], ", ",
         want[3], "] (paged_kv.k's ", kv_layout_name(kv.layout), " shape with head_dim ",
         kv.head_dim(), " -> ", want[3], " groups of ", f.effective_group_size(kv.head_dim()),
         "), got ", t.shape_str());
  }
  check(t.device() == kv.k.device(), name, ".", which, ": expected a tensor on ",
        kv.k.device().str(), " (the cache's device), got ", t.device().str());
  check(t.data() != nullptr || t.numel() == 0, name, ".", which,
        ": expected data, got a null pointer");
}

// Every entry of a host pool: scales finite and >= 0 (0: an all-zero group), zero points finite.
// Scanned up front so a bad entry is refused before any output is written.
void check_pool_values(const TensorView& t, bool zero_point, const char* name, const char* which) {
  const int64_t n[4] = {t.size(0), t.size(1), t.size(2), t.size(3)};
  const int64_t s[4] = {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
  for (int64_t a = 0; a < n[0]; ++a) {
    for (int64_t b = 0; b < n[1]; ++b) {
      for (int64_t c = 0; c < n[2]; ++c) {
        for (int64_t d = 0; d < n[3]; ++d) {
          const double x =
              load_as_double(t.data(), t.dtype(), a * s[0] + b * s[1] + c * s[2] + d * s[3]);
          const bool ok = zero_point ? std::isfinite(x) : (std::isfinite(x) && x >= 0.0);
          if (!ok) {
            fail(name, ".", which, "[", a, ", ", b, ", ", c, ", ", d, "] = ", x, ": expected ",
                 zero_point ? "a finite zero point" : "a finite scale >= 0");
          }
        }
      }
    }
  }
}

}  // namespace

void check_kv_group_scales(const PagedKVCache& kv, const char* name) {
  const KVScale& s = kv.scale;
  const KVQuantFormat& f = s.format;
  const std::string fmt = kv_format_name(f, kv.k.dtype());
  check(!f.is_none(), name, ".format: group scales (", name, ".k_group_scale ...) need a ",
        "quantized format (e4m3-per-token, int4-g64, nvfp4, ...), got none");
  if (kv.k.device().is_cuda()) {
    fail_not_implemented(name, ".format: ", fmt, " has no GPU kernel yet (issue 42: every GPU ",
                         "op refuses it); the CPU reference reads it");
  }
  check_kv_format(f, kv.k.dtype(), kv.head_dim(), (std::string(name) + ".format").c_str());
  check_pool(kv, s.k_group_scale, true, name, "k_group_scale", std::nullopt);
  check_pool(kv, s.v_group_scale, true, name, "v_group_scale", s.k_group_scale.dtype());
  check_pool(kv, s.k_zero, f.has_zero_point(), name, "k_zero", s.k_group_scale.dtype());
  check_pool(kv, s.v_zero, f.has_zero_point(), name, "v_zero", s.k_group_scale.dtype());
  if (kv.k.device().is_cpu()) {
    check_pool_values(s.k_group_scale, false, name, "k_group_scale");
    check_pool_values(s.v_group_scale, false, name, "v_group_scale");
    if (f.has_zero_point()) {
      check_pool_values(s.k_zero, true, name, "k_zero");
      check_pool_values(s.v_zero, true, name, "v_zero");
    }
  }
}

}  // namespace flashkv
