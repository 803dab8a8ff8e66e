// Ahead-of-time filling of the JIT kernel cache (DESIGN.md idea 4). NVRTC needs no GPU to compile
// for a named architecture, so this works on a build machine without one; the cubins land in
// $FLASHKV_CACHE_DIR (default ~/.cache/flashkv) and a later run on that GPU finds them.
#pragma once

#include <string>
#include <vector>

#include "flashkv/dtype.h"

namespace flashkv {

struct PrecompileOptions {
  std::string arch = "sm_90a";
  std::vector<std::string> ops = {"merge", "decode", "prefill", "kv", "cascade"};  // kv: RoPE + KV append
  std::vector<DType> dtypes = {DType::f16, DType::bf16};
  std::vector<int> head_dims = {64, 128, 256};
  std::vector<int> group_sizes = {1, 4, 8};  // query heads per KV head
  std::vector<int> page_sizes = {1, 16, 64};
};

struct PrecompiledKernel {
  std::string id;
  bool compiled = false;  // false: the entry was already in the disk cache
  double ms = 0.0;
};

std::vector<PrecompiledKernel> precompile(const PrecompileOptions& opts);

}  // namespace flashkv
