// Host side of variant_spec.h: the argument map and the Variant value.
#include "flashkv/variant_spec.h"

#include "flashkv/error.h"

namespace flashkv {

VariantArgs& VariantArgs::set(const std::string& name, float v) {
  values_[name] = v;
  return *this;
}
VariantArgs& VariantArgs::set(const std::string& name, int32_t v) {
  values_[name] = v;
  return *this;
}
VariantArgs& VariantArgs::set(const std::string& name, const TensorView& t) {
  values_[name] = t;
  return *this;
}

Variant Variant::builtin(const AttentionVariant& v) {
  Variant r;
  r.kind_ = Kind::kBuiltin;
  r.builtin_ = v;
  return r;
}

Variant Variant::user(VariantSpec spec, VariantArgs args) {
  Variant r;
  r.kind_ = Kind::kUser;
  r.spec_ = std::make_shared<const VariantSpec>(std::move(spec));
  r.args_ = std::move(args);
  return r;
}

bool Variant::use_softmax() const {
  if (kind_ == Kind::kBuiltin) return builtin_.use_softmax();
  if (kind_ == Kind::kUser) return spec_->use_softmax;
  return true;
}

Variant Variant::with_args(VariantArgs args) const {
  check(kind_ == Kind::kUser, "Variant::with_args: only a user variant takes VariantArgs");
  Variant r = *this;
  r.args_ = std::move(args);
  return r;
}

}  // namespace flashkv
