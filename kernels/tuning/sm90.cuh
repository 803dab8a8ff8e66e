// flashkv's tuning policy for sm_90 (Hopper): every number that picks a kernel shape, a pipeline
// depth, a grid or a schedule, with what it controls and the measurement behind it. Measured on
// the H200 (132 SMs, sm_90a, driver and NVRTC 13.0: bench/results/info-2026-11-29.json); a file
// name below is under bench/results/ (indexed in its README.md, discussed in NOTES.md). A knob
// with no measurement on record says "not measured" and why it was chosen.
//
// It is read only as tuning::Policy (tuning/policy.cuh, the hub that picks the target's policy):
// the kernels' shape functions (attention/decode/decode_shape.cuh,
// attention/prefill/prefill_shape.cuh) under NVRTC, and host code (the auto decode shape, the
// kernel specs, the schedulers, the workspaces) through the kernels/ include path. Includes
// nothing. One struct, Sm90, so the hub names the policy as one type; another architecture's
// policy is a struct of the same members in its own file. The rules are static constexpr pure
// functions (tests/cpu/test_tuning_policy.cpp); every value is an enumerator, one unnamed enum
// per knob, not a constexpr variable: under NVRTC's -default-device a
// namespace-scope (or static member) constexpr variable becomes a __device__ global of every
// module that includes it, a symbol and a constant-bank entry that would move the kernels'
// symbol indices and constant offsets, while enumerators and constexpr functions emit nothing.
// (So use int{k} where two knobs meet in arithmetic: they are of different enum types.)
// Public headers (include/flashkv) may not include kernels/: where one states a default
// (BatchPrefillConfig::ctas_per_sm, DecodePlanOptions::balance_*), it keeps its literal and a
// static_assert or test says it equals the knob here.
//
// Knobs that live elsewhere, not duplicated here:
// - The Hopper prefill kernel's setmaxnreg split: producer / consumer registers 24 / 240 on the
//   TMA path, 40 / 232 on the cp.async gather path (the gather spills page ids at 24), 56 / 224
//   on the fp8 gather-and-widen path (it spilled at 40), all
//   filling the 168 x 384 registers __launch_bounds__(384, 1) gives; PrefillWsConfig in
//   attention/prefill/prefill_hopper_ws.cuh (left there: another change edits that file).
//   One instantiation per KV path with its own split beat one kernel with a run-time branch and
//   40 / 232 everywhere by 5-10 % on P1 / P2 / P4 (prefill-ab-2026-11-30.log; NOTES "Hopper,
//   warp-specialized", step 5). prefill_core.cpp checks the 168 on the loaded kernel.
// - The CUDA-core decode kernel's query heads per thread (kMaxHeadsPerThread = 4 in
//   attention/decode/decode.cuh's DecodeConfig): four heads per thread left GQA where one was
//   (NOTES "Decode kernels", step 1; no result file kept).
// - The cascade cost model (src/scheduler/cascade_cost.h): a model fitted to
//   cascade-2026-12-02-2b1fc0a.json and checked on cascade-2026-12-02-40f1d18.json, kept with
//   its fit script (bench/cascade_cost_fit.py) and test. Its mirrors of the schedulers' knobs
//   (decode grid, prefill CTAs per SM, shortest chunks) read the knobs here; the fit script's
//   Python copy of them (its `C` dict) does not.
// - Launch widths of the element-wise kernels (merge 256 threads, KV append, RoPE, the cascade's
//   gather and merge): not measured; memory-bound loops whose block size is not a tuning decision
//   of record.
// - Workspace sizing is not a knob: 2 partial-state slots per CTA and #tiles + #CTAs work items
//   are proven bounds of dynamic splitting (decode_scheduler.cpp, prefill_scheduler.cpp); the
//   decode workspace is sized for the largest grid auto picks (kDecodeAutoMaxCtasPerSm).
//
// Defaults that differ between ops (none unified: each would change a kernel or a schedule):
// 1. CTAs per SM: decode picks 1, 2 or 4 by the batch (measured, below); prefill fixes 2 for
//    the mma.sync kernel (what fits its registers; 1 vs 2 not swept) and runs 1 for the wgmma
//    kernel. Open: whether a batch-dependent prefill grid pays (S1's 16-row tiles, A1).
// 2. Bytes in flight: the tensor-core decode kernel keeps 64 KB of K+V per SM in flight
//    (measured); the CUDA-core decode kernel 4 stages of 16 KB at 2 CTAs per SM, i.e. 96 KB
//    (not measured); prefill fills a 112 KB shared-memory budget per CTA (not measured since 2
//    -> 4 stages gained nothing on the first kernel). Open: re-sweep the CUDA-core stages.
// 3. The cost model: decode's alpha is a work item's fixed cost in KV tokens (64, measured);
//    prefill's alpha is per query row (1, a placeholder: not measured). The units differ (an item
//    vs a row), so one number cannot serve both; open: calibrate prefill's on the GPU.
// 4. Shortest chunk: 128 KV tokens in both schedulers; swept for decode only. Open for prefill,
//    whose wgmma kernel also rounds chunks to its 128-token KV tile (split_align).
// 5. The balanced chunk bound and tail balancing are decode-only; the scheduler struct's
//    balance_tail defaults to true (for direct callers and tests) while BatchDecode's default,
//    the policy, is false (measured): the op always passes its own value, so neither changes a
//    plan. Open: whether prefill's chunking would profit from the balanced bound.
// 6. The cascade's prefix pass in CUDA-graph mode pins 64-row query tiles (kCascadeGraphTileRows),
//    the size the cascade runs measured slowest per row on mma.sync (NOTES "Cascade"); open.
#pragma once

