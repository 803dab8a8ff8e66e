// The KV family's kernels for `flashkv precompile` (ops/jit/precompile_family.h): RoPE, the KV
// append (copying, or quantizing into an fp8 cache) and get_batch_indices_positions.
#include "ops/jit/precompile_family.h"

namespace flashkv::ops {

void enumerate_kv_kernels(const PrecompileScope& scope, PrecompileList& out) {
  for (DType t : scope.opts.dtypes) {
    out.kernels.push_back(rope_kernel_spec(t));
    for (DType kv : scope.kv_dtypes(t)) out.kernels.push_back(kv_append_kernel_spec(kv, t));
  }
  out.kernels.push_back(batch_indices_positions_kernel_spec());
}

}  // namespace flashkv::ops
