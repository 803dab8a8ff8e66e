// RoPE options and their frequencies: the math the GPU ops (rope.h, the fused decode step, the
// RoPE variant) and the CPU reference share. Implemented in src/core (rope_frequencies.cpp); the
// formulas are in rope.h's header comment.
#pragma once

#include <vector>

namespace flashkv {

// Llama RoPE (FlashInfer's apply_rope defaults).
struct RopeOptions {
  int rotary_dim = 0;  // 0: the whole head_dim
  bool interleave = false;
  double rope_scale = 1.0;
  double rope_theta = 1e4;
  bool operator==(const RopeOptions&) const = default;
};

// Llama 3.1 RoPE (FlashInfer's apply_llama31_rope defaults: the Llama-3.1 model's values).
struct Llama31RopeOptions {
  int rotary_dim = 0;  // 0: the whole head_dim
  bool interleave = false;
  double rope_scale = 8.0;  // "factor" in the Llama 3.1 config
  double rope_theta = 5e5;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;  // must be > low_freq_factor
  double old_context_len = 8192;  // "original_max_position_embeddings"
  bool operator==(const Llama31RopeOptions&) const = default;
};

// freq[i], i in [0, rotary_dim / 2), in radians per position (see the header comment). Throws
// flashkv::Error naming the option that is out of range (rotary_dim odd or < 2, rope_theta or
// rope_scale <= 0, high_freq_factor <= low_freq_factor, ...). `rotary_dim` must be resolved
// (not 0).
std::vector<double> rope_frequencies(int rotary_dim, const RopeOptions& opts);
std::vector<double> rope_frequencies(int rotary_dim, const Llama31RopeOptions& opts);

}  // namespace flashkv
