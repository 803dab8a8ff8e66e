// Attention variants for the GPU kernels: a built-in description (variants.h) or a user's own
// variant as device C++ source text, JIT-compiled into the decode and prefill kernels (one
// interface for every kernel; kernels/variants/variant.cuh documents the hooks).
//
//   VariantSpec spec;
//   spec.name = "T5Bias";
//   spec.params = {{"num_buckets", VariantParam::Kind::kI32},
//                  {"bias", VariantParam::Kind::kTensor, DType::f32}};
//   spec.source = R"(
//     struct T5Bias {
//       using Args = Params;  // generated from spec.params: struct Params { int num_buckets;
//                             //                                          const float* bias; };
//       __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition& p,
//                                                float s) { ... }
//     };)";
//   Variant v = Variant::user(spec, VariantArgs().set("num_buckets", 32).set("bias", bias_view));
//   decode.plan(batch, shape, DecodePlanOptions{.variant = v});
//
// The source is compiled once per (spec, kernel configuration); the JIT key holds a hash of the
// source and the declaration. A compile error in the source raises flashkv::Error with NVRTC's
// log, whose line numbers are those of spec.source ("T5Bias.variant(3): error: ...").
// Arguments are given at plan() and may be replaced at run() (same declaration); tensors are
// device pointers captured by value, so a CUDA graph replays with the arguments of its capture.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/tensor.h"
#include "flashkv/variants.h"

namespace flashkv {

struct VariantParam {
  enum class Kind : uint8_t { kF32, kI32, kTensor };
  std::string name;  // a C++ identifier: the field of the generated `struct Params`
  Kind kind = Kind::kF32;
  DType dtype = DType::f32;  // kTensor: element type (the field is `const T*`)
};

struct VariantSpec {
  std::string name;    // the struct `source` defines (a C++ identifier)
  std::string source;  // device C++: struct `name` with `using Args = Params;` and its hooks
  std::vector<VariantParam> params;
  bool use_softmax = true;  // must equal the struct's kUseSoftmax (checked when it compiles)
};

// Values of a VariantSpec's params, by name. Tensors must be on the device of the op.
class VariantArgs {
 public:
  using Value = std::variant<float, int32_t, TensorView>;
  VariantArgs& set(const std::string& name, float v);
  VariantArgs& set(const std::string& name, int32_t v);
  VariantArgs& set(const std::string& name, const TensorView& t);
  const std::map<std::string, Value>& values() const { return values_; }

 private:
  std::map<std::string, Value> values_;
};

// What plan() takes: nothing (plain attention), a built-in, or a user variant with its args.
class Variant {
 public:
  Variant() = default;  // plain attention (the causal flag and sm_scale stay the op's options)
  // The built-ins of variants.h. `causal` and `sm_scale` of the description apply where the op
  // has no causal / sm_scale option of its own set (decode is never causal: one query row).
  static Variant builtin(const AttentionVariant& v);
  static Variant user(VariantSpec spec, VariantArgs args);

  bool is_plain() const { return kind_ == Kind::kPlain; }
  bool is_builtin() const { return kind_ == Kind::kBuiltin; }
  bool is_user() const { return kind_ == Kind::kUser; }
  const AttentionVariant& builtin_description() const { return builtin_; }
  const VariantSpec& spec() const { return *spec_; }
  const VariantArgs& args() const { return args_; }
  // Whether rows are normalized by a softmax (false: sigmoid attention; no lse exists).
  bool use_softmax() const;
  // The same variant with other argument values (a user variant: same spec).
  Variant with_args(VariantArgs args) const;

 private:
  enum class Kind : uint8_t { kPlain, kBuiltin, kUser };
  Kind kind_ = Kind::kPlain;
  AttentionVariant builtin_{};
  std::shared_ptr<const VariantSpec> spec_;
  VariantArgs args_;
};

}  // namespace flashkv
