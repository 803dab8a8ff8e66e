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
};

// Launches `f` with `args` (an array of pointers to each argument). Raises the function's dynamic
// shared memory limit first when smem_bytes > 48 KiB. Never synchronizes.
void launch(CUfunction f, const LaunchConfig& cfg, Stream stream, void** args,
            const std::string& what);

// How many CTAs of `f` (block_x threads, smem_bytes of dynamic shared memory) fit on one SM at
// once, from its registers and shared memory (raises the function's shared memory limit first).
int max_active_ctas_per_sm(CUfunction f, unsigned block_x, unsigned smem_bytes,
                           const std::string& what);

// True while `stream` is being captured into a CUDA graph.
bool stream_is_capturing(Stream stream);

// Device index of the CUDA pointer `p` (throws naming `name` when p is not device memory).
int pointer_device(const void* p, const char* name);

}  // namespace flashkv::runtime
