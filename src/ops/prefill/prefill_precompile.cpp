// The prefill family's kernels for `flashkv precompile` (ops/jit/precompile_family.h): per dtype,
// head_dim and KV source, the mma.sync kernel at every query-tile size, and the Hopper kernel
// where the target has it; each also with the variants of the options each kernel takes.
#include <climits>

#include "ops/jit/precompile_family.h"

namespace flashkv::ops {

void enumerate_prefill_kernels(const PrecompileScope& scope, PrecompileList& out) {
  const PrecompileOptions& opts = scope.opts;
  // The Hopper kernel too, where the target has it (no GPU here: its shared-memory limit is
  // checked at plan()).
  const bool hopper = prefill_wgmma_unsupported(opts.arch, 128, false, 128, INT_MAX).empty();
  for (DType t : opts.dtypes)
    for (DType kvt : scope.kv_dtypes(t))
      for (int d : opts.head_dims)
        for (const PrefillKV kv : {PrefillKV::kRagged, PrefillKV::kPagedPow2, PrefillKV::kPaged}) {
          PrefillKernelKey key;
          key.dtype = t;
          key.fp8_kv = is_fp8_dtype(kvt) ? kvt : DType::f32;
          key.head_dim = d;
          key.kv = kv;
          for (int rows : {16, 32, 64, 128}) {
            key.rows = rows;
            out.kernels.push_back(kernel_spec(key));
            for (const VariantJit& vj : scope.prefill_variants) {
              PrefillKernelKey vkey = key;
              vkey.variant = vj.kernel();
              vkey.widen_kv = fp8_kv_widened(kvt, vj);
              out.variant_kernels.push_back(kernel_spec(vkey));
            }
          }
          if (hopper) {
            key.rows = 128;
            key.wgmma = true;
            out.kernels.push_back(kernel_spec(key));
            for (const VariantJit& vj : scope.prefill_variants) {
              if (vj.transforms_kv || !vj.use_softmax) continue;  // the mma.sync kernel's
              PrefillKernelKey vkey = key;
              vkey.variant = vj.kernel();
              out.variant_kernels.push_back(kernel_spec(vkey));
            }
          }
        }
}

}  // namespace flashkv::ops
