// The decode kernels' geometry: for the tensor-core kernel as a function of (head_dim, GQA group,
// pipeline stages, warps), for the CUDA-core kernel of (head_dim, KV element size). Constexpr
// functions read by the kernel configs (decode_tc.cuh, decode.cuh) and by the host launch (through
// decode_key.h), so the two can never disagree. Its tuning knobs (bytes in flight, default warps,
// stages and CTAs, the CUDA-core tile) come from the sm_90 policy, tuning/sm90.cuh, which says
// what each was measured to do; this file includes nothing else.
//
// Why stages and warps are parameters: decode streams the KV cache, so what matters is how many
// bytes each SM keeps in flight (warps x 16 tokens x (stages - 1) tiles ahead) against how many
// CTAs share the SM and how far a CTA's work items are split. Two shallow CTAs per SM and one
// deep CTA per SM keep the same bytes in flight but split short requests differently; the
// benchmark sweeps them (flashkv bench decode --decode-stages --decode-warps).
#pragma once

#include "attention/decode/decode_cuda_core_shape.cuh"
#include "tuning/policy.cuh"

namespace flashkv {

struct DecodeTCShape {
  int warps;  // a warp takes 16 tokens of every KV tile
  int threads;
  int tile;        // KV tokens per pipeline stage (16 * warps)
  int stages;      // pipeline depth: stages - 1 tiles in flight while one is computed
  int row_tiles;   // 16-row MMA tiles of query rows (the GQA group, padded)
  int smem_bytes;  // Q, then `stages` K tiles and `stages` V tiles (16-bit elements)
  int min_ctas;    // __launch_bounds__'s minimum CTAs per SM (caps registers per thread)
};

// Bytes of K + V each SM keeps in flight by default: the policy's knob (tuning/sm90.cuh says what
// it was measured to do), under the name the decode kernels have always compiled. A namespace-scope
// constexpr variable is a __device__ global of every NVRTC module that includes this file (the
// policy's enumerators are not): keep it, or every decode kernel's symbol indices move.
constexpr int kDecodeBytesInFlightPerSm = tuning::Policy::kDecodeBytesInFlightPerSm;

// stages, warps: 0 picks the default (tuning::Policy::decode_tc_default_warps: 4 at head_dim <=
// 128, else 2; decode_tc_default_stages: so that the grid's CTAs on one SM keep
// kDecodeBytesInFlightPerSm in flight, at least 2). ctas: the CTAs per SM the grid is sized for
// (0: kDecodeDefaultCtasPerSm, 2); the kernel is built for as many of them as fit one SM.
// kv_bytes: the KV element size (2, or 1 for fp8: half the bytes per stage, so the default depth
// doubles and the bytes in flight stay the same). Q is always 16-bit. The shared memory is Q plus
// the larger of the pipeline and the cross-warp merge's staging (which the fp8 pipeline can be
// smaller than).
constexpr DecodeTCShape decode_tc_shape(int head_dim, int group, int stages = 0, int warps = 0,
                                        int ctas = 0, int kv_bytes = 2) {
  DecodeTCShape s{};
  const int want = ctas > 0 ? ctas : tuning::Policy::kDecodeDefaultCtasPerSm;
  s.warps = warps > 0 ? warps : tuning::Policy::decode_tc_default_warps(head_dim);
  s.threads = 32 * s.warps;
  s.tile = 16 * s.warps;
  const int stage_kv_bytes = 2 * s.tile * head_dim * kv_bytes;
  s.stages = stages > 0 ? stages : tuning::Policy::decode_tc_default_stages(stage_kv_bytes, want);
  s.row_tiles = (group + 15) / 16;
  const int pipeline = s.stages * stage_kv_bytes;
  const int merge = s.warps * 16 * s.row_tiles * (head_dim + 4 + 2) * 4;
  s.smem_bytes = s.row_tiles * 16 * head_dim * 2 + (pipeline > merge ? pipeline : merge);
  // As many of the grid's CTAs per SM as their shared memory (227 KB per SM) allows, and no more
  // than leave kDecodeMinRegistersPerThread (128) registers per thread (65536 per SM).
  const int fit_smem = tuning::Policy::kSmemPerSmBytes / s.smem_bytes;
  const int fit_regs = int{tuning::Policy::kRegistersPerSm} /
                       tuning::Policy::kDecodeMinRegistersPerThread / s.threads;
  s.min_ctas = want < fit_smem ? want : fit_smem;
  s.min_ctas = s.min_ctas < fit_regs ? s.min_ctas : fit_regs;
  s.min_ctas = s.min_ctas > 1 ? s.min_ctas : 1;
  return s;
}

// Whether the tensor-core kernel takes this shape: its output accumulators (row tiles x
// head_dim / 8 n-tiles x 4 f32 per thread) must stay within kDecodeTCMaxAccumulatorRegs (64)
// registers; more spilled to local memory (ptxas: head_dim 256 used 255 registers and a 360-byte
// stack), so larger shapes use the CUDA-core kernel.
constexpr bool decode_tc_supported(int head_dim, int group) {
  return (group + 15) / 16 * (head_dim / 8) * 4 <= tuning::Policy::kDecodeTCMaxAccumulatorRegs;
}

// Stages and warps a caller may ask for (0: the default).
constexpr bool decode_tc_shape_valid(int stages, int warps) {
  return (stages == 0 || (stages >= 2 && stages <= 8)) &&
         (warps == 0 || warps == 2 || warps == 4 || warps == 8);
}

}  // namespace flashkv
