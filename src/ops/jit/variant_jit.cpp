// Variant -> kernel: the built-ins' flags and parameter block (kernels/variants/builtin.cuh), and a
// user spec's generated `struct Params`, its source behind a #line directive (so NVRTC's errors
// carry the user's line numbers) and its packed arguments.
#include "ops/jit/variant_jit.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "flashkv/error.h"
#include "runtime/hash64.h"
#include "variants/builtin.cuh"

namespace flashkv::ops {
namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

const char* param_c_type(const VariantParam& p) {
  switch (p.kind) {
    case VariantParam::Kind::kF32:
      return "float";
    case VariantParam::Kind::kI32:
      return "int";
    case VariantParam::Kind::kTensor:
      switch (p.dtype) {
        case DType::f32:
          return "const float*";
        case DType::f16:
          return "const flashkv::half_t*";
        case DType::bf16:
          return "const flashkv::bf16_t*";
        case DType::i32:
          return "const int*";
        default:
          fail("VariantSpec.params['", p.name, "']: tensor dtype ", dtype_name(p.dtype),
               " is not supported (expected f32, f16, bf16 or i32)");
      }
  }
  return "";
}

// Byte offset of each param in the generated struct (natural alignment, declaration order).
std::vector<size_t> param_offsets(const std::vector<VariantParam>& params, size_t* total) {
  std::vector<size_t> off;
  size_t at = 0, align = 1;
  for (const auto& p : params) {
    const size_t a = p.kind == VariantParam::Kind::kTensor ? 8 : 4;
    at = (at + a - 1) / a * a;
    off.push_back(at);
    at += a;
    align = std::max(align, a);
  }
  *total = std::max<size_t>(1, (at + align - 1) / align * align);  // an empty struct has size 1
  return off;
}

int builtin_flags(const AttentionVariant& v) {
  int f = 0;
  if (v.window_left >= 0 || v.window_right >= 0) f |= kVariantWindow;
  if (v.logits_soft_cap > 0.f) f |= kVariantSoftCap;
  if (v.alibi_slopes.defined()) f |= kVariantAlibi;
  if (v.sinks.defined()) f |= kVariantSinks;
  if (v.sigmoid) f |= kVariantSigmoid;
  if (v.custom_mask.defined()) f |= kVariantCustomMask;
  if (v.rope.mode != RopeMode::none) f |= kVariantRope;
  return f;
}

VariantJit user_jit(const VariantSpec& s) {
  check(is_identifier(s.name), "VariantSpec.name: expected a C++ identifier, got '", s.name, "'");
  check(!s.source.empty(), "VariantSpec.source: empty (expected the definition of struct ", s.name,
        ")");
  std::set<std::string> seen;
  std::string params = "struct Params {\n";
  for (const auto& p : s.params) {
    check(is_identifier(p.name), "VariantSpec.params: '", p.name, "' is not a C++ identifier");
    check(seen.insert(p.name).second, "VariantSpec.params: '", p.name, "' is declared twice");
    params += std::string("  ") + param_c_type(p) + " " + p.name + ";\n";
  }
  params += "};\n";
  size_t total = 0;
  param_offsets(s.params, &total);
  // The host packs by natural alignment in declaration order, the layout both the host ABI and
  // NVPTX give this struct; the size check catches a disagreement (NVRTC has no offsetof builtin).
  params += "static_assert(sizeof(Params) == " + std::to_string(total) + ", \"Params layout\");\n";
  VariantJit j;
  j.type = "::" + s.name;
  j.use_softmax = s.use_softmax;
  // The hooks that rewrite staged keys or values are found by name: the host never compiles the
  // source, and a false positive only stages an fp8 cache widened (kv/kv_chunk_copy.cuh). A hook
  // hidden from this (a macro) hits the kernels' static_assert over an fp8 cache instead.
  for (const char* hook : {"key_transform", "value_transform", "key_rope_pos"})
    j.transforms_kv = j.transforms_kv || s.source.find(hook) != std::string::npos;
  j.source = "\n" + params + "#line 1 \"" + s.name + ".variant\"\n" + s.source +
             "\n#line 1 \"flashkv-variant-checks\"\n"
             "static_assert(flashkv::VariantTraits<::" +
             s.name + ">::kUseSoftmax == " + (s.use_softmax ? "true" : "false") +
             ", \"VariantSpec.use_softmax differs from the struct's kUseSoftmax\");\n";
  const uint64_t h = runtime::Hash64::of(j.source.data(), j.source.size());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  j.id = std::string("u") + s.name + "." + hex;
  return j;
}

void check_vector(const TensorView& t, const char* name, DType dtype, int64_t n,
                  const VariantCallShape& c) {
  check_dtype(t, name, dtype);
  check_shape(t, name, {n});
  check_device(t, name, c.device);
  check(t.stride(0) == 1, name, ": expected a contiguous vector, got stride ", t.stride(0));
}

void pack_builtin(const AttentionVariant& v, const VariantCallShape& c, BuiltinVariantArgs& a) {
  std::memset(&a, 0, sizeof(a));
  check(v.window_left >= -1, "variant.window_left must be >= -1 (-1: no window), got ",
        v.window_left);
  check(v.window_right >= -1, "variant.window_right must be >= -1 (-1: no window), got ",
        v.window_right);
  check(std::isfinite(v.logits_soft_cap) && v.logits_soft_cap >= 0,
        "variant.logits_soft_cap must be >= 0 (0: off), got ", v.logits_soft_cap);
  check(!(v.sigmoid && v.sinks.defined()),
        "variant.sinks: sinks join a softmax denominator; sigmoid attention has none");
  // Positions are int in the kernels: a bound beyond any sequence (2^30) means the same and cannot
  // overflow q_pos ± window there.
  constexpr int kFar = 1 << 30;
  a.window_left = std::min(v.window_left, kFar);
  a.window_right = std::min(v.window_right, kFar);
  a.soft_cap = v.logits_soft_cap;
  a.inv_soft_cap = v.logits_soft_cap > 0 ? 1.f / v.logits_soft_cap : 0.f;
  a.sigmoid_bias = v.sigmoid_bias;
  if (v.alibi_slopes.defined()) {
    check_vector(v.alibi_slopes, "variant.alibi_slopes", DType::f32, c.num_qo_heads, c);
    a.alibi_slopes = static_cast<const float*>(v.alibi_slopes.data());
  }
  if (v.sinks.defined()) {
    check_vector(v.sinks, "variant.sinks", DType::f32, c.num_qo_heads, c);
    a.sinks = static_cast<const float*>(v.sinks.data());
  }
  if (v.custom_mask.defined()) {
    check(v.custom_mask.num_bytes >= 0, "variant.custom_mask.num_bytes must be >= 0, got ",
          v.custom_mask.num_bytes);
    a.custom_mask = v.custom_mask.bits;
    if (v.custom_mask.mask_indptr.defined()) {
      check_vector(v.custom_mask.mask_indptr, "variant.custom_mask.mask_indptr", DType::i32,
                   c.batch + 1, c);
      a.mask_indptr = static_cast<const int*>(v.custom_mask.mask_indptr.data());
    } else {
      check(c.batch == 1, "variant.custom_mask.mask_indptr is required for a batch of ", c.batch,
            " requests");
      check(c.single_request_mask_bits < 0 ||
                v.custom_mask.num_bytes * 8 >= c.single_request_mask_bits,
            "variant.custom_mask.num_bytes: the request's qo_len x kv_len mask needs ",
            (c.single_request_mask_bits + 7) / 8, " bytes, got ", v.custom_mask.num_bytes);
    }
  } else {
    check(!v.custom_mask.mask_indptr.defined(),
          "variant.custom_mask: mask_indptr given without mask bits");
  }
  if (v.rope.mode != RopeMode::none) {
    const std::vector<double> f = rope_frequencies(v.rope, c.head_dim);
    a.rope_pairs = c.head_dim / 2;
    for (int i = 0; i < a.rope_pairs; ++i) a.rope_freq[i] = f[i];
    if (v.rope.q_rope_offset.defined()) {
      check_vector(v.rope.q_rope_offset, "variant.rope.q_rope_offset", DType::i32, c.q_rows, c);
      a.q_rope_offset = static_cast<const int*>(v.rope.q_rope_offset.data());
    }
    if (v.rope.k_rope_offset.defined()) {
      check_vector(v.rope.k_rope_offset, "variant.rope.k_rope_offset", DType::i32, c.batch, c);
      a.k_rope_offset = static_cast<const int*>(v.rope.k_rope_offset.data());
    }
  } else {
    check(!v.rope.q_rope_offset.defined() && !v.rope.k_rope_offset.defined(),
          "variant.rope: q_rope_offset / k_rope_offset given with rope mode none");
  }
}

void pack_user(const VariantSpec& s, const VariantArgs& args, const VariantCallShape& c,
               unsigned char* out) {
  size_t total = 0;
  const std::vector<size_t> off = param_offsets(s.params, &total);
  check(total <= static_cast<size_t>(kVariantArgsBytes), "VariantSpec.params: ", total,
        " bytes of parameters, at most ", kVariantArgsBytes);
  for (const auto& [name, value] : args.values()) {
    bool declared = false;
    for (const auto& p : s.params) declared = declared || p.name == name;
    check(declared, "variant '", s.name, "': argument '", name,
          "' is not one of the declared VariantSpec.params");
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    const VariantParam& p = s.params[i];
    auto it = args.values().find(p.name);
    check(it != args.values().end(), "variant '", s.name, "': argument '", p.name,
          "' is declared but not given");
    const std::string what = "variant argument '" + p.name + "'";
    switch (p.kind) {
      case VariantParam::Kind::kF32: {
        check(std::holds_alternative<float>(it->second), what, ": expected a float");
        const float v = std::get<float>(it->second);
        std::memcpy(out + off[i], &v, 4);
        break;
      }
      case VariantParam::Kind::kI32: {
        check(std::holds_alternative<int32_t>(it->second), what, ": expected an int32");
        const int32_t v = std::get<int32_t>(it->second);
        std::memcpy(out + off[i], &v, 4);
        break;
      }
      case VariantParam::Kind::kTensor: {
        check(std::holds_alternative<TensorView>(it->second), what, ": expected a tensor");
        const TensorView& t = std::get<TensorView>(it->second);
        check_defined(t, what.c_str());
        check_dtype(t, what.c_str(), p.dtype);
        check_device(t, what.c_str(), c.device);
        const void* ptr = t.data();
        std::memcpy(out + off[i], &ptr, 8);
        break;
      }
    }
  }
}

}  // namespace

