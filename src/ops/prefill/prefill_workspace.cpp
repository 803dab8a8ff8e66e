#include "ops/prefill/prefill_workspace.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "flashkv/error.h"
#include "flashkv/runtime.h"
#include "ops/common/workspace_fit.h"
#include "runtime/driver.h"
#include "tuning/policy.cuh"

namespace flashkv::ops {

// The public header cannot include the policy (include/flashkv never includes kernels/): its
// literal default is checked here.
static_assert(BatchPrefillConfig{}.ctas_per_sm == tuning::Policy::kPrefillCtasPerSm,
              "BatchPrefillConfig::ctas_per_sm is the sm_90 policy's kPrefillCtasPerSm");

PrefillWorkspace::Sizes PrefillWorkspace::sizes(const BatchPrefillConfig& cfg, size_t bytes) {
  const DeviceInfo info = device_info(cfg.device);
  return layout_for(
      cfg, cfg.num_sms_to_use > 0 ? std::min(cfg.num_sms_to_use, info.sm_count) : info.sm_count,
      bytes);
}

PrefillWorkspace::Sizes PrefillWorkspace::layout_for(const BatchPrefillConfig& cfg, int sms,
                                                     size_t bytes) {
  check(cfg.max_batch > 0, "BatchPrefillConfig.max_batch: expected > 0, got ", cfg.max_batch);
  check(cfg.max_qo_tokens > 0, "BatchPrefillConfig.max_qo_tokens: expected > 0, got ",
        cfg.max_qo_tokens);
  check(cfg.num_qo_heads > 0 && cfg.num_qo_heads <= 1024,
        "BatchPrefillConfig.num_qo_heads: expected 1..1024, got ", cfg.num_qo_heads);
  check(is_supported_head_dim(cfg.head_dim),
        "BatchPrefillConfig.head_dim: expected 64, 128 or 256, got ", cfg.head_dim);
  check(cfg.ctas_per_sm >= 1, "BatchPrefillConfig.ctas_per_sm: expected >= 1, got ",
        cfg.ctas_per_sm);
  check(sms > 0, "PrefillWorkspace: expected > 0 SMs, got ", sms);
  Sizes base{};
  base.sms = sms;
  base.max_ctas = base.sms * cfg.ctas_per_sm;
  // The most query tiles any plan can have: over every head count up to the config's and every
  // GQA group it allows (a group that does not divide the tile rows wastes rows, so the worst
  // case is not simply group 1).
  int max_tiles = 0;
  for (int h = 1; h <= cfg.num_qo_heads; ++h) {
    for (int g = 1; g <= std::min(h, scheduler::kMaxPrefillTileRows); ++g) {
      if (h % g != 0) continue;
      max_tiles = std::max(
          max_tiles, scheduler::max_prefill_tiles(cfg.max_batch, cfg.max_qo_tokens, h / g, g, 0));
    }
  }
  base.max_work_items = scheduler::max_prefill_work_items(max_tiles, base.max_ctas);
  // Partial states in rows: a plan with tiles of R rows has partial_rows / R slots. Dynamic
  // splitting uses at most max_split_slots(num_ctas) = 2 x #CTA slots (prefill_scheduler.h), so
  // 2 x #CTA x 128 rows never limit it; a plan's need follows its own tile rows, which follow its
  // query tokens (16-row tiles for a 12-token prefill need an eighth of that).
  const size_t full_rows = static_cast<size_t>(scheduler::max_split_slots(base.max_ctas)) *
                           scheduler::kMaxPrefillTileRows;
  const auto with_rows = [&](size_t rows) {
    Sizes s = base;
    s.partial_rows = rows;
    // Every merge item owns >= 2 slots of >= 16 rows (the smallest tile).
    s.max_merge_items = static_cast<int>(rows / (2 * scheduler::kPrefillTileRows[0]));
    s.layout = scheduler::prefill_plan_layout(s.max_ctas, s.max_work_items, s.max_merge_items);
    s.states = partial_state_region(s.layout.bytes, rows, cfg.head_dim, s.max_merge_items);
    s.total = s.states.end;
    return s;
  };
  return fit_workspace_rows(full_rows, bytes, with_rows);
}

size_t PrefillWorkspace::required_bytes(const BatchPrefillConfig& cfg) {
  return sizes(cfg, SIZE_MAX).full_total;
}

size_t PrefillWorkspace::min_bytes(const BatchPrefillConfig& cfg) {
  return sizes(cfg, SIZE_MAX).min_total;
}

int PrefillWorkspace::slot_capacity(int tile_rows) const {
  return static_cast<int>(
      std::min<size_t>(sizes_.partial_rows / static_cast<size_t>(tile_rows), INT_MAX));
}

PrefillWorkspace::PrefillWorkspace(const BatchPrefillConfig& cfg, void* base, size_t bytes) {
  const Sizes s = sizes(cfg, bytes);
  check(base != nullptr, "workspace: expected device memory, got null");
  check(reinterpret_cast<uintptr_t>(base) % 16 == 0,
        "workspace: expected a 16-byte aligned pointer");
  check(bytes >= s.min_total, "workspace: expected at least ", s.min_total,
        " bytes (min_workspace_bytes(cfg): the plan arrays of this config, with no room to split "
        "KV; ",
        s.full_total, " bytes, workspace_bytes(cfg), never limit splitting), got ", bytes);
  base_ = static_cast<std::byte*>(base);
  sizes_ = s;
  // The merge-arrival counters start at zero; each run leaves them at zero again.
  runtime::ensure_context(cfg.device);
  runtime::check_cu(
      runtime::driver().cuMemsetD32(reinterpret_cast<CUdeviceptr>(base_ + s.states.arrivals_offset),
                                    0, static_cast<size_t>(std::max(s.max_merge_items, 1))),
      "cuMemsetD32(prefill merge counters)");
}

PrefillPlanPtrs PrefillWorkspace::plan_ptrs() const {
  const auto& l = sizes_.layout;
  PrefillPlanPtrs p{};
  p.header = reinterpret_cast<const PrefillPlanHeader*>(base_ + l.header);
  p.cta_work_indptr = reinterpret_cast<const int*>(base_ + l.cta_work_indptr);
  p.work = reinterpret_cast<const PrefillWorkItem*>(base_ + l.work);
  p.partial_lse = reinterpret_cast<float*>(base_ + sizes_.states.lse_offset);
  p.partial_o = reinterpret_cast<float*>(base_ + sizes_.states.o_offset);
  p.merge_arrivals = reinterpret_cast<int*>(base_ + sizes_.states.arrivals_offset);
  return p;
}

}  // namespace flashkv::ops
