// Host side of the fused decode step: argument checks and the kernel's step parameters.
#include "ops/decode/decode_step.h"

#include <algorithm>

#include "core/kv_ops_checks.h"
#include "flashkv/error.h"
#include "ops/kv/rope_spec.h"
#include "runtime/device_errors.h"

namespace flashkv::ops {
namespace {

// The frequency-table RopeSpec of `step` (Llama / Llama 3.1), memoized on its options.
const RopeSpec& frequency_spec(const DecodeStepOptions& step, int head_dim, RopeSpecMemo& memo) {
  using Rope = DecodeStepOptions::Rope;
  const bool hit =
      memo.valid && memo.kind == step.rope && memo.head_dim == head_dim &&
      (step.rope == Rope::kLlama ? memo.llama == step.llama : memo.llama31 == step.llama31);
  if (hit) return memo.spec;
  memo.valid = false;
  if (step.rope == Rope::kLlama) {
    const int rd = detail::resolve_rotary_dim(step.llama.rotary_dim, head_dim, "llama.rotary_dim");
    memo.spec = make_rope_spec(rd, rope_frequencies(rd, step.llama), step.llama.interleave);
    memo.llama = step.llama;
  } else {
    const int rd =
        detail::resolve_rotary_dim(step.llama31.rotary_dim, head_dim, "llama31.rotary_dim");
    memo.spec = make_rope_spec(rd, rope_frequencies(rd, step.llama31), step.llama31.interleave);
    memo.llama31 = step.llama31;
  }
  memo.kind = step.rope;
  memo.head_dim = head_dim;
  memo.valid = true;
  return memo.spec;
}

void check_new_rows(const TensorView& t, const char* name, const DecodeStepShape& s) {
  const Device dev = Device::cuda(s.device);
  check_defined(t, name);
  check_device(t, name, dev);
  check_dtype(t, name, is_fp8_dtype(s.kv_dtype) ? s.q_dtype : s.kv_dtype);
  check_ndim(t, name, 3);
  if (s.graph ? t.size(0) < s.batch : t.size(0) != s.batch) {
    fail(name, ": expected ", s.graph ? "at least " : "", s.batch,
         " rows (one new token per request of the plan), got ", t.size(0));
  }
  check_shape(t, name, {-1, s.num_kv_heads, s.head_dim});
  check_last_dim_contiguous(t, name);
  check_aligned(t, name, 16);
  check(t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0, name,
        ": row and head strides must be multiples of 16 bytes");
}

}  // namespace

DecodeStepParams make_decode_step_params(const TensorView& new_k, const TensorView& new_v,
                                         const DecodeStepOptions& step,
                                         const DecodeStepShape& shape, RopeSpecMemo& memo) {
  using Rope = DecodeStepOptions::Rope;
  check_new_rows(new_k, "new_k", shape);
  check_new_rows(new_v, "new_v", shape);
  check(shape.batch == 0 || shape.min_kv_len >= 1,
        "BatchDecode::run_step: every request must have kv_len >= 1 in the plan (the page table "
        "after the append counts the new token); the plan has a request with kv_len 0");
  DecodeStepParams p{};
  p.new_k = new_k.data();
  p.new_v = new_v.data();
  p.k_stride_n = new_k.stride(0);
  p.k_stride_h = new_k.stride(1);
  p.v_stride_n = new_v.stride(0);
  p.v_stride_h = new_v.stride(1);
  if (step.pos_ids.defined()) {
    const TensorView& pos = step.pos_ids;
    check_device(pos, "step.pos_ids", Device::cuda(shape.device));
    check_dtype(pos, "step.pos_ids", DType::i32);
    check_ndim(pos, "step.pos_ids", 1);
    check(shape.graph ? pos.size(0) >= shape.batch : pos.size(0) == shape.batch,
          "step.pos_ids: expected ", shape.graph ? "at least " : "", shape.batch,
          " entries (one per request), got ", pos.size(0));
    check(pos.size(0) <= 1 || pos.stride(0) == 1, "step.pos_ids: expected a contiguous array");
    p.pos_ids = pos.data_as<const int>();
  }
  switch (step.rope) {
    case Rope::kNone:
      p.rope = 0;
      return p;
    case Rope::kLlama:
    case Rope::kLlama31:
      p.spec = frequency_spec(step, shape.head_dim, memo);
      break;
    case Rope::kCosSinCache: {
      check_device(step.cos_sin_cache, "step.cos_sin_cache", Device::cuda(shape.device));
      detail::check_cos_sin_cache(step.cos_sin_cache, shape.head_dim);
      p.spec = make_rope_spec_cache(step.cos_sin_cache, !step.is_neox);
      check(step.pos_ids.defined() || shape.max_kv_len <= p.spec.max_position,
            "step.cos_sin_cache: has ", p.spec.max_position, " positions; the plan appends at ",
            "position ", shape.max_kv_len - 1);
      break;
    }
    default:
      fail("step.rope: unknown value ", static_cast<int>(step.rope));
  }
  p.rope = 1;
  return p;
}

}  // namespace flashkv::ops
