// CPU reference of multi-level cascade attention (reference_cascade.h): every level is a paged
// batch whose "requests" are groups of rows; each row's level states go through one ⊕ in double.
#include "reference/cascade.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "flashkv/error.h"

namespace flashkv::reference {
namespace detail {
namespace {

std::string level_name(size_t l, const char* field) {
  return "levels[" + std::to_string(l) + "]." + field;
}

// One level, validated: its page table over (k, v) and its row split.
struct Level {
  PagedKVCache kv;
  PageTable table;
  std::vector<int64_t> qo_ptr;
};

Level read_level(const TensorView& k, const TensorView& v, KVLayout layout,
                 const CascadeLevelView& view, size_t l, const QOShape& qo, const KVScale& scale) {
  Level lv;
  lv.kv = PagedKVCache{.k = k,
                       .v = v,
                       .layout = layout,
                       .indptr = view.kv_indptr,
                       .indices = view.kv_indices,
                       .last_page_len = view.kv_last_page_len,
                       .scale = scale};
  try {
    lv.table = check_paged(lv.kv, qo);
  } catch (const Error& e) {
    fail(level_name(l, "kv"), ": ", e.what());
  }
  const std::string name = level_name(l, "qo_indptr");
  lv.qo_ptr = read_indptr(view.qo_indptr, name.c_str(), qo.rows, "q.size(0)");
  check(static_cast<int>(lv.qo_ptr.size()) == lv.kv.batch_size() + 1, name, ": expected ",
        lv.kv.batch_size() + 1, " entries (as kv_indptr), got ", lv.qo_ptr.size());
  return lv;
}

}  // namespace

RowState merge_row_states(std::span<const RowState> states) {
  RowState out;
  out.o.assign(states.empty() ? 0 : states[0].o.size(), 0.0);
  double m = kNegInf;
  for (const RowState& s : states) m = std::max(m, s.lse);
  if (m == kNegInf) return out;
  double denom = 0.0;
  for (const RowState& s : states) {
    if (s.lse == kNegInf) continue;  // the identity of ⊕
    const double w = std::exp(s.lse - m);
    denom += w;
    for (size_t d = 0; d < out.o.size(); ++d) out.o[d] += w * s.o[d];
  }
  for (double& x : out.o) x /= denom;
  out.lse = m + std::log(denom);
  return out;
}

std::vector<RowState> cascade_states(const TensorView& q, const TensorView& k, const TensorView& v,
                                     KVLayout layout, std::span<const CascadeLevelView> levels,
                                     const AttentionOptions& opts) {
  check_cpu(q, "q");
  check_floating(q, "q");
  check_ndim(q, "q", 3);
  check(!levels.empty(), "levels: a cascade needs at least one level");
  const QOShape qo{.rows = q.size(0),
                   .num_qo_heads = static_cast<int>(q.size(1)),
                   .head_dim = static_cast<int>(q.size(2))};
  std::vector<Level> lvs;
  for (size_t l = 0; l < levels.size(); ++l)
    lvs.push_back(read_level(k, v, layout, levels[l], l, qo, opts.kv_scale));

  const int heads = qo.num_qo_heads, dim = qo.head_dim;
  const int kv_heads = lvs[0].kv.num_kv_heads();
  const int group = heads / kv_heads;
  const double sm_scale = resolve_sm_scale(opts.sm_scale, dim);
  const size_t num_levels = lvs.size();

  // A causal row must see its shared prefix whole (reference_cascade.h).
  if (opts.causal) {
    std::vector<int64_t> prefix_len(qo.rows, 0);
    for (size_t l = 0; l + 1 < num_levels; ++l) {
      for (int g = 0; g < lvs[l].kv.batch_size(); ++g) {
        for (int64_t r = lvs[l].qo_ptr[g]; r < lvs[l].qo_ptr[g + 1]; ++r) {
          prefix_len[r] += lvs[l].table.kv_len[g];
        }
      }
    }
    const Level& last = lvs.back();
    for (int g = 0; g < last.kv.batch_size(); ++g) {
      const int64_t rows = last.qo_ptr[g + 1] - last.qo_ptr[g];
      if (rows == 0 || last.table.kv_len[g] >= rows - 1) continue;
      check(prefix_len[last.qo_ptr[g]] == 0, "levels[", num_levels - 1, "]: causal group ", g,
            " has ", rows, " query rows but a suffix of only ", last.table.kv_len[g],
            " tokens: its first rows would see only part of the shared prefix");
    }
  }

  // states[(row * heads + h) * num_levels + l]; each (level, group, kv head) writes its own.
  std::vector<RowState> states(qo.rows * heads * num_levels);
  const int64_t q_s[3] = {q.stride(0), q.stride(1), q.stride(2)};
  for (size_t l = 0; l < num_levels; ++l) {
    const Level& lv = lvs[l];
    const bool causal = opts.causal && l + 1 == num_levels;
    flashkv::detail::parallel_for(int64_t{lv.kv.batch_size()} * kv_heads, [&](int64_t item) {
      const int g = static_cast<int>(item / kv_heads);
      const int kv_head = static_cast<int>(item % kv_heads);
      const KVRows rows = gather(paged_source(lv.kv, lv.table, g), kv_head, dim);
      const int64_t qo_len = lv.qo_ptr[g + 1] - lv.qo_ptr[g];
      std::vector<double> q_row(dim);
      for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
        for (int64_t i = 0; i < qo_len; ++i) {
          const int64_t r = lv.qo_ptr[g] + i;
          for (int d = 0; d < dim; ++d) {
            q_row[d] = load_as_double(q.data(), q.dtype(), r * q_s[0] + h * q_s[1] + d * q_s[2]);
          }
          const int64_t visible = causal ? rows.len - qo_len + i + 1 : rows.len;
          RowState st = attend_row(q_row, rows, visible, sm_scale);
          states[(r * heads + h) * num_levels + l] = std::move(st);
        }
      }
    });
  }

  std::vector<RowState> merged(qo.rows * heads);
  for (size_t i = 0; i < merged.size(); ++i) {
    merged[i] = merge_row_states(std::span(states).subspan(i * num_levels, num_levels));
  }
  return merged;
}

}  // namespace detail

void multi_level_cascade(const TensorView& q, const TensorView& k, const TensorView& v,
                         KVLayout layout, std::span<const CascadeLevelView> levels,
                         const TensorView& out, const TensorView& lse,
                         const AttentionOptions& opts) {
  const detail::QOShape qo = detail::check_qo(q, out, lse);
  const std::vector<detail::RowState> states =
      detail::cascade_states(q, k, v, layout, levels, opts);
  const int64_t o_s[3] = {out.stride(0), out.stride(1), out.stride(2)};
  for (int64_t r = 0; r < qo.rows; ++r) {
    for (int h = 0; h < qo.num_qo_heads; ++h) {
      const detail::RowState& st = states[r * qo.num_qo_heads + h];
      for (int d = 0; d < qo.head_dim; ++d) {
        store_from_double(out.data(), out.dtype(), r * o_s[0] + h * o_s[1] + d * o_s[2], st.o[d]);
      }
      if (lse.defined()) {
        store_from_double(lse.data(), lse.dtype(), r * lse.stride(0) + h * lse.stride(1), st.lse);
      }
    }
  }
}

}  // namespace flashkv::reference
