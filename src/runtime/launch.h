// Kernel launch through the driver API, with errors naming the kernel.
#pragma once

#include <cuda.h>

#include <string>

#include "flashkv/runtime.h"

namespace flashkv::runtime {

struct LaunchConfig {
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;
  unsigned block_x = 1, block_y = 1, block_z = 1;
  unsigned smem_bytes = 0;
  // Programmatic dependent launch (sm_90+): the kernel's CTAs may start while the previous kernel
  // in the stream drains. Only for kernels that call pdl_wait() (kernels/primitives/pdl.cuh)
  // before touching memory the previous kernel may use; ignored where the device has no PDL.
  bool pdl = false;
};

// Launches `f` with `args` (an array of pointers to each argument). Raises the function's dynamic
// shared memory limit first when smem_bytes > 48 KiB. Never synchronizes. cfg.pdl: launched with
// the programmatic-stream-serialization attribute where the stream's device supports it.
void launch(CUfunction f, const LaunchConfig& cfg, Stream stream, void** args,
            const std::string& what);

// How many CTAs of `f` (block_x threads, smem_bytes of dynamic shared memory) fit on one SM at
// once, from its registers and shared memory (raises the function's shared memory limit first).
int max_active_ctas_per_sm(CUfunction f, unsigned block_x, unsigned smem_bytes,
                           const std::string& what);

// True when `device` (an ordinal) can launch kernels with programmatic dependent launch (compute
// capability 9.0 or newer). Cached per device.
bool device_supports_pdl(int device);

// True while `stream` is being captured into a CUDA graph.
bool stream_is_capturing(Stream stream);

// Device index of the CUDA pointer `p` (throws naming `name` when p is not device memory).
int pointer_device(const void* p, const char* name);

}  // namespace flashkv::runtime
