#include "ops/cascade/cascade_workspace.h"

#include <algorithm>
#include <cstdint>

#include "attention/cascade/cascade_params.cuh"
#include "flashkv/error.h"

namespace flashkv::ops {
namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

struct CascadeWorkspace::Sizes {
  int64_t max_rows;
  size_t num_rows_offset, indices_offset, index_bytes, q_offset, row_bytes, lse_offset, lse_bytes;
  std::vector<size_t> ws_offset, ws_bytes;
  size_t total, full_total, min_total;
};

CascadeWorkspace::Sizes CascadeWorkspace::sizes(const MultiLevelCascadeConfig& cfg, size_t bytes) {
  check(cfg.max_batch > 0, "MultiLevelCascadeConfig.max_batch: expected > 0, got ", cfg.max_batch);
  check(cfg.max_qo_tokens >= 0, "MultiLevelCascadeConfig.max_qo_tokens: expected >= 0, got ",
        cfg.max_qo_tokens);
  check(cfg.max_pages > 0, "MultiLevelCascadeConfig.max_pages: expected > 0, got ", cfg.max_pages);
  check(cfg.max_levels >= 1 && cfg.max_levels <= kCascadeMaxLevels,
        "MultiLevelCascadeConfig.max_levels: expected 1..", kCascadeMaxLevels, ", got ",
        cfg.max_levels);
  check(cfg.num_qo_heads > 0, "MultiLevelCascadeConfig.num_qo_heads: expected > 0, got ",
        cfg.num_qo_heads);
  check(is_supported_head_dim(cfg.head_dim),
        "MultiLevelCascadeConfig.head_dim: expected 64, 128 or 256, got ", cfg.head_dim);
  Sizes s;
  s.max_rows = cfg.max_qo_tokens == 0 ? cfg.max_batch : cfg.max_qo_tokens;
  s.num_rows_offset = size_t(s.max_rows) * 4;
  s.indices_offset = align_up(s.num_rows_offset + 4);
  s.index_bytes = align_up(s.indices_offset + size_t(cfg.max_levels) * cfg.max_pages * 4);
  s.q_offset = s.index_bytes;
  s.row_bytes = align_up(size_t(s.max_rows) * cfg.num_qo_heads * cfg.head_dim * 2);  // 16-bit
  s.lse_offset = s.q_offset + s.row_bytes * (1 + cfg.max_levels);
  s.lse_bytes = align_up(size_t(s.max_rows) * cfg.num_qo_heads * 4);
  const size_t fixed = s.lse_offset + s.lse_bytes * cfg.max_levels;
  CascadeWorkspace probe;
  probe.cfg_ = cfg;
  probe.max_rows_ = s.max_rows;
  // Each level's attention workspace: the size that never limits its splitting, and its least.
  std::vector<size_t> full, least;
  for (int l = 0; l < cfg.max_levels; ++l) {
    const bool decode_suffix = l == cfg.max_levels - 1 && cfg.max_qo_tokens == 0;
    full.push_back(align_up(decode_suffix
                                ? BatchDecode::workspace_bytes(probe.decode_config())
                                : BatchPrefillPaged::workspace_bytes(probe.prefill_config())));
    least.push_back(align_up(decode_suffix
                                 ? BatchDecode::min_workspace_bytes(probe.decode_config())
                                 : BatchPrefillPaged::min_workspace_bytes(probe.prefill_config())));
  }
  s.full_total = fixed, s.min_total = fixed;
  for (int l = 0; l < cfg.max_levels; ++l) s.full_total += full[l], s.min_total += least[l];
  // A buffer smaller than the full size: the levels share what is left after the fixed part,
  // each its least plus an equal part of the rest (no more than its full size); each level's
  // plans then fit their split-KV into it.
  std::vector<size_t> give = full;
  if (s.full_total > bytes && bytes >= s.min_total) {
    const size_t extra = (bytes - s.min_total) / cfg.max_levels / kAlign * kAlign;
    for (int l = 0; l < cfg.max_levels; ++l) give[l] = std::min(full[l], least[l] + extra);
  }
  size_t off = fixed;
  for (int l = 0; l < cfg.max_levels; ++l) {
    s.ws_offset.push_back(off);
    s.ws_bytes.push_back(give[l]);
    off += give[l];
  }
  s.total = off;
  return s;
}

size_t CascadeWorkspace::required_bytes(const MultiLevelCascadeConfig& cfg) {
  return sizes(cfg, SIZE_MAX).full_total;
}

size_t CascadeWorkspace::min_bytes(const MultiLevelCascadeConfig& cfg) {
  return sizes(cfg, SIZE_MAX).min_total;
}

CascadeWorkspace::CascadeWorkspace(const MultiLevelCascadeConfig& cfg, void* base, size_t bytes) {
  const Sizes s = sizes(cfg, bytes);
  check(base != nullptr, "workspace: expected a device buffer, got null");
  check(bytes >= s.min_total, "workspace: ", bytes, " bytes is too small; expected at least ",
        s.min_total,
        " (MultiLevelCascade::min_workspace_bytes: the fixed buffers and each level's ",
        "plan arrays, with no room to split KV; ", s.full_total,
        " bytes, MultiLevelCascade::workspace_bytes, never limit splitting)");
  check(reinterpret_cast<uintptr_t>(base) % kAlign == 0, "workspace: expected ", kAlign,
        "-byte alignment");
  cfg_ = cfg;
  base_ = static_cast<std::byte*>(base);
  max_rows_ = s.max_rows;
  index_bytes_ = s.index_bytes;
  num_rows_offset_ = s.num_rows_offset;
  indices_offset_ = s.indices_offset;
  rows_offset_ = s.q_offset;
  row_bytes_ = s.row_bytes;
  lse_offset_ = s.lse_offset;
  lse_bytes_ = s.lse_bytes;
  level_ws_offset_ = s.ws_offset;
  level_ws_bytes_ = s.ws_bytes;
  const int64_t vecs = s.max_rows * cfg.num_qo_heads * cfg.head_dim / 8;
  merge_grid_ = static_cast<unsigned>(std::clamp<int64_t>((vecs + 255) / 256, 1, 2048));
}

BatchPrefillConfig CascadeWorkspace::prefill_config() const {
  BatchPrefillConfig c;
  c.max_batch = cfg_.max_batch;
  c.max_qo_tokens = max_rows_;
  c.num_qo_heads = cfg_.num_qo_heads;
  c.head_dim = cfg_.head_dim;
  c.device = cfg_.device;
  return c;
}

BatchDecodeConfig CascadeWorkspace::decode_config() const {
  BatchDecodeConfig c;
  c.max_batch = cfg_.max_batch;
  c.num_qo_heads = cfg_.num_qo_heads;
  c.head_dim = cfg_.head_dim;
  c.device = cfg_.device;
  return c;
}

TensorView CascadeWorkspace::level_indices_view(int l) const {
  return TensorView(base_ + level_indices_offset(l), DType::i32, {cfg_.max_pages},
                    Device::cuda(cfg_.device));
}

TensorView CascadeWorkspace::rows_view(int slot, const CascadeShape& s, int64_t rows) const {
  return TensorView(base_ + rows_offset_ + size_t(slot) * row_bytes_, s.dtype,
                    {rows, s.num_qo_heads, s.head_dim}, Device::cuda(cfg_.device));
}

TensorView CascadeWorkspace::lse_view(int l, const CascadeShape& s, int64_t rows) const {
  return TensorView(base_ + lse_offset_ + size_t(l) * lse_bytes_, DType::f32,
                    {rows, s.num_qo_heads}, Device::cuda(cfg_.device));
}

}  // namespace flashkv::ops
