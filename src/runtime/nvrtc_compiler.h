// NVRTC compilation of one kernel specialization to a cubin for a named architecture.
// Works without a GPU: the target is a name ("sm_90a"), not a device.
#pragma once

#include <string>
#include <vector>

namespace flashkv::runtime {

struct CompileRequest {
  std::string key_name;  // human-readable key for logs and errors
  std::string source;    // top-level translation unit; may #include any embedded kernel header
  std::vector<std::string> name_expressions;  // e.g. "flashkv::merge_states_kernel<__half>"
  std::vector<std::string> options;           // extra NVRTC options
  std::string arch;                           // "sm_90a", "sm_80", ...
};

struct CompiledKernels {
  std::vector<char> cubin;
  std::vector<std::string> name_expressions;  // as requested
  std::vector<std::string> lowered_names;     // mangled names, same order
  double compile_ms = 0.0;
};

// Compiles with NVRTC; throws flashkv::Error with the key and the full NVRTC log on failure.
CompiledKernels nvrtc_compile(const CompileRequest& req);

// The options every compile uses (std, arch, fast math choices, the process-wide extras below):
// part of the cache key.
std::vector<std::string> base_nvrtc_options(const std::string& arch);

// Adds an option to every later compile of this process, e.g. a profiling build's define
// (`flashkv bench decode --decode-timeline` adds -DFLASHKV_DECODE_TIMELINE). Being part of the
// cache key, it never mixes with the normal entries. Call before the kernels it affects load.
void add_process_nvrtc_option(const std::string& option);

// "13.0"
std::string nvrtc_version_string();

}  // namespace flashkv::runtime