Variant decode_kernel_variant(const Variant& v) {
  if (!v.is_builtin()) return v;
  AttentionVariant b = v.builtin_description();
  if (b.window_left < 0 && b.window_right < 0) return v;
  b.window_left = b.window_right = -1;
  return Variant::builtin(b);
}

VariantJit variant_jit(const Variant& v) {
  VariantJit j;
  j.type = "flashkv::DefaultVariant";
  if (v.is_user()) return user_jit(v.spec());
  if (!v.is_builtin()) return j;
  const AttentionVariant& b = v.builtin_description();
  check(std::isfinite(b.sm_scale) && b.sm_scale >= 0.f,
        "variant.sm_scale: expected a finite value >= 0 (0: the op's), got ", b.sm_scale);
  j.causal = b.causal;
  j.sm_scale = b.sm_scale;
  j.use_softmax = b.use_softmax();
  j.transforms_qk = b.rope.mode != RopeMode::none;
  j.transforms_kv = j.transforms_qk;
  const int flags = builtin_flags(b);
  if (flags != 0) {
    // Constructed, then moved: g++ 12 reports a false -Wrestrict when `"b" + std::to_string()`
    // or an assignment from a literal inlines basic_string::_M_replace here (GCC PR 105651).
    char id[16];
    std::snprintf(id, sizeof(id), "b%d", flags);
    j.id = std::string(id);
    j.type = "flashkv::BuiltinVariant<" + std::to_string(flags) + ">";
    j.source = "\n#include \"variants/builtin.cuh\"\n";
  }
  return j;
}

bool same_variant_args(const VariantArgsBlock& a, const VariantArgsBlock& b) {
  return std::memcmp(a.bytes, b.bytes, sizeof(a.bytes)) == 0;
}

VariantArgsBlock pack_variant_args(const Variant& v, const VariantCallShape& c) {
  VariantArgsBlock block;
  std::memset(&block, 0, sizeof(block));
  if (v.is_builtin()) {
    static_assert(sizeof(BuiltinVariantArgs) <= kVariantArgsBytes);
    BuiltinVariantArgs a;
    pack_builtin(v.builtin_description(), c, a);
    std::memcpy(block.bytes, &a, sizeof(a));
  } else if (v.is_user()) {
    pack_user(v.spec(), v.args(), c, block.bytes);
  }
  return block;
}

}  // namespace flashkv::ops
