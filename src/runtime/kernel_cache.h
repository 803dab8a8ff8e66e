// The JIT kernel cache: memory, then disk, then NVRTC.
//
// A specialization is named by a short id ("merge_states<f16>") that the op builds cheaply; the
// full compile request (source text, options) is only generated on a miss. The disk key is a
// 64-bit xxHash of source + the embedded kernel headers it includes (transitively) + options +
// name expressions + NVRTC version + arch, so editing a header invalidates exactly the entries
// of the kernels that read it. Disk entries carry a
// checksum; a corrupt or truncated entry is detected, recompiled and replaced (temp file +
// rename, so concurrent writers never expose a partial file). Thread-safe: NVRTC runs outside the
// cache's lock, so distinct ids compile concurrently (flashkv precompile -j); callers asking for an
// id that is being compiled wait for that compile instead of starting a second one.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "runtime/nvrtc_compiler.h"

namespace flashkv::runtime {

using RequestFactory = std::function<CompileRequest()>;

// A module loaded into one device's context, with its kernels by name expression.
struct LoadedModule {
  CUmodule module = nullptr;
  std::unordered_map<std::string, CUfunction> functions;
  CUfunction function(const std::string& name_expression) const;
};

struct JitStats {
  int64_t compiles = 0;     // cold NVRTC compiles
  double compile_ms = 0.0;  // total time in NVRTC
  int64_t disk_hits = 0;
  int64_t memory_hits = 0;
  int64_t corrupt_entries = 0;
};

class KernelCache {
 public:
  static KernelCache& instance();

  // The module of specialization `id` for `device`, compiled for that device's architecture.
  // `make` is called only when the module is in neither memory nor the disk cache.
  const LoadedModule& module(const std::string& id, int device, const RequestFactory& make);

  // Compiles (or finds on disk) `id` for `arch` without loading it: fills the disk cache on a
  // machine with no GPU. Returns true when NVRTC ran (cold), false when the entry existed.
  bool precompile(const std::string& id, const std::string& arch, const RequestFactory& make);

  // The disk-cache file that holds `id` for `arch` ("" when the disk cache is disabled).
  std::string entry_path(const std::string& id, const std::string& arch,
                         const RequestFactory& make) const;

  JitStats stats() const;
  // Cache directory in use ("" when the disk cache is disabled or unwritable).
  std::string directory() const;

 private:
  KernelCache();
  using CompiledPtr = std::shared_ptr<const CompiledKernels>;
  // Memory, else an in-flight compile of the same id, else disk or NVRTC (load_or_compile).
  // Called without mu_ held.
  CompiledPtr compiled(const std::string& id, const std::string& arch, const RequestFactory& make,
                       bool* cold);
  // The disk entry, else NVRTC (and the entry written). Runs without mu_ held (takes it only for
  // stats_).
  CompiledPtr load_or_compile(const std::string& id, const std::string& arch,
                              const RequestFactory& make, bool* cold);

  mutable std::mutex mu_;
  std::string dir_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledKernels>> compiled_;  // id@arch
  std::unordered_map<std::string, std::unique_ptr<LoadedModule>> loaded_;             // id@device
  std::unordered_map<std::string, std::shared_future<CompiledPtr>> pending_;  // id@arch compiling
  JitStats stats_;
};

// The NVRTC target for a device: "sm_90a" on Hopper (arch-specific features: wgmma, setmaxnreg).
std::string device_arch(int device);
// $FLASHKV_CACHE_DIR, else $HOME/.cache/flashkv.
std::string default_cache_dir();
// Hash of the embedded kernel headers `source` includes, directly or transitively (part of every
// cache key: a kernel's entry is invalidated exactly when a header it reads changes).
uint64_t included_sources_hash(const std::string& source);

}  // namespace flashkv::runtime
