// Auto's rule (BatchDecodeConfig.ctas_per_sm = 0); its numbers and the pure rules
// (decode_auto_ctas_per_sm, decode_auto_warps) are the sm_90 policy's, tuning/sm90.cuh. Decode
// streams the KV cache; what an SM needs is ~8 warps (below that the tensor-core loop is
// latency-bound: 1 CTA of 4 warps per SM reached 51 % of the read ceiling on GQA D1) and one tile
// in flight per CTA (decode_shape.cuh). Three ways to get 8 warps, measured on the H200 (f16, % of
// the read ceiling, decode-shape-sweep-2026-11-29.log):
//
//                 1 x 8 warps   2 x 4 warps   4 x 2 warps
//   GQA D1 16x1K     61.0          56.9          53.9     equal pairs, no more than SMs
//   GQA D4 1x32K     69.6          66.9          58.9     one long request, split
//   GQA D2/D3     36.3 / 48.1   45.7 / 53.4   45.2 / 49.7  unequal lengths
//   GQA D5/D6     89.5 / 86.2   93.0 / 93.0   95.5 / 95.9  plenty of work per CTA
//   MHA D1/D3/D4  73 / 70 / 89  83 / 79 / 90  88 / 81 / 91 >= 993 tokens per small CTA
//   MHA D2           65.8          77.8          69.2     745 tokens per small CTA
//
// - 4 small CTAs per SM where every CTA has plenty of work: one CTA's item ramp (its first loads'
//   latency) hides behind three others. Where work must be split finely they lose: twice the
//   partial states to merge. The threshold lies between the workloads that won and lost.
// - One 8-warp CTA per SM where the batch has no more (request, KV head) pairs than SMs and all
//   are equally long: each CTA streams a whole pair (no merge at all) or an equal share of one
//   long request (half the partial states of 2 CTAs per SM). Unequal lengths need the finer
//   granularity of 2 CTAs per SM to balance.
// - Else 2 CTAs of 4 warps, the default.
// A captured CUDA graph holds its kernel and grid, and fixed_split_size promises bitwise batch
// invariance (the warps' share of a chunk sets the order of the sums): both keep the default. So
// does a GPU whose per-block shared memory the chosen shape exceeds (the one-CTA shape needs
// 132 KB at head_dim 128; sm_86/sm_89 allow ~100).
#include "ops/decode/decode_shape_choice.h"

#include <algorithm>

#include "attention/decode/decode_shape.cuh"

namespace flashkv::ops {

DecodeShapeChoice choose_decode_shape(const DecodeShapeInputs& in) {
  using policy = tuning::Policy;
  int ctas = in.config_ctas_per_sm;
  if (ctas == 0) {
    ctas = policy::kDecodeDefaultCtasPerSm;
    const bool may_change = !in.enable_cuda_graph && in.fixed_split_size == 0 && in.tc_warps == 0 &&
                            in.head_dim <= policy::kDecodeAutoMaxHeadDim && !in.kv_lens.empty();
    if (may_change) {
      int64_t tokens = 0;
      for (int64_t len : in.kv_lens) tokens += len;
      tokens *= in.num_kv_heads;
      const auto [lo, hi] = std::minmax_element(in.kv_lens.begin(), in.kv_lens.end());
      const int64_t pairs = static_cast<int64_t>(in.kv_lens.size()) * in.num_kv_heads;
      const int pick =
          policy::decode_auto_ctas_per_sm(tokens, pairs, *lo == *hi && *hi > 0, in.sms);
      if (pick != ctas) {
        const DecodeTCShape s =
            decode_tc_shape(in.head_dim, in.group, in.tc_stages,
                            policy::decode_auto_warps(in.head_dim, pick), pick, in.kv_bytes);
        if (s.smem_bytes <= in.max_smem_bytes) ctas = pick;
      }
    }
  }
  // Warps keep ~8 per SM (0: decode_shape.cuh's default, 4 at head_dim <= 128, 2 above).
  const int warps = in.tc_warps > 0 ? in.tc_warps : policy::decode_auto_warps(in.head_dim, ctas);
  return {ctas,
          DecodeTCTuning{in.tc_stages, warps, ctas == policy::kDecodeDefaultCtasPerSm ? 0 : ctas}};
}

}  // namespace flashkv::ops
