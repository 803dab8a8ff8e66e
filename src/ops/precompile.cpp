#include <chrono>
#include <climits>

#include "flashkv/error.h"
#include "flashkv/jit.h"
#include "ops/kernel_specs.h"

namespace flashkv {

std::vector<PrecompiledKernel> precompile(const PrecompileOptions& opts) {
  std::vector<ops::KernelSpec> specs;
  for (const std::string& op : opts.ops) {
    if (op == "merge") {
      for (DType t : opts.dtypes) specs.push_back(ops::merge_kernel_spec(t));
    } else if (op == "decode") {
      for (DType t : opts.dtypes)
        for (int d : opts.head_dims)
          for (int g : opts.group_sizes)
            for (int p : opts.page_sizes) {
              specs.push_back(ops::decode_kernel_spec(t, t, d, g, p, false));
              if (ops::decode_tc_supported(d, g)) {
                specs.push_back(ops::decode_kernel_spec(t, t, d, g, p, true));
                // The other shapes BatchDecode's auto mode picks.
                if (d <= 128)
                  for (const auto& shape : {ops::kDecodeTCSmallCtas, ops::kDecodeTCOneCta})
                    specs.push_back(ops::decode_kernel_spec(
                        t, t, d, g, p, true, {"", "flashkv::DefaultVariant"}, shape));
              }
            }
    } else if (op == "prefill") {
      // The Hopper kernel too, where the target has it (no GPU here: its shared-memory limit is
      // checked at plan()).
      const bool hopper = ops::prefill_wgmma_unsupported(opts.arch, 128, true, 128, INT_MAX).empty();
      for (DType t : opts.dtypes)
        for (int d : opts.head_dims)
          for (int kv : {0, 1, 2}) {
            for (int rows : {16, 32, 64, 128}) specs.push_back(ops::prefill_kernel_spec(t, d, rows, kv));
            if (hopper) specs.push_back(ops::prefill_hopper_kernel_spec(t, d, kv));
          }
    } else if (op == "cascade") {  // the gather / merge kernels around the levels' passes
      for (DType t : opts.dtypes) specs.push_back(ops::cascade_kernel_spec(t));
    } else if (op == "kv") {  // RoPE, KV append, get_batch_indices_positions
      for (DType t : opts.dtypes) {
        specs.push_back(ops::rope_kernel_spec(t));
        specs.push_back(ops::kv_append_kernel_spec(t));
      }
      specs.push_back(ops::batch_indices_positions_kernel_spec());
    } else {
      fail("precompile: unknown op '", op, "' (expected merge, decode, prefill, kv or cascade)");
    }
  }
  std::vector<PrecompiledKernel> out;
  for (const auto& spec : specs) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool cold = runtime::KernelCache::instance().precompile(spec.id, opts.arch, spec.make);
    out.push_back(
        {spec.id, cold,
         std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()});
  }
  return out;
}

}  // namespace flashkv