namespace flashkv::tuning {

struct Sm90 {
  // ---------------------------------------------------------------------------------------------
  // The GPU (hardware limits of compute capability 9.0, not tuning choices)

  // Shared memory the CTAs of one SM may hold together, as the decode shape has always counted it
  // (compute capability 9.0: 228 KB per SM, of which a block may opt in to 227 KB).
  enum : int { kSmemPerSmBytes = 227 * 1024 };
  // The opt-in dynamic shared memory of one block (cudaDevAttrMaxSharedMemoryPerBlockOptin).
  enum : int { kSmemPerBlockBytes = 227 * 1024 };
  // 32-bit registers per SM.
  enum : int { kRegistersPerSm = 65536 };
  // The SMs every grid number below was measured with (info-2026-11-29.json); a plan sizes its grid
  // from the device it runs on, this is only the cascade model's default.
  enum : int { kH200Sms = 132 };

  // ---------------------------------------------------------------------------------------------
  // Decode, tensor-core kernel (attention/decode/decode_tc.cuh; shape: decode_tc_shape)

  // Bytes of K + V each SM keeps in flight: decode_tc_shape's default pipeline depth is the stages
  // that keep this much ahead over the grid's CTAs on one SM (2 stages at head_dim 128, 3 at 64).
  // One 32 KB tile ahead per CTA at 2 CTAs per SM beat two at head_dim 128 (GQA D1 55.1 -> 56.9 %
  // of the read ceiling, D4 65.7 -> 66.9, MHA D2 76.2 -> 77.8, the others level or up to a point;
  // two runs): a deeper queue at DRAM only lengthens the latency every item's first loads wait
  // behind (decode-shape-sweep-2026-11-29.log; re-swept, defaults stay best:
  // decode-shape-sweep-2026-11-30-9237ae0.log; the load path alone: 3 stages slightly worse than
  // 2, read-floor-pipe-2026-11-30.log).
  enum : int { kDecodeBytesInFlightPerSm = 64 * 1024 };

  // The grid's CTAs per SM where nothing else picks (auto's default shape, a CUDA graph,
  // fixed_split_size): 2 CTAs of 4 warps. ~8 warps per SM are needed (1 CTA of 4
  // warps: 51 % of the read ceiling on GQA D1); 2 x 4 wins on unequal lengths (GQA D2 / D3 45.7 /
  // 53.4 % against 36.3 / 48.1 for 1 x 8 and 45.2 / 49.7 for 4 x 2; MHA D2 77.8 against 65.8 /
  // 69.2) (decode-shape-sweep-2026-11-29.log).
  enum : int { kDecodeDefaultCtasPerSm = 2 };

