// The library-owned plan/run objects behind the convenience ops (single_decode, batch_decode,
// single_prefill): one per device, grown (re-created with a bigger workspace) when a call needs
// more than it was sized for. Not for CUDA-graph capture: a growth moves the workspace.
#pragma once

#include <memory>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/runtime.h"

namespace flashkv::ops {

// Op has static workspace_bytes(Config) and a constructor (Config, void*, size_t).
template <class Op, class Config>
struct CachedOp {
  Config cfg{};
  DeviceBuffer workspace;
  std::unique_ptr<Op> op;

  // Replaces the op by one sized for `next`, built aside and committed only once it exists, so a
  // failure (out of memory, say) leaves the cached op as it was.
  void rebuild(const Config& next) {
    DeviceBuffer ws(Op::workspace_bytes(next), next.device);
    auto fresh = std::make_unique<Op>(next, ws.data(), ws.size());
    op = std::move(fresh);
    workspace = std::move(ws);
    cfg = next;
  }
};

// The entry of `device` in a per-device table, created empty on first use. Tables are meant to
// be never destroyed (`*new std::vector<...>`): at process exit the driver may already be
// unloading, and freeing device memory from a static destructor would race it.
template <class T>
T& device_entry(std::vector<std::unique_ptr<T>>& table, int device) {
  check(device >= 0, "device: expected a CUDA device index >= 0, got ", device);
  if (static_cast<int>(table.size()) <= device) table.resize(device + 1);
  auto& entry = table[device];
  if (!entry) entry = std::make_unique<T>();
  return *entry;
}

}  // namespace flashkv::ops
