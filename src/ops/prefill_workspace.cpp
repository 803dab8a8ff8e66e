#include "ops/prefill_workspace.h"

#include <algorithm>

#include "flashkv/error.h"
#include "flashkv/runtime.h"
#include "runtime/driver.h"

namespace flashkv::ops {
namespace {
size_t align16(size_t x) { return (x + 15) / 16 * 16; }
}  // namespace

PrefillWorkspace::Sizes PrefillWorkspace::sizes(const BatchPrefillConfig& cfg) {
  check(cfg.max_batch > 0, "BatchPrefillConfig.max_batch: expected > 0, got ", cfg.max_batch);
  check(cfg.max_qo_tokens > 0, "BatchPrefillConfig.max_qo_tokens: expected > 0, got ",
        cfg.max_qo_tokens);
  check(cfg.num_qo_heads > 0 && cfg.num_qo_heads <= 1024,
        "BatchPrefillConfig.num_qo_heads: expected 1..1024, got ", cfg.num_qo_heads);
  check(is_supported_head_dim(cfg.head_dim),
        "BatchPrefillConfig.head_dim: expected 64, 128 or 256, got ", cfg.head_dim);
  check(cfg.ctas_per_sm >= 1, "BatchPrefillConfig.ctas_per_sm: expected >= 1, got ",
        cfg.ctas_per_sm);
  const DeviceInfo info = device_info(cfg.device);
  Sizes s{};
  s.sms = cfg.num_sms_to_use > 0 ? std::min(cfg.num_sms_to_use, info.sm_count) : info.sm_count;
  s.max_ctas = s.sms * cfg.ctas_per_sm;
  // The most query tiles any plan can have: over every head count up to the config's and every
  // GQA group it allows (a group that does not divide the tile rows wastes rows, so the worst
  // case is not simply group 1).
  int max_tiles = 0;
  for (int h = 1; h <= cfg.num_qo_heads; ++h) {
    for (int g = 1; g <= std::min(h, scheduler::kMaxPrefillTileRows); ++g) {
      if (h % g != 0) continue;
      max_tiles = std::max(max_tiles, scheduler::max_prefill_tiles(cfg.max_batch, cfg.max_qo_tokens,
                                                                   h / g, g, 0));
    }
  }
  s.max_work_items = scheduler::max_prefill_work_items(max_tiles, s.max_ctas);
  s.max_slots = scheduler::max_prefill_slots(s.max_ctas);
  s.max_merge_items = scheduler::max_prefill_merge_items(s.max_slots);
  s.layout = scheduler::prefill_plan_layout(s.max_ctas, s.max_work_items, s.max_merge_items);
  const size_t rows = static_cast<size_t>(s.max_slots) * scheduler::kMaxPrefillTileRows;
  s.lse_offset = align16(s.layout.bytes);
  s.o_offset = align16(s.lse_offset + rows * sizeof(float));
  s.arrivals_offset = align16(s.o_offset + rows * cfg.head_dim * sizeof(float));
  s.total = s.arrivals_offset + static_cast<size_t>(std::max(s.max_merge_items, 1)) * sizeof(int);
  return s;
}

size_t PrefillWorkspace::required_bytes(const BatchPrefillConfig& cfg) { return sizes(cfg).total; }

PrefillWorkspace::PrefillWorkspace(const BatchPrefillConfig& cfg, void* base, size_t bytes) {
  const Sizes s = sizes(cfg);
  check(base != nullptr, "workspace: expected device memory, got null");
  check(reinterpret_cast<uintptr_t>(base) % 16 == 0,
        "workspace: expected a 16-byte aligned pointer");
  check(bytes >= s.total, "workspace: expected at least ", s.total,
        " bytes (workspace_bytes(cfg)), got ", bytes);
  base_ = static_cast<std::byte*>(base);
  sizes_ = s;
  // The merge-arrival counters start at zero; each run leaves them at zero again.
  runtime::ensure_context(cfg.device);
  runtime::check_cu(
      runtime::driver().cuMemsetD32(reinterpret_cast<CUdeviceptr>(base_ + s.arrivals_offset), 0,
                                    static_cast<size_t>(std::max(s.max_merge_items, 1))),
      "cuMemsetD32(prefill merge counters)");
}

PrefillPlanPtrs PrefillWorkspace::plan_ptrs() const {
  const auto& l = sizes_.layout;
  PrefillPlanPtrs p{};
  p.header = reinterpret_cast<const PrefillPlanHeader*>(base_ + l.header);
  p.cta_work_indptr = reinterpret_cast<const int*>(base_ + l.cta_work_indptr);
  p.work = reinterpret_cast<const PrefillWorkItem*>(base_ + l.work);
  p.partial_lse = reinterpret_cast<float*>(base_ + sizes_.lse_offset);
  p.partial_o = reinterpret_cast<float*>(base_ + sizes_.o_offset);
  p.merge_arrivals = reinterpret_cast<int*>(base_ + sizes_.arrivals_offset);
  return p;
}

}  // namespace flashkv::ops