  // Warps per CTA by default: 4 at head_dim <= 128 (the 2 x 4 shape above); 2 above, where the
  // tensor-core kernel never runs by default (decode_tc_supported is false at head_dim 256): not
  // measured, it only sizes explicitly asked-for shapes.
  static constexpr int decode_tc_default_warps(int head_dim) { return head_dim <= 128 ? 4 : 2; }

  // Pipeline stages by default: the tiles ahead that keep kDecodeBytesInFlightPerSm in flight over
  // `ctas` CTAs of stage_kv_bytes (K + V of one tile) each, plus the one being computed; 2 to 8
  // (the depths the kernel is built for: decode_tc_shape_valid).
  static constexpr int decode_tc_default_stages(int stage_kv_bytes, int ctas) {
    const int ahead =
        (kDecodeBytesInFlightPerSm + ctas * stage_kv_bytes - 1) / (ctas * stage_kv_bytes);
    return ahead < 1 ? 2 : ahead > 7 ? 8 : ahead + 1;
  }

  // __launch_bounds__'s minimum CTAs per SM is the grid's CTAs per SM (so ptxas keeps registers for
  // all of them: without the bound it capped the kernel at 168 registers and spilled 20 bytes, with
  // (kThreads, 2) it took 210 and D1-D6 were unchanged, decode-2026-11-29-dc474c4.{json,log}),
  // capped by what fits shared memory and by a floor of this many registers per thread: not
  // measured (a floor so an asked-for dense shape never squeezes the ~210-register kernel below
  // it).
  enum : int { kDecodeMinRegistersPerThread = 128 };

  // The tensor-core kernel takes a shape whose output accumulators (row tiles x head_dim / 8
  // n-tiles x 4 f32 per thread) fit this many registers; above, ptxas spilled (head_dim 256: 255
  // registers and a 360-byte stack; ptxas -v, no result file), so auto runs the CUDA-core kernel:
  // head_dim 64 with groups <= 32, head_dim 128 with groups <= 16.
  enum : int { kDecodeTCMaxAccumulatorRegs = 64 };

  // ---------------------------------------------------------------------------------------------
  // Decode, auto shape (BatchDecodeConfig::ctas_per_sm = 0; src/ops/decode/decode_shape_choice.cpp)
  // f16, % of the read ceiling, one run (decode-shape-sweep-2026-11-29.log):
  //
  //                 1 x 8 warps   2 x 4 warps   4 x 2 warps
  //   GQA D1 16x1K     61.0          56.9          53.9     equal pairs, no more than SMs
  //   GQA D4 1x32K     69.6          66.9          58.9     one long request, split
  //   GQA D2/D3     36.3 / 48.1   45.7 / 53.4   45.2 / 49.7  unequal lengths
  //   GQA D5/D6     89.5 / 86.2   93.0 / 93.0   95.5 / 95.9  plenty of work per CTA
  //   MHA D1/D3/D4  73 / 70 / 89  83 / 79 / 90  88 / 81 / 91 >= 993 tokens per small CTA
  //   MHA D2           65.8          77.8          69.2     745 tokens per small CTA

  // 4 CTAs of 2 warps per SM where every small CTA gets at least kDecodeSmallCtaMinTokens KV tokens
  // (summed over KV heads): one CTA's item ramp hides behind three others. The threshold lies
  // between the workloads that won (MHA D1, 993 tokens per small CTA) and lost (MHA D2, 745).
  enum : int { kDecodeSmallCtasPerSm = 4 };
  enum : int { kDecodeSmallCtaWarps = 2 };
  enum : long long { kDecodeSmallCtaMinTokens = 896 };
  // 1 CTA of 8 warps per SM where the batch has no more (request, KV head) pairs than SMs, all
  // equally long: each CTA streams a whole pair (no merge) or an equal share of one long request
  // (half the partial states of 2 CTAs per SM): GQA D1 / D4 above.
  enum : int { kDecodeOneCtaPerSm = 1 };
  enum : int { kDecodeOneCtaWarps = 8 };
  // Auto changes the shape only at head_dim <= 128 (the tensor-core kernel's; head_dim 256 runs the
  // CUDA-core kernel, whose grid stays kDecodeCudaCoreCtasPerSm).
  enum : int { kDecodeAutoMaxHeadDim = 128 };
  // The largest grid auto picks: the decode workspace is sized for it (DecodeWorkspace).
  enum : int {
    kDecodeAutoMaxCtasPerSm = int{kDecodeSmallCtasPerSm} > int{kDecodeDefaultCtasPerSm}
                                  ? int{kDecodeSmallCtasPerSm}
                                  : int{kDecodeDefaultCtasPerSm}
  };

