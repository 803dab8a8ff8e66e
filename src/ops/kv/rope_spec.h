// Host side of kv/rope_math.cuh's RopeSpec: how one launch rotates, filled once on the host and
// passed by value in kernel params. apply_rope's kernel (ops/kv/rope.cpp) and the fused decode step
// (ops/decode/decode_step.cpp) both build their spec here, so they rotate identically.
#pragma once

#include <vector>

#include "flashkv/tensor.h"
#include "kv/rope_math.cuh"

namespace flashkv::ops {

// Rotation by frequencies (rope_frequencies(), one per pair, in double). rotary_dim even, in
// [2, 2 * kRopeMaxPairs]; freq.size() == rotary_dim / 2. Throws flashkv::Error naming the value.
RopeSpec make_rope_spec(int rotary_dim, const std::vector<double>& freq, bool interleave = false);

// Rotation by a precomputed cos/sin cache, f32 [max_position, rotary_dim] on the device with
// contiguous rows (the kernel addresses row p at p * rotary_dim), rotary_dim even and <= 256.
// The spec points at the cache: it must outlive every launch that uses the spec.
RopeSpec make_rope_spec_cache(const TensorView& cos_sin_cache, bool interleave = false);

}  // namespace flashkv::ops
