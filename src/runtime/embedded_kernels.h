// Kernel headers embedded in the library at build time (cmake/EmbedKernelsScript.cmake).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashkv::runtime {

struct EmbeddedFile {
  const char* path;  // relative to kernels/, e.g. "attention/merge/merge.cuh"
  std::string source;
};

const std::vector<EmbeddedFile>& embedded_kernel_files();

}  // namespace flashkv::runtime