  // Auto's CTAs per SM for a batch of `kv_tokens` KV tokens (summed over requests and KV heads) in
  // `pairs` (request, KV head) pairs over `sms` SMs; equal_lengths: every request has the same
  // length > 0. The caller keeps the default where the GPU's shared memory does not take the shape.
  static constexpr int decode_auto_ctas_per_sm(long long kv_tokens, long long pairs,
                                               bool equal_lengths, int sms) {
    // Equal pairs that fill at least 7/8 of the SMs, one each: every CTA streams one whole pair,
    // nothing to split or merge, however long the pairs are. 16 x 4096 GQA (128 pairs, B4's bytes):
    // 88.9 % of the read ceiling against 83.4 % with 4 small CTAs (b4-decode-sweep-2026-12-02.log).
    if (equal_lengths && pairs <= sms && pairs * 8 >= 7LL * sms) return kDecodeOneCtaPerSm;
    if (kv_tokens >= kDecodeSmallCtaMinTokens * sms * kDecodeSmallCtasPerSm)
      return kDecodeSmallCtasPerSm;
    if (equal_lengths && pairs <= sms) return kDecodeOneCtaPerSm;
    return kDecodeDefaultCtasPerSm;
  }

  // Warps per CTA for a grid of `ctas` per SM, keeping ~8 per SM: 8 for one CTA, 2 for 3 or more;
  // 0 (decode_tc_default_warps) for 2 CTAs and above kDecodeAutoMaxHeadDim.
  static constexpr int decode_auto_warps(int head_dim, int ctas) {
    return head_dim > kDecodeAutoMaxHeadDim ? 0
           : ctas == kDecodeOneCtaPerSm     ? kDecodeOneCtaWarps
           : ctas >= 3                      ? kDecodeSmallCtaWarps
                                            : 0;
  }

  // ---------------------------------------------------------------------------------------------
  // Decode, CUDA-core kernel (attention/decode/decode.cuh; shape: decode_cuda_core_shape), for
  // head_dim 256 and the groups the tensor-core kernel does not take. Its forced numbers:
  // decode-cudacores-2026-11-30-61b71e8.json (D1-D6: GQA 33.7-69.3 %, MHA 78.7-95.4 % of the read
  // ceiling).

  // 128 threads, 4 stages of 8 KB of K (and 8 KB of V) each, 2 CTAs per SM: not measured (sized to
  // keep ~96 KB of K+V in flight per SM, enough to cover HBM latency; never swept against the
  // tensor-core kernel's 64 KB rule, open question 2 above).
  enum : int { kDecodeCudaCoreThreads = 128 };
  enum : int { kDecodeCudaCoreStages = 4 };
  enum : int { kDecodeCudaCoreCtasPerSm = 2 };
  // KV tokens per stage: 4096 / head_dim for 16-bit KV (8 KB of K), twice that for 8-bit.
  static constexpr int decode_cuda_core_tile(int head_dim, int kv_bytes) {
    return 4096 / head_dim * (2 / kv_bytes);
  }

  // ---------------------------------------------------------------------------------------------
  // Decode scheduler (src/scheduler/decode_scheduler.h: CostModel, DecodeScheduleOptions)

