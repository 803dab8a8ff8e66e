// The kernel of a plan in force, remembered by its key (attention/*/..._key.h): every generation
// step usually plans the same kernel, so plan() then skips building its id and the cache lookup.
// A new key compiles (first use) and loads through the kernel cache.
#pragma once

#include <cuda.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/jit/kernel_specs.h"
#include "runtime/kernel_cache.h"

namespace flashkv::ops {

// A loaded kernel: one function per name expression of its key, its id and launch geometry.
struct LoadedKernel {
  std::string id;
  std::vector<CUfunction> functions;
  LaunchGeometry geometry;
};

template <class Key>
class KernelMemo {
 public:
  bool holds(const Key& key) const { return key_.has_value() && *key_ == key; }
  // The kernel of `key` on `device`; nothing changes when loading throws.
  const LoadedKernel& load(const Key& key, int device) {
    if (holds(key)) return kernel_;
    const KernelSpec spec = kernel_spec(key);
    const runtime::LoadedModule& mod =
        runtime::KernelCache::instance().module(spec.id, device, spec.make);
    LoadedKernel k{spec.id, {}, key.geometry()};
    for (const std::string& name : key.name_expressions())
      k.functions.push_back(mod.function(name));
    kernel_ = std::move(k);
    key_ = key;
    return kernel_;
  }
  const LoadedKernel& kernel() const { return kernel_; }
  const std::optional<Key>& key() const { return key_; }

 private:
  std::optional<Key> key_;
  LoadedKernel kernel_;
};

}  // namespace flashkv::ops
