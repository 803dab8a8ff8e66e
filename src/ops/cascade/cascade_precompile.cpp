// The cascade's own kernels for `flashkv precompile` (ops/jit/precompile_family.h): the gather and
// merge around the levels' passes; the passes themselves are the decode and prefill families'.
#include "ops/jit/precompile_family.h"

namespace flashkv::ops {

void enumerate_cascade_kernels(const PrecompileScope& scope, PrecompileList& out) {
  for (DType t : scope.opts.dtypes) out.kernels.push_back(cascade_kernel_spec(t));
}

}  // namespace flashkv::ops
