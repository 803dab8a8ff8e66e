// The merge family's kernels for `flashkv precompile` (ops/jit/precompile_family.h).
#include "ops/jit/precompile_family.h"

namespace flashkv::ops {

void enumerate_merge_kernels(const PrecompileScope& scope, PrecompileList& out) {
  for (DType t : scope.opts.dtypes) out.kernels.push_back(merge_kernel_spec(t));
}

}  // namespace flashkv::ops
