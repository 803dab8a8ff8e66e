// The decode family's kernels for `flashkv precompile` (ops/jit/precompile_family.h): per shape,
// the CUDA-core kernel, the tensor-core kernel where it takes the shape, and the other tensor-core
// shapes BatchDecode's auto mode picks; each also with every variant of the options.
#include "ops/jit/precompile_family.h"

namespace flashkv::ops {

void enumerate_decode_kernels(const PrecompileScope& scope, PrecompileList& out) {
  const PrecompileOptions& opts = scope.opts;
  const VariantJit plain = plain_variant_jit();
  for (DType t : opts.dtypes)
    for (DType kv : scope.kv_dtypes(t))
      for (int d : opts.head_dims)
        for (int g : opts.group_sizes)
          for (int p : opts.page_sizes) {
            DecodeKernelKey key;
            key.q = t;
            key.kv = kv;
            key.head_dim = d;
            key.group = g;
            key.page_size = p;
            const bool tc_ok = decode_tc_supported(d, g);
            for (const bool tc : {false, true}) {
              if (tc && !tc_ok) continue;
              key.tensor_cores = tc;
              key.tuning = {};
              key.variant = plain.kernel();
              out.kernels.push_back(kernel_spec(key));
              // The other shapes BatchDecode's auto mode picks.
              if (tc && d <= 128)
                for (const auto& shape : {kDecodeTCSmallCtas, kDecodeTCOneCta}) {
                  key.tuning = shape;
                  out.kernels.push_back(kernel_spec(key));
                }
              key.tuning = {};
              for (const VariantJit& vj : scope.decode_variants) {
                key.variant = vj.kernel();
                key.widen_kv = fp8_kv_widened(kv, vj);
                out.variant_kernels.push_back(kernel_spec(key));
              }
              key.widen_kv = false;
            }
          }
}

}  // namespace flashkv::ops
