// Quantized KV cache formats beyond fp8 with per-tensor / per-head scales (issue 42): what a
// cache's bytes mean, where their scales live, and the checks of both.
//
// A format is a descriptor (KVQuantFormat) beside the cache's element dtype. The value pages keep
// the paged cache's shape (paged_kv.h), and the fine-grained scales live in a parallel scale pool
// with the same page ids: the cache's shape with head_dim replaced by the number of groups G,
//   NHD: scale[num_pages][page_size][H_kv][G]    HND: scale[num_pages][H_kv][page_size][G]
// (docs/design.md "Quantized KV formats" says why a parallel pool and not scales inside the page).
// The real value of element d of (token, head) is, with g the per-tensor / per-head factor of
// KVScale (attention.h: the float times its [1] / [H_kv] tensor, in f32) and s, z the group's
// entries of the scale and zero-point pools:
//
//   kFp8PerTokenHead  e4m3 / e5m2 values [.., D]; G = 1, s f32 or bf16 per (token, head):
//                     x = fl32(g * s) * fp8(v)
//   kInt4             u8 [.., D / 2], element 2i in the low nibble of byte i, 2i + 1 in the high
//                     nibble, unsigned codes 0..15; groups of 32 / 64 / 128 along head_dim, s and z
//                     (one dtype: f32, bf16 or f16) per (token, head, group); z is the group's
//                     offset (its minimum), not an integer code:
//                     x = fl32(g * s) * code + fl32(g * z)
//   kNvfp4            u8 [.., D / 2] of e2m1 pairs (the same nibble order); groups of 16, s e4m3;
//                     g is NVFP4's per-tensor f32 scale:
//                     x = fl32(g * s) * e2m1(code)
//
// The reference dequantizes these exactly (in double); the GPU kernels do not read these formats
// yet, and every GPU op refuses them at plan() and run() with NotImplementedError (error.h).
#pragma once

#include <cstdint>
#include <string>

#include "flashkv/dtype.h"
#include "flashkv/tensor.h"

namespace flashkv {

enum class KVQuant : uint8_t {
  kNone,             // the cache dtype's values times KVScale's per-tensor / per-head factor
  kFp8PerTokenHead,  // e4m3 / e5m2, one scale per (token, KV head)
  kInt4,             // asymmetric 4-bit, scale + offset per group along head_dim
  kNvfp4,            // e2m1 pairs, an e4m3 scale per 16 elements, a per-tensor f32 scale
};

// Elements per NVFP4 scale group (the format fixes it).
inline constexpr int kNvfp4GroupSize = 16;
// The INT4 group sizes the format takes.
inline constexpr int kInt4GroupSizes[] = {32, 64, 128};

struct KVQuantFormat {
  KVQuant quant = KVQuant::kNone;
  // Elements along head_dim per scale (and zero point): kInt4 32 / 64 / 128, kNvfp4 16 (0 means
  // 16), kFp8PerTokenHead and kNone 0 (the whole head).
  int group_size = 0;

  bool is_none() const { return quant == KVQuant::kNone; }
  // Two 4-bit values per stored byte (the cache's last dimension is head_dim / 2).
  bool packed() const { return quant == KVQuant::kInt4 || quant == KVQuant::kNvfp4; }
  bool has_zero_point() const { return quant == KVQuant::kInt4; }
  // Scale groups per (token, head) at `head_dim` (1 for per-token-head fp8).
  int groups(int head_dim) const;
  // The group size in force (kNvfp4's 0 -> 16; per-token-head fp8: head_dim).
  int effective_group_size(int head_dim) const;
  // kNvfp4's 0 as 16; the formats without a group size as 0: what operator== compares.
  int canonical_group_size() const;
  bool operator==(const KVQuantFormat& o) const {
    return quant == o.quant && canonical_group_size() == o.canonical_group_size();
  }
};

// The format's name in benchmark rows and in Python's kv_data_type: "e4m3-per-token",
// "e5m2-per-token", "int4-g32", "int4-g64", "int4-g128", "nvfp4"; kNone: the dtype's own name.
// `value_dtype` is the cache's element dtype (e4m3 / e5m2 for the fp8 formats).
std::string kv_format_name(const KVQuantFormat& f, DType value_dtype);

// A parsed kv_data_type: the cache's element dtype and its format.
struct KVFormatSpec {
  DType value_dtype = DType::f16;
  KVQuantFormat format;
};
// Inverse of kv_format_name, also taking every parse_dtype spelling (format kNone) and
// "fp8_e4m3_per_token" / "fp8_e5m2_per_token". Throws naming the accepted names.
KVFormatSpec parse_kv_format(const std::string& name);

// The element dtype a format stores (u8 for the packed ones) and the dtypes its scale pool takes.
bool kv_format_takes_value_dtype(const KVQuantFormat& f, DType value_dtype);
bool kv_format_takes_scale_dtype(const KVQuantFormat& f, DType scale_dtype);

// The format against the cache's element dtype and head_dim (the group divides it, the value
// dtype is the format's, an INT4 group size is one of kInt4GroupSizes): throws naming `name`
// ("kv_format") and what was expected.
void check_kv_format(const KVQuantFormat& f, DType value_dtype, int head_dim, const char* name);

}  // namespace flashkv
