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

// True while `stream` is being captured into a CUDA graph.
bool stream_is_capturing(Stream stream);

// Device index of the CUDA pointer `p` (throws naming `name` when p is not device memory).
int pointer_device(const void* p, const char* name);

}  // namespace flashkv::runtime
