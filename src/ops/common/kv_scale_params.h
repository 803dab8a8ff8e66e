// KVScale (flashkv/attention.h) as the kernels take it (kernels/kv/kv_scale.cuh). The caller has
// checked it (check_kv_scale).
#pragma once

#include "flashkv/attention.h"
#include "kv/kv_scale.cuh"

namespace flashkv::ops {

inline KVScaleParams kv_scale_params(const KVScale& s) {
  KVScaleParams p{};
  p.k = s.k_tensor.defined() ? s.k_tensor.data_as<const float>() : nullptr;
  p.v = s.v_tensor.defined() ? s.v_tensor.data_as<const float>() : nullptr;
  p.k_per_head = s.k_tensor.defined() && s.k_tensor.size(0) > 1 ? 1 : 0;
  p.v_per_head = s.v_tensor.defined() && s.v_tensor.size(0) > 1 ? 1 : 0;
  p.k_factor = s.k;
  p.v_factor = s.v;
  return p;
}

}  // namespace flashkv::ops