  // cost(l_q, l_kv) = alpha * l_q + beta * l_kv, beta the unit (one KV token streamed), alpha a
  // work item's fixed cost in tokens. The timelines put an item's fixed cost (~4 us) at ~120 tokens
  // of one CTA's streaming; alpha in {16, 64, 128, 256} moved no workload beyond noise
  // (decode-alpha-sweep-2026-11-29-1e04a8f.{json,log}), nor did alpha 32-256 x shortest chunk
  // 64-256 on D1-D4, all within +-2 % (decode-sweep-2026-11-29-ac8b2fa.{json,log}): with the
  // balanced bound the chunking sets the makespan and alpha only breaks near-ties. 64 stays. (Whole
  // tokens; CostModel holds them as doubles.)
  enum : int { kDecodeWorkItemCostTokens = 64 };
  enum : int { kDecodeTokenCost = 1 };
  // Dynamic splitting never cuts chunks shorter than this: swept 64-256 with alpha, within +-2 %
  // (decode-sweep-2026-11-29-ac8b2fa.{json,log}; at D1 the bound was 496 > any shortest chunk).
  enum : int { kDecodeMinChunkTokens = 128 };
  // The balanced chunk bound: when some CTAs would run two chunks and none more, also try up to
  // kDecodeBalanceCandidates larger bounds and keep the smallest greedy makespan. On vs off: GQA D1
  // 35.4 -> 40.8 %, D2 30.6 -> 37.4, D3 37.9 -> 43.9, MHA D4 58.7 -> 86.3, the rest within noise
  // (decode-balance-ab-2026-11-29-1e04a8f.{json,log}); measured with 4 candidates, other counts
  // not measured.
  enum : bool { kDecodeBalanceChunkBound = true };
  enum : int { kDecodeBalanceCandidates = 4 };
  // Tail balancing (McNaughton wrap of the last partial round): off. It made the schedules flatter
  // but lost on the GPU: D5 92.8 -> 90.9 %, D6 92.6 -> 92.5, plan() +3-9 us
  // (decode-tail-ab-2026-11-29-d06d5bc.log). DecodePlanOptions::balance_tail states it.
  enum : bool { kDecodeBalanceTail = false };

  // ---------------------------------------------------------------------------------------------
  // Prefill, mma.sync kernel (attention/prefill/prefill.cuh; shape: prefill_shape). The tuning
  // steps' runs were superseded (NOTES "mma.sync" lists them); the last state on file:
  // prefill-2026-11-29-92208ea.{json,md}.

  // Persistent CTAs per SM (BatchPrefillConfig::ctas_per_sm; fewer where they do not fit, e.g. 1
  // for the wgmma kernel): as many 4-warp CTAs as fit at the kernel's 255 registers per thread
  // (ncu-prefill-2026-11-29-e3957d3.txt: 2 CTAs per SM, 2 warps per scheduler, latency-bound).
  // Every mma.sync measurement ran 2 (P4 263-267 TFLOP/s with two row tiles per warp; a 64-row
  // default tile, two 4-warp CTAs, 237: NOTES "mma.sync" and "Tried and dropped"); 1 vs 2 was not
  // swept.
  enum : int { kPrefillCtasPerSm = 2 };

  // 16-row MMA tiles per warp: two in the 128-row tile at head_dim <= 128, so each K/V fragment
  // read from shared memory feeds two MMAs (one row tile per warp pulled ~300 KB of ldmatrix per
  // 64-token tile and SM, ~2300 cycles against ~1000 of tensor work): P4 230 -> 263-267 TFLOP/s
  // (NOTES "mma.sync"; last state prefill-2026-11-29-92208ea.{json,md}). head_dim 256 keeps one:
  // 128 output accumulators per row tile already.
  static constexpr int prefill_row_tiles_per_warp(int head_dim, int rows) {
    return (rows == 128 && head_dim <= 128) ? 2 : 1;
  }

  // Warps of a 16- or 32-row tile (short queries, e.g. S1): 4, the warps of a row block splitting
  // each KV tile, so the CTA is not mostly idle. Not measured (chosen to match the 4-warp CTA of
  // the 64- and 128-row tiles).
  enum : int { kPrefillSmallTileWarps = 4 };
  static constexpr int prefill_warps_kv(int rows, int warps_q) {
    return rows >= 64 ? 1 : kPrefillSmallTileWarps / warps_q;
  }

  // KV tokens per stage: 64; 32 at head_dim 256 where a warp holds a whole tile (its S fragment
  // next to 128 output accumulators). 32-token tiles at head_dim 128 gave 244 TFLOP/s against
  // 263-267 (NOTES "Tried and dropped"; no result file kept).
  static constexpr int prefill_kv_tile(int head_dim, int warps_kv) {
    return (head_dim <= 128 || warps_kv == kPrefillSmallTileWarps) ? 64 : 32;
  }

