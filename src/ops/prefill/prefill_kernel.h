// The prefill kernel a plan uses: its key (attention/prefill/prefill_key.h: name expressions,
// cache id, launch geometry) and the query-tile heuristic that picks the key's rows.
#pragma once

#include <cstdint>
#include <span>

#include "attention/prefill/prefill_key.h"
#include "ops/jit/kernel_specs.h"

namespace flashkv::ops {

// The query tile plan() uses when PrefillPlanOptions.tile_rows is 0: the paper's heuristic
// (scheduler::choose_query_tile_rows). Kept as the op's own entry point so a measured
// per-GPU adjustment has one place to live (a 64-row cap was tried and measured slower once the
// 128-row tile gave each warp two row tiles: P4 237 vs 263 TFLOP/s).
int default_prefill_tile_rows(std::span<const int64_t> qo_lens, int group);

}  // namespace flashkv::ops
