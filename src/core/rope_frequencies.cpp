// RoPE frequencies (rope.h): Llama's base[i] = theta^(-2i/rotary_dim) / rope_scale and Llama
// 3.1's wavelength-dependent scaling, in double. The CPU reference rotates by these; the GPU
// kernels will compute the same formulas in f32.
#include "flashkv/rope_frequencies.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "flashkv/error.h"

namespace flashkv {
namespace {

void check_rotary_dim(int rotary_dim) {
  check(rotary_dim >= 2 && rotary_dim % 2 == 0, "rotary_dim = ", rotary_dim,
        ": expected an even number >= 2");
}

void check_theta_scale(double rope_theta, double rope_scale) {
  check(std::isfinite(rope_theta) && rope_theta > 0, "rope_theta = ", rope_theta,
        ": expected a positive finite number");
  check(std::isfinite(rope_scale) && rope_scale > 0, "rope_scale = ", rope_scale,
        ": expected a positive finite number");
}

// theta^(-2i / rotary_dim) for i in [0, rotary_dim / 2).
std::vector<double> base_frequencies(int rotary_dim, double rope_theta) {
  std::vector<double> f(rotary_dim / 2);
  for (int i = 0; i < rotary_dim / 2; ++i) {
    f[i] = std::pow(rope_theta, -2.0 * i / rotary_dim);
  }
  return f;
}

}  // namespace

std::vector<double> rope_frequencies(int rotary_dim, const RopeOptions& opts) {
  check_rotary_dim(rotary_dim);
  check_theta_scale(opts.rope_theta, opts.rope_scale);
  std::vector<double> f = base_frequencies(rotary_dim, opts.rope_theta);
  for (double& x : f) x /= opts.rope_scale;
  return f;
}

std::vector<double> rope_frequencies(int rotary_dim, const Llama31RopeOptions& opts) {
  check_rotary_dim(rotary_dim);
  check_theta_scale(opts.rope_theta, opts.rope_scale);
  const double lo = opts.low_freq_factor, hi = opts.high_freq_factor;
  check(std::isfinite(lo) && lo > 0, "low_freq_factor = ", lo,
        ": expected a positive finite number");
  check(std::isfinite(hi) && hi > lo, "high_freq_factor = ", hi,
        ": expected a finite number > low_freq_factor = ", lo);
  check(std::isfinite(opts.old_context_len) && opts.old_context_len > 0,
        "old_context_len = ", opts.old_context_len, ": expected a positive finite number");
  std::vector<double> f = base_frequencies(rotary_dim, opts.rope_theta);
  for (double& base : f) {
    const double wavelen = 2.0 * std::numbers::pi / base;
    // 1 for short wavelengths (high frequency: unchanged), 0 for long ones (scaled by 1/scale).
    const double smooth = std::clamp((opts.old_context_len / wavelen - lo) / (hi - lo), 0.0, 1.0);
    base = (1.0 - smooth) * base / opts.rope_scale + smooth * base;
  }
  return f;
}

}  // namespace flashkv
