// The MultiLevelCascade workspace: one caller-owned device buffer carved into the per-level
// attention workspaces, the level states, the gathered q, and the index region (row map, row
// count, each level's page ids) that plan() fills with one pinned copy. Sized once for the worst
// case of the config, so every pointer is fixed for the object's life (CUDA-graph replay). A
// smaller caller's buffer (at least min_bytes) gives each level a share of the rest; the levels'
// plans fit their split-KV into it.
//
// Layout: [index region: rows | num_rows | level page ids x max_levels][q][o x max_levels]
//         [lse x max_levels][level workspaces x max_levels]
#pragma once

#include <cuda.h>

#include <cstddef>
#include <vector>

#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/prefill.h"

namespace flashkv::ops {

class CascadeWorkspace {
 public:
  CascadeWorkspace() = default;
  CascadeWorkspace(const MultiLevelCascadeConfig& cfg, void* base, size_t bytes);
  static size_t required_bytes(const MultiLevelCascadeConfig& cfg);  // never limits splitting
  static size_t min_bytes(const MultiLevelCascadeConfig& cfg);       // no partial states

  int64_t max_rows() const { return max_rows_; }
  BatchPrefillConfig prefill_config() const;
  BatchDecodeConfig decode_config() const;
  void* level_workspace(int l) const { return base_ + level_ws_offset_[l]; }
  size_t level_workspace_bytes(int l) const { return level_ws_bytes_[l]; }

  // The index region (mirrored in a pinned buffer of index_bytes()).
  size_t index_bytes() const { return index_bytes_; }
  size_t rows_offset() const { return 0; }
  size_t num_rows_offset() const { return num_rows_offset_; }
  size_t level_indices_offset(int l) const {
    return indices_offset_ + size_t(l) * cfg_.max_pages * 4;
  }
  CUdeviceptr index_device_ptr() const { return reinterpret_cast<CUdeviceptr>(base_); }
  const int* rows_ptr() const { return reinterpret_cast<const int*>(base_); }
  const int* num_rows_ptr() const { return reinterpret_cast<const int*>(base_ + num_rows_offset_); }
  TensorView level_indices_view(int l) const;

  // Slot 0: the gathered q; slot l + 1: level l's output. [max_rows, H, D] of the shape,
  // contiguous.
  TensorView rows_view(int slot, const CascadeShape& s, int64_t rows) const;
  TensorView lse_view(int l, const CascadeShape& s, int64_t rows) const;  // f32 [max_rows, H]
  unsigned merge_grid() const { return merge_grid_; }

 private:
  struct Sizes;
  // The layout in `bytes`: every level's full workspace, or shares of what fits
  // (cascade_workspace.cpp).
  static Sizes sizes(const MultiLevelCascadeConfig& cfg, size_t bytes);
  MultiLevelCascadeConfig cfg_{};
  std::byte* base_ = nullptr;
  int64_t max_rows_ = 0;
  size_t index_bytes_ = 0, num_rows_offset_ = 0, indices_offset_ = 0, rows_offset_ = 0,
         row_bytes_ = 0, lse_offset_ = 0, lse_bytes_ = 0;
  std::vector<size_t> level_ws_offset_, level_ws_bytes_;
  unsigned merge_grid_ = 1;
};

}  // namespace flashkv::ops
