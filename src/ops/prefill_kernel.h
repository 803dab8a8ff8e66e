// The prefill kernel specializations: their JIT spec and launch geometry (host mirror of
// PrefillConfig in kernels/attention/prefill.cuh: keep the two in step).
#pragma once

#include <string>

#include "flashkv/dtype.h"
#include "ops/kernel_specs.h"

namespace flashkv::ops {

struct PrefillGeometry {
  unsigned threads = 0, smem = 0;
};

inline PrefillGeometry prefill_geometry(int head_dim, int rows) {
  const int warps_q = rows / 16;
  const int warps_kv = rows >= 64 ? 1 : 4 / warps_q;
  const int warps = warps_q * warps_kv;
  const int tile = (head_dim <= 128 || warps_kv == 4) ? 64 : 32;
  const int q_bytes = rows * head_dim * 2;
  const int kv_bytes = 2 * 2 * tile * head_dim * 2;
  const int merge_bytes = warps_kv > 1 ? warps * 16 * (head_dim + 2) * 4 : 0;
  return {static_cast<unsigned>(32 * warps),
          static_cast<unsigned>(q_bytes + (kv_bytes > merge_bytes ? kv_bytes : merge_bytes))};
}

// "flashkv::PrefillConfig<flashkv::half_t, 128, 64>"
std::string prefill_config_type(DType dtype, int head_dim, int rows);
// The kernel's name expression: flashkv::batch_prefill_kernel<config>.
std::string prefill_kernel_name(DType dtype, int head_dim, int rows);
KernelSpec prefill_kernel_spec(DType dtype, int head_dim, int rows);

}  // namespace flashkv::ops
