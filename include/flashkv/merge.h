// ⊕, the merge of attention states (docs/design.md "Kernel families"), as public ops.
//
// States are (v, s): v [n, H, D] in f16/bf16/f32, s f32 [n, H], natural-log LSE (attention.h).
// Host tensors run on the CPU reference; CUDA tensors on the GPU (JIT kernel, enqueued on
// `stream`, never synchronizing). All tensors of one call must be on the same device.
// GPU path: tensors contiguous, data 16-byte aligned, D * sizeof(dtype) a multiple of 16.
#pragma once

#include "flashkv/runtime.h"
#include "flashkv/tensor.h"

namespace flashkv {

// (v_out, s_out) = (v_a, s_a) ⊕ (v_b, s_b).
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 Stream stream = nullptr);

// (v, s) = (v, s) ⊕ (v_other, s_other), in place.
void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, Stream stream = nullptr);

// ⊕ over the S states of each row: v[n, S, H, D], s[n, S, H] -> v_out[n, H, D], s_out[n, H].
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, Stream stream = nullptr);

}  // namespace flashkv
