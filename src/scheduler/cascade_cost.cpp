// The cascade cost model (cascade_cost.h).
#include "scheduler/cascade_cost.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashkv/error.h"
#include "scheduler/prefill_scheduler.h"
#include "tuning/policy.cuh"

namespace flashkv::scheduler {

namespace {

double decode_factor(const CascadeCostModel& m, int head_dim) {
  return head_dim <= 64 ? m.decode_d64_factor : head_dim <= 128 ? 1.0 : m.decode_d256_factor;
}
double prefix_factor(const CascadeCostModel& m, int head_dim) {
  return head_dim <= 64 ? m.prefix_d64_factor : head_dim <= 128 ? 1.0 : m.prefix_d256_factor;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

CascadeEstimate estimate_cascade(const CascadeLayout& layout, const CascadeProblemShape& shape,
                                 const CascadeCostModel& m) {
  check(shape.num_qo_heads > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0 &&
            shape.kv_dtype_bytes > 0,
        "estimate_cascade: heads, head_dim and kv_dtype_bytes must be positive");
  check(shape.num_qo_heads % shape.num_kv_heads == 0 &&
            shape.num_qo_heads / shape.num_kv_heads <= 128,
        "estimate_cascade: num_qo_heads must be a multiple of num_kv_heads, at most 128 times it");
  for (double rate : {m.dram_bytes_per_us, m.l2_bytes_per_us, m.prefix_bytes_per_us,
                      m.prefix_flops_per_us, m.prefix_flops_per_us_wgmma, m.overlap_power,
                      m.decode_d64_factor, m.decode_d256_factor, m.prefix_d64_factor,
                      m.prefix_d256_factor, m.misaligned_spread_tokens, m.misaligned_full_bytes})
    check(rate > 0, "estimate_cascade: bandwidths, rates and factors must be positive");
  for (double cost :
       {m.decode_fixed_us, m.cascade_fixed_us, m.extra_level_us, m.per_row_us,
        m.prefix_chunk_us_wgmma, m.prefix_chunk_row_us, m.suffix_split_us, m.misaligned_reread})
    check(cost >= 0, "estimate_cascade: fixed costs must be non-negative");
  check(m.num_sms > 0 && m.decode_ctas > 0 && m.prefix_ctas_per_sm > 0,
        "estimate_cascade: num_sms, decode_ctas and prefix_ctas_per_sm must be positive");
  CascadeEstimate e;
  const int64_t token_bytes = shape.kv_token_bytes();
  const int num_levels = layout.num_levels();
  const int group = shape.num_qo_heads / shape.num_kv_heads;
  const int D = shape.head_dim;
  const double k_dec = decode_factor(m, D), k_pre = prefix_factor(m, D);

  // Each request's total KV tokens (by request_order position), for the members' length spread.
  const size_t batch = layout.request_order.size();
  std::vector<int64_t> total(batch, 0);
  for (const CascadeLevel& lv : layout.levels)
    for (int g = 0; g < lv.num_groups(); ++g)
      for (int p = lv.request_indptr[g]; p < lv.request_indptr[g + 1]; ++p)
        total[p] += lv.kv_len(g, layout.page_size);

  double miss = 0;  // plain's DRAM re-fetches of shared prefixes read out of step
  for (int level = 0; level < num_levels; ++level) {
    const CascadeLevel& lv = layout.levels[level];
    const bool shared = level + 1 < num_levels;
    for (int g = 0; g < lv.num_groups(); ++g) {
      const int64_t bytes = lv.kv_len(g, layout.page_size) * token_bytes;
      const int members = lv.group_size(g);
      e.plain_kv_bytes += bytes * members;
      e.cascade_kv_bytes += bytes;
      if (shared && members > 1 && bytes > 0) {
        const auto [lo, hi] = std::minmax_element(total.begin() + lv.request_indptr[g],
                                                  total.begin() + lv.request_indptr[g + 1]);
        const double b = static_cast<double>(bytes);
        miss += m.misaligned_reread * b *
                std::min(1.0, static_cast<double>(*hi - *lo) / m.misaligned_spread_tokens) *
                std::min(1.0, b / m.misaligned_full_bytes);
      }
    }
  }
  e.bytes_saved = e.plain_kv_bytes - e.cascade_kv_bytes;
  e.plain_reread_bytes = e.bytes_saved;
  e.misaligned_bytes = static_cast<int64_t>(miss);
  const double dram_us = static_cast<double>(e.cascade_kv_bytes) / m.dram_bytes_per_us;
  const double stream_us = static_cast<double>(e.plain_kv_bytes) / m.l2_bytes_per_us;
  const double p = m.overlap_power;
  e.plain_us = m.decode_fixed_us +
               k_dec * (std::pow(std::pow(dram_us, p) + std::pow(stream_us, p), 1.0 / p) +
                        miss / m.dram_bytes_per_us);
  if (!layout.has_shared_prefix()) return e;  // one level: the cascade is the plain op

  // Shared levels: one prefill pass each.
  for (int level = 0; level + 1 < num_levels; ++level) {
    const CascadeLevel& lv = layout.levels[level];
    std::vector<int64_t> qo_lens(lv.num_groups());
    for (int g = 0; g < lv.num_groups(); ++g) qo_lens[g] = lv.qo_indptr[g + 1] - lv.qo_indptr[g];
    const int tile = choose_query_tile_rows(qo_lens, group);
    const int tile_tokens = tile / group;
    const bool wgmma = tile == m.wgmma_tile_rows && D <= m.wgmma_max_head_dim;
    const int64_t ctas = int64_t{m.num_sms} *
                         (wgmma ? tuning::Policy::kPrefillHopperCtasPerSm : m.prefix_ctas_per_sm);
    int64_t visible = 0;  // Σ tiles × kv heads × kv_len: what the scheduler splits over the CTAs
    for (int g = 0; g < lv.num_groups(); ++g)
      visible +=
          ceil_div(qo_lens[g], tile_tokens) * shape.num_kv_heads * lv.kv_len(g, layout.page_size);
    const int64_t chunk =
        std::max<int64_t>(tuning::Policy::kPrefillMinChunkTokens, ceil_div(visible, ctas));
    const double wgmma_chunk_us = m.prefix_chunk_us_wgmma * D / 128.0;
    for (int g = 0; g < lv.num_groups(); ++g) {
      const int64_t kv_len = lv.kv_len(g, layout.page_size);
      if (kv_len == 0 || qo_lens[g] == 0) continue;
      const int64_t tiles = ceil_div(qo_lens[g], tile_tokens);
      const int64_t tile_rows = std::min<int64_t>(qo_lens[g] * group, tile);
      const double flops = 4.0 * qo_lens[g] * shape.num_qo_heads * static_cast<double>(kv_len) * D;
      e.prefix_us += k_pre * static_cast<double>(kv_len * token_bytes) / m.prefix_bytes_per_us +
                     flops / (wgmma ? m.prefix_flops_per_us_wgmma : m.prefix_flops_per_us) +
                     static_cast<double>(ceil_div(kv_len, chunk) * tiles) *
                         (wgmma ? wgmma_chunk_us : m.prefix_chunk_row_us * tile_rows * D / 128.0);
    }
  }
  // The suffix level: one decode (or, for prefill rows, a causal prefill) pass.
  const CascadeLevel& last = layout.levels.back();
  int64_t suffix_tokens = 0, longest = 0;
  for (int g = 0; g < last.num_groups(); ++g) {
    suffix_tokens += last.kv_len(g, layout.page_size);
    longest = std::max(longest, last.kv_len(g, layout.page_size));
  }
  const double split_at =
      std::max(static_cast<double>(tuning::Policy::kDecodeMinChunkTokens),
               static_cast<double>(suffix_tokens) * shape.num_kv_heads / m.decode_ctas);
  e.suffix_us = k_dec * static_cast<double>(suffix_tokens * token_bytes) / m.dram_bytes_per_us +
                (static_cast<double>(longest) > split_at ? m.suffix_split_us : 0.0);

  const int64_t rows = static_cast<int64_t>(layout.qo_rows.size());
  const int64_t state_row_bytes = rows * shape.num_qo_heads * (shape.head_dim + 1) * 4;
  e.state_bytes = (2 * int64_t{num_levels} + 1) * state_row_bytes;
  e.cascade_us = m.cascade_fixed_us + (num_levels - 2) * m.extra_level_us +
                 m.per_row_us * static_cast<double>(rows) + e.prefix_us + e.suffix_us +
                 static_cast<double>(e.state_bytes) / m.dram_bytes_per_us;
  e.use_cascade = e.bytes_saved > 0 && e.cascade_us < (1.0 - m.min_relative_gain) * e.plain_us;
  return e;
}

CascadeChoiceCheck check_cascade_choice(double plain_us, double cascade_us, bool chose_cascade,
                                        double tolerance) {
  check(plain_us > 0 && cascade_us > 0, "check_cascade_choice: times must be positive, got plain ",
        plain_us, " us and cascade ", cascade_us, " us");
  check(tolerance >= 0, "check_cascade_choice: tolerance must be >= 0, got ", tolerance);
  CascadeChoiceCheck c;
  c.chosen_us = chose_cascade ? cascade_us : plain_us;
  c.best_us = std::min(plain_us, cascade_us);
  c.slowdown = c.chosen_us / c.best_us - 1.0;
  c.ok = c.chosen_us <= (1.0 + tolerance) * c.best_us;
  return c;
}

}  // namespace flashkv::scheduler
