// Ahead-of-time filling of the JIT kernel cache (docs/design.md "Kernel keys"). NVRTC needs no GPU
// to compile for a named architecture, so this works on a build machine without one; the cubins
// land in $FLASHKV_CACHE_DIR (default ~/.cache/flashkv) and a later run on that GPU finds them.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/variant_spec.h"

namespace flashkv {

struct PrecompileOptions {
  std::string arch = "sm_90a";
  std::vector<std::string> ops = {"merge", "decode", "prefill", "kv",
                                  "cascade"};             // kv: RoPE + KV append
  std::vector<DType> dtypes = {DType::f16, DType::bf16};  // q (and out)
  // The caches' dtypes: empty, each q dtype's own; else these (e4m3 / e5m2 fp8 caches under
  // every q dtype, a 16-bit one only where it is the q dtype): decode, prefill and the append.
  std::vector<DType> kv_dtypes;
  std::vector<int> head_dims = {64, 128, 256};
  std::vector<int> group_sizes = {1, 4, 8};  // query heads per KV head
  std::vector<int> page_sizes = {1, 16, 64};
  // Kernels compiled at once (NVRTC compiles one program per thread); 0: one per hardware thread.
  int jobs = 1;
  // Variants (built-in or user; their arguments are not used) compiled into the decode and the
  // (mma.sync) prefill kernels of these shapes as well as plain attention. A user variant's
  // compile error throws flashkv::Error with NVRTC's log, as plan() would, without a GPU.
  // Their kernels come first.
  std::vector<Variant> variants;
};

struct PrecompiledKernel {
  std::string id;
  bool compiled = false;  // false: the entry was already in the disk cache
  double ms = 0.0;
};

// Called as each kernel is done (one call at a time, in completion order): the kernel, how many
// are done, how many in all.
using PrecompileProgress =
    std::function<void(const PrecompiledKernel& kernel, size_t done, size_t total)>;

// The op names PrecompileOptions::ops takes, one per kernel family (PrecompileOptions' default
// ops are all of them).
std::vector<std::string> precompile_ops();

// The ids of the kernels precompile(opts) compiles, in its order, without compiling anything
// (`flashkv precompile --list`).
std::vector<std::string> precompile_kernel_ids(const PrecompileOptions& opts);

// Compiles every kernel `opts` names into the disk cache, `opts.jobs` at a time. Returns them in
// a fixed order (that of the options, whatever the completion order); the first compile error is
// rethrown after the compiles in flight have finished.
std::vector<PrecompiledKernel> precompile(const PrecompileOptions& opts,
                                          const PrecompileProgress& progress = {});

}  // namespace flashkv
