// The cascade cost model (cascade_cost.h).
#include "scheduler/cascade_cost.h"

#include <algorithm>

#include "flashkv/error.h"

namespace flashkv::scheduler {

CascadeEstimate estimate_cascade(const CascadeLayout& layout, const CascadeProblemShape& shape,
                                 const CascadeCostModel& model) {
  check(shape.num_qo_heads > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0 &&
            shape.kv_dtype_bytes > 0,
        "estimate_cascade: heads, head_dim and kv_dtype_bytes must be positive");
  check(model.read_bytes_per_us > 0 && model.prefix_flops_per_us > 0 &&
            model.state_bytes_per_us > 0 && model.level_overhead_us >= 0 &&
            model.l2_reuse_bytes >= 0,
        "estimate_cascade: bandwidths and rates must be positive, level_overhead_us and "
        "l2_reuse_bytes non-negative");
  CascadeEstimate e;
  const int64_t token_bytes = shape.kv_token_bytes();
  const int num_levels = layout.num_levels();
  double prefix_bytes = 0, prefix_flops = 0, plain_dram = 0;
  for (int level = 0; level < num_levels; ++level) {
    const CascadeLevel& lv = layout.levels[level];
    const bool shared = level + 1 < num_levels;
    for (int g = 0; g < lv.num_groups(); ++g) {
      const int64_t kv_len = lv.kv_len(g, layout.page_size);
      const int64_t bytes = kv_len * token_bytes;
      const int members = lv.group_size(g);
      e.plain_kv_bytes += bytes * members;
      e.cascade_kv_bytes += bytes;
      const double b = static_cast<double>(bytes);
      const double miss = b > model.l2_reuse_bytes ? 1.0 - model.l2_reuse_bytes / b : 0.0;
      plain_dram += b + (members - 1) * b * miss;
      if (shared) {
        prefix_bytes += b;
        const int64_t rows = lv.qo_indptr[g + 1] - lv.qo_indptr[g];
        prefix_flops += 4.0 * rows * shape.num_qo_heads * static_cast<double>(kv_len) * shape.head_dim;
      }
    }
  }
  e.bytes_saved = e.plain_kv_bytes - e.cascade_kv_bytes;
  e.plain_dram_bytes = static_cast<int64_t>(plain_dram);
  e.plain_us = plain_dram / model.read_bytes_per_us;
  if (!layout.has_shared_prefix()) return e;  // one level: the cascade is the plain op

  const int64_t rows = static_cast<int64_t>(layout.qo_rows.size());
  const int64_t state_row_bytes = rows * shape.num_qo_heads * (shape.head_dim + 1) * 4;
  e.state_bytes = (2 * int64_t{num_levels} + 1) * state_row_bytes;
  const double suffix_bytes = static_cast<double>(e.cascade_kv_bytes) - prefix_bytes;
  e.cascade_us = suffix_bytes / model.read_bytes_per_us +
                 std::max(prefix_bytes / model.read_bytes_per_us,
                          prefix_flops / model.prefix_flops_per_us) +
                 static_cast<double>(e.state_bytes) / model.state_bytes_per_us +
                 (num_levels - 1) * model.level_overhead_us;
  e.use_cascade = e.bytes_saved > 0 && e.cascade_us < (1.0 - model.min_relative_gain) * e.plain_us;
  return e;
}

}  // namespace flashkv::scheduler
