// Host side of RoPE's kernel parameters (ops/kv/rope_spec.h): the frequency table or the cos/sin
// cache a launch rotates with, checked once here for both apply_rope's kernel and the fused step.
#include "ops/kv/rope_spec.h"

#include <cmath>

#include "flashkv/error.h"

namespace flashkv::ops {
namespace {

void check_rotary_dim(int rotary_dim, const char* what) {
  check(rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= 2 * kRopeMaxPairs, what,
        ": rotary_dim = ", rotary_dim, ": the GPU kernels take an even rotary_dim in [2, ",
        2 * kRopeMaxPairs, "]");
}

}  // namespace

RopeSpec make_rope_spec(int rotary_dim, const std::vector<double>& freq, bool interleave) {
  check_rotary_dim(rotary_dim, "rope");
  check(static_cast<int>(freq.size()) == rotary_dim / 2, "rope: ", freq.size(),
        " frequencies for rotary_dim ", rotary_dim, ": expected one per pair (", rotary_dim / 2,
        ")");
  RopeSpec s{};
  s.cos_sin_cache = nullptr;
  s.max_position = 0;  // unused without a cache: any position >= 0 is valid
  s.rotary_dim = rotary_dim;
  s.interleave = interleave ? 1 : 0;
  for (size_t i = 0; i < freq.size(); ++i) {
    check(std::isfinite(freq[i]), "rope: freq[", i, "] = ", freq[i], " is not finite");
    s.freq[i] = freq[i];
  }
  return s;
}

RopeSpec make_rope_spec_cache(const TensorView& cos_sin_cache, bool interleave) {
  check_defined(cos_sin_cache, "cos_sin_cache");
  check_ndim(cos_sin_cache, "cos_sin_cache", 2);
  check_dtype(cos_sin_cache, "cos_sin_cache", DType::f32);
  check(cos_sin_cache.device().is_cuda(), "cos_sin_cache: expected a CUDA tensor, got ",
        cos_sin_cache.str());
  const int64_t width = cos_sin_cache.size(1);
  check(width <= 2 * kRopeMaxPairs, "cos_sin_cache: rotary_dim = ", width,
        " (its width): the GPU kernels take at most ", 2 * kRopeMaxPairs);
  const int rotary_dim = static_cast<int>(width);
  check_rotary_dim(rotary_dim, "cos_sin_cache");
  check(cos_sin_cache.size(0) <= 1 || cos_sin_cache.stride(0) == rotary_dim,
        "cos_sin_cache: the GPU kernels need contiguous rows (stride(0) == rotary_dim = ",
        rotary_dim, "), got stride(0) = ", cos_sin_cache.stride(0));
  check_last_dim_contiguous(cos_sin_cache, "cos_sin_cache");
  check_aligned(cos_sin_cache, "cos_sin_cache", 4);
  RopeSpec s{};
  s.cos_sin_cache = cos_sin_cache.data_as<const float>();
  s.max_position = cos_sin_cache.size(0);
  s.rotary_dim = rotary_dim;
  s.interleave = interleave ? 1 : 0;
  return s;
}

}  // namespace flashkv::ops