  // Pipeline depth: as many KV stages as fit a shared-memory budget of two CTAs per SM (<= 112 KB
  // each): 4, 3, else 2; a CTA of 8 warps (head_dim 256, 128 rows) runs alone on its SM (registers)
  // and takes 4. Not measured since the first kernel, where 2 -> 4 stages left P4 at 165 TFLOP/s
  // (it was not load-latency bound; NOTES "mma.sync", no result file kept).
  enum : int { kPrefillSmemBudgetPerCta = 112 * 1024 };
  static constexpr int prefill_stages(int q_bytes, int stage_bytes, int threads) {
    return q_bytes + 4 * 2 * stage_bytes <= kPrefillSmemBudgetPerCta   ? 4
           : q_bytes + 3 * 2 * stage_bytes <= kPrefillSmemBudgetPerCta ? 3
           : threads >= 256                                            ? 4
                                                                       : 2;
  }

  // Query-tile rows (scheduler::choose_query_tile_rows, the paper's heuristic: the smallest of 16,
  // 32, 64, 128 rows that holds the average request): its 128 is right for P1-P5, forced 64-row
  // tiles gave 24.0 / 22.1 / 28.2 / 30.6 / 31.7 % of the GEMM rate against 29.7 / 26.3 / 35.3 /
  // 39.5 / 40.9, 32-row 15.6-23.5 (mma.sync, prefill-tile-rows-2026-11-29-e3957d3.log). The sizes
  // are the instantiated kernels' (prefill_scheduler.h kPrefillTileRows), not a knob.

  // ---------------------------------------------------------------------------------------------
  // Prefill, Hopper wgmma kernel (attention/prefill/prefill_hopper_ws.cuh; shape:
  // prefill_hopper_shape): one CTA per SM (its accumulators take most of the register file), a
  // 128-row query tile in two warpgroups; P1 / P4 GQA f16 in % of the GEMM rate
  // (prefill-wgmma-steps-2026-11-29.log, +-1.5 points run to run).

  // (The op takes min(kPrefillCtasPerSm, what fits) = 1 at run time; the cascade model states it.)
  enum : int { kPrefillHopperCtasPerSm = 1 };
  // KV tokens per stage: 128 at head_dim <= 128 (every tile costs the same row statistics, barriers
  // and O rescale whatever its length: 64-token tiles 33.3 / 48.6, then 128-token tiles with 3
  // stages, together with a skipped O rescale and constant descriptor offsets, 34.9 / 50.4;
  // prefill_shape.cuh recorded 64-token tiles ~2 points of P4 behind); 64 at head_dim 256 (S of a
  // tile and its P next to 128 O accumulators; ptxas -v as at 32 tokens). 64 against the first
  // kernel's 32, P1 / P4 / P5 GQA f16 on an H100, two alternations: 815-835 / 2365-2415 /
  // 37421-37643 us against 1080-1114 / 3063-3065 / 47249-47278, i.e. 1.26-1.33x
  // (prefill-ab-barriers-tiles-exp2-2026-12-05-h100.log).
  static constexpr int prefill_hopper_kv_tile(int head_dim) { return head_dim <= 128 ? 128 : 64; }
  // V stages (K has one fewer): 3 at head_dim 128 and 256, where shared memory holds no more (d128:
  // two query buffers, 2 x 32 + 5 x 32 KB; d256: one, 64 + 5 x 32 KB; measured with tile 128 above
  // and in the d256 A/B); 4 at 64: not measured (chosen without a sweep; it fits).
  static constexpr int prefill_hopper_stages(int head_dim) { return head_dim == 64 ? 4 : 3; }
  // Query-tile buffers: 2 where they fit (not at 256), so the next work item's loads start while
  // this one computes; K one stage fewer than V made room for the second: 34.8 / 51.0 against 34.9
  // / 50.4 (level, kept). (An earlier form, loads running ahead across work items with two query
  // buffers, gave 31.4 / 50.1: no gain, NOTES "Tried and dropped", same log.)
  static constexpr int prefill_hopper_q_buffers(int head_dim) { return head_dim <= 128 ? 2 : 1; }
  // fp8 KV on the Hopper kernel: the producer gathers fp8 tiles into staging slots and widens them
  // into the 16-bit stages the consumers read, so the staging needs room too. At head_dim 128 the
  // 128-token tile's stages leave little: 64-token tiles there (2 x 32 + 5 x 16 + 4 x 16 KB). 128
  // tokens with 2 stages and 2 staging slots (2 x 32 + 3 x 32 + 2 x 32 KB) ran e4m3 P4 GQA at 1403
  // us against 64 tokens' 1311 (f16: 1050; prefill-fp8-tile-ab-2026-12-02.log). Staging slots: as
  // many as fit (4, 3 at head_dim 256), so the gather keeps slots - 1 tiles in flight: with 2 (one
  // in flight) e4m3 P4 GQA ran 1436 us against 4's 1387-1400 (prefill-fp8-2026-12-02.log,
  // prefill-fp8-4slots-2026-12-02-dd8cd00.log). The stages: the 16-bit kernel's.
  // At head_dim 256 the 16-bit kernel's 64-token tiles leave no room for staging: 32 tokens, 4
  // stages, 3 slots there (64 + 7 x 16 + 3 x 16 KB; not measured against other splits).
  static constexpr int prefill_hopper_fp8_kv_tile(int head_dim) {
    return head_dim == 64 ? prefill_hopper_kv_tile(head_dim) : head_dim == 128 ? 64 : 32;
  }
  static constexpr int prefill_hopper_fp8_staging_slots(int head_dim) {
    return head_dim == 256 ? 3 : 4;
  }
  static constexpr int prefill_hopper_fp8_stages(int head_dim) {
    return head_dim == 256 ? 4 : prefill_hopper_stages(head_dim);
  }

