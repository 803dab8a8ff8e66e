#include "ops/decode/decode_workspace.h"

#include <algorithm>
#include <cstdint>

#include "flashkv/error.h"
#include "flashkv/runtime.h"
#include "ops/common/workspace_fit.h"
#include "runtime/driver.h"

namespace flashkv::ops {
DecodeWorkspace::Sizes DecodeWorkspace::sizes(const BatchDecodeConfig& cfg, size_t bytes) {
  check(cfg.num_sms_to_use >= 0,
        "BatchDecodeConfig.num_sms_to_use: expected >= 0 (0: all SMs), got ", cfg.num_sms_to_use);
  const DeviceInfo info = device_info(cfg.device);
  const int sms =
      cfg.num_sms_to_use > 0 ? std::min(cfg.num_sms_to_use, info.sm_count) : info.sm_count;
  return layout_for(cfg, sms, bytes);
}

DecodeWorkspace::Sizes DecodeWorkspace::layout_for(const BatchDecodeConfig& cfg, int sms,
                                                   size_t bytes) {
  check(cfg.ctas_per_sm >= 0, "BatchDecodeConfig.ctas_per_sm: expected >= 0 (0: auto), got ",
        cfg.ctas_per_sm);
  check(cfg.max_batch > 0, "BatchDecodeConfig.max_batch: expected > 0, got ", cfg.max_batch);
  check(cfg.num_qo_heads > 0, "BatchDecodeConfig.num_qo_heads: expected > 0, got ",
        cfg.num_qo_heads);
  check(is_supported_head_dim(cfg.head_dim),
        "BatchDecodeConfig.head_dim: expected 64, 128 or 256, got ", cfg.head_dim);
  // Work items are indexed with int: keep every count well inside it.
  check(int64_t{cfg.max_batch} * cfg.num_qo_heads <= (int64_t{1} << 28),
        "BatchDecodeConfig: max_batch * num_qo_heads = ", int64_t{cfg.max_batch} * cfg.num_qo_heads,
        " is too large (at most 2^28)");
  check(sms > 0, "DecodeWorkspace: expected > 0 SMs, got ", sms);
  const int num_ctas = sms * (cfg.ctas_per_sm > 0 ? cfg.ctas_per_sm : kAutoCtasPerSm);
  // Partial-state rows: the bound of dynamic splitting (2 slots per CTA; docs/design.md
  // "Workspace"), or, where the config sizes for fixed_split_size, one per chunk a batch can be cut
  // into: a request of l tokens gives ceil(l / fs) <= l / fs + 1 chunks per KV head, so a batch
  // <= T / fs + max_batch.
  size_t full_rows = 2ull * num_ctas * cfg.num_qo_heads;
  check((cfg.max_kv_tokens > 0) == (cfg.min_fixed_split_size > 0),
        "BatchDecodeConfig.max_kv_tokens / min_fixed_split_size: expected both > 0 (sized for "
        "fixed_split_size) or both 0, got ",
        cfg.max_kv_tokens, " and ", cfg.min_fixed_split_size);
  check(cfg.max_kv_tokens >= 0 && cfg.min_fixed_split_size >= 0,
        "BatchDecodeConfig.max_kv_tokens / min_fixed_split_size: expected >= 0");
  if (cfg.max_kv_tokens > 0) {
    const uint64_t chunks =
        (static_cast<uint64_t>(cfg.max_kv_tokens) + cfg.min_fixed_split_size - 1) /
            static_cast<uint64_t>(cfg.min_fixed_split_size) +
        static_cast<uint64_t>(cfg.max_batch);
    // Work items and slots are indexed with int (max_work_items adds max_batch * num_qo_heads).
    check(chunks <= (uint64_t{1} << 28) / static_cast<uint64_t>(cfg.num_qo_heads),
          "BatchDecodeConfig: ceil(max_kv_tokens / min_fixed_split_size) + max_batch = ", chunks,
          " chunks of ", cfg.num_qo_heads,
          " heads is too many partial states (at most 2^28 "
          "rows); use a larger min_fixed_split_size");
    full_rows = std::max<size_t>(full_rows, chunks * cfg.num_qo_heads);
  }
  // The layout for `rows` partial-state rows.
  const auto with_rows = [&](size_t rows) {
    Sizes s{};
    s.sms = sms;
    s.num_ctas = num_ctas;
    s.partial_rows = rows;
    // Work items: one per unsplit tile plus one per partial slot (group 1 is the worst case).
    s.max_work_items = cfg.max_batch * cfg.num_qo_heads + static_cast<int>(rows);
    s.max_merge_items = static_cast<int>(rows / 2);
    s.layout = scheduler::decode_plan_layout(s.num_ctas, s.max_work_items, s.max_merge_items);
    s.states = partial_state_region(s.layout.bytes, rows, cfg.head_dim, s.max_merge_items);
    s.total = s.states.end;
    return s;
  };
  return fit_workspace_rows(full_rows, bytes, with_rows);
}

size_t DecodeWorkspace::required_bytes(const BatchDecodeConfig& cfg) {
  return sizes(cfg, SIZE_MAX).full_total;
}

size_t DecodeWorkspace::min_bytes(const BatchDecodeConfig& cfg) {
  return sizes(cfg, SIZE_MAX).min_total;
}

DecodeWorkspace::DecodeWorkspace(const BatchDecodeConfig& cfg, void* base, size_t bytes) {
  const Sizes s = sizes(cfg, bytes);
  check(base != nullptr, "workspace: expected device memory, got null");
  check(reinterpret_cast<uintptr_t>(base) % 16 == 0,
        "workspace: expected a 16-byte aligned pointer");
  check(bytes >= s.min_total, "workspace: expected at least ", s.min_total,
        " bytes (BatchDecode::min_workspace_bytes: the plan arrays of this config, with no room to "
        "split KV; ",
        s.full_total,
        " bytes, BatchDecode::workspace_bytes, never limit splitting), "
        "got ",
        bytes);
  base_ = static_cast<std::byte*>(base);
  sms_ = s.sms;
  num_ctas_ = s.num_ctas;
  max_work_items_ = s.max_work_items;
  partial_rows_ = s.partial_rows;
  lse_offset_ = s.states.lse_offset;
  o_offset_ = s.states.o_offset;
  max_head_dim_ = cfg.head_dim;
  arrivals_offset_ = s.states.arrivals_offset;
  max_merge_items_ = s.max_merge_items;
  layout_ = s.layout;
  bytes_used_ = s.total;
  full_bytes_ = s.full_total;
  // The merge-arrival counters start at zero; each run leaves them at zero again.
  runtime::ensure_context(cfg.device);
  runtime::check_cu(
      runtime::driver().cuMemsetD32(reinterpret_cast<CUdeviceptr>(base_ + arrivals_offset_), 0,
                                    static_cast<size_t>(std::max(max_merge_items_, 1))),
      "cuMemsetD32(decode merge counters)");
}

int DecodeWorkspace::slot_capacity(int group, int head_dim) const {
  (void)head_dim;  // partial_o rows are sized for the config's max head_dim
  return static_cast<int>(partial_rows_ / group);
}

DecodePlanPtrs DecodeWorkspace::plan_ptrs() const {
  DecodePlanPtrs p{};
  p.header = reinterpret_cast<const DecodePlanHeader*>(base_ + layout_.header);
  p.unit_work_indptr = reinterpret_cast<const int*>(base_ + layout_.cta_work_indptr);
  p.work = reinterpret_cast<const DecodeWorkItem*>(base_ + layout_.work);
  p.partial_lse = reinterpret_cast<float*>(base_ + lse_offset_);
  p.partial_o = reinterpret_cast<float*>(base_ + o_offset_);
  p.merge_arrivals = reinterpret_cast<int*>(base_ + arrivals_offset_);
  p.ctas_per_unit = 1;  // the plan's, set at each launch
  return p;
}

}  // namespace flashkv::ops
