#include "ops/jit/precompile_family.h"

#include "flashkv/dtype.h"

namespace flashkv::ops {

PrecompileScope::PrecompileScope(const PrecompileOptions& o) : opts(o) {
  for (const Variant& v : opts.variants) {
    prefill_variants.push_back(variant_jit(v));
    decode_variants.push_back(variant_jit(decode_kernel_variant(v)));
  }
}

std::vector<DType> PrecompileScope::kv_dtypes(DType q) const {
  std::vector<DType> kvs;
  for (DType kv : opts.kv_dtypes)
    if (is_fp8_dtype(kv) || kv == q) kvs.push_back(kv);
  if (opts.kv_dtypes.empty()) kvs.push_back(q);
  return kvs;
}

std::span<const PrecompileFamily> precompile_families() {
  static constexpr PrecompileFamily kFamilies[] = {
      {"merge", enumerate_merge_kernels},      // merge_state(s), merge_lse
      {"decode", enumerate_decode_kernels},    // CUDA-core and tensor-core decode
      {"prefill", enumerate_prefill_kernels},  // mma.sync and Hopper prefill
      {"kv", enumerate_kv_kernels},            // RoPE, KV append, get_batch_indices_positions
      {"cascade", enumerate_cascade_kernels},  // the gather / merge kernels around the levels
  };
  return kFamilies;
}

}  // namespace flashkv::ops
