// A kernel family's part of `flashkv precompile`: the kernels one op name of
// PrecompileOptions::ops stands for, enumerated from the options' shapes. precompile()
// (precompile.cpp) walks the families the options name, in their order; each enumerator lives
// beside its op (ops/<op>/<op>_precompile.cpp) and builds its kernels through the same keys and
// kernel specs the op's plan() loads, so a precompiled entry is the one a plan finds. A new family
// is one enumerator and its row in precompile_families() (precompile_family.cpp).
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/jit.h"
#include "ops/jit/kernel_specs.h"
#include "ops/jit/variant_jit.h"

namespace flashkv::ops {

// What every enumerator reads: the options, and what precompile derives from them once.
struct PrecompileScope {
  explicit PrecompileScope(const PrecompileOptions& opts);

  const PrecompileOptions& opts;
  // The kernel side of opts.variants as each op's plan() derives it.
  std::vector<VariantJit> decode_variants, prefill_variants;
  // The cache dtypes under q dtype `q` (PrecompileOptions::kv_dtypes).
  std::vector<DType> kv_dtypes(DType q) const;
};

// Where an enumerator appends its kernels: plain attention's, and those of opts.variants, which
// precompile compiles before all others (a user variant's compile error shows soon).
struct PrecompileList {
  std::vector<KernelSpec> kernels;
  std::vector<KernelSpec> variant_kernels;
};

using PrecompileEnumerator = void (*)(const PrecompileScope& scope, PrecompileList& out);

struct PrecompileFamily {
  std::string_view op;  // its name in PrecompileOptions::ops and `flashkv precompile --ops`
  PrecompileEnumerator enumerate;
};

// Every family, in the order of PrecompileOptions' default ops.
std::span<const PrecompileFamily> precompile_families();

// The enumerators, one per family (each defined in its op's folder).
void enumerate_merge_kernels(const PrecompileScope& scope, PrecompileList& out);
void enumerate_decode_kernels(const PrecompileScope& scope, PrecompileList& out);
void enumerate_prefill_kernels(const PrecompileScope& scope, PrecompileList& out);
void enumerate_kv_kernels(const PrecompileScope& scope, PrecompileList& out);
void enumerate_cascade_kernels(const PrecompileScope& scope, PrecompileList& out);

}  // namespace flashkv::ops
