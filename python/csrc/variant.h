// Attention variants from Python (flashkv/variant_spec.h): a flashkv::Variant plus the arrays its
// views point into, so that the arrays outlive every plan that captured their pointers.
#pragma once

#include <vector>

#include "array_view.h"
#include "flashkv/variant_spec.h"

namespace flashkv::python {

struct PyVariant {
  Variant variant;
  std::vector<InArray> keep;  // the arrays behind the variant's TensorViews / mask bytes
};

// _C.builtin_variant, _C.user_variant and the CPU reference ops that take a built-in variant.
void bind_variants(nb::module_& m);

}  // namespace flashkv::python