  // ---------------------------------------------------------------------------------------------
  // Prefill scheduler (src/scheduler/prefill_scheduler.h: PrefillCostModel, PrefillScheduleOptions)

  // cost(chunk) = alpha * rows + beta * kv_tokens. Not measured: a placeholder saying a query row's
  // fixed work (Q load, O store) is about one KV token's (open question 3 above). (Whole units;
  // PrefillCostModel holds them as doubles.)
  enum : int { kPrefillRowCost = 1 };
  enum : int { kPrefillTokenCost = 1 };
  // PrefillItemOrder::kAuto takes the head-major order where the batch's KV over all heads exceeds
  // kPrefillHeadMajorKvBytes (the H200's L2 is 50 MB) and some request's KV per head reaches
  // kPrefillHeadMajorHeadKvBytes (a long prompt, whose tiles of one head all read its KV). ncu of
  // P5 MHA (32 heads x 32k, 512 MB of KV) request-major: L2 hit rate 41 %, DRAM 2.5 TB/s; GQA (8
  // heads) 84 %, 0.36 TB/s (ncu-p5-2026-12-02-df36a54.txt). Head-major against request-major, f16
  // (prefill-order-{auto,request}-2026-12-02-c702402.log): P5 MHA 17432 vs 20445 us, P5 GQA 17477
  // vs 17965, P4 MHA 1092 vs 1116; P3 MHA (longest request ~5k tokens, 2.5 MB per head) 842 vs 825,
  // hence 4 MB per head (8k tokens at head_dim 128): P4 and P5 head-major, P1-P3 not.
  enum : long long { kPrefillHeadMajorKvBytes = 64ll << 20 };
  enum : long long { kPrefillHeadMajorHeadKvBytes = 4ll << 20 };
  // Dynamic splitting never cuts chunks shorter than this. Not measured for prefill (decode's
  // value; open question 4 above).
  enum : int { kPrefillMinChunkTokens = 128 };

  // ---------------------------------------------------------------------------------------------
  // Cascade (src/ops/cascade/multi_level_cascade.cpp)

  // Query-tile rows of the shared-prefix passes when a CUDA graph will be captured (a captured
  // graph holds its kernel, so the tile cannot follow the batch). Not measured (open question 6).
  enum : int { kCascadeGraphTileRows = 64 };
};

}  // namespace flashkv::tuning
