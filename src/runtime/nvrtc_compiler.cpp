#include "runtime/nvrtc_compiler.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include "flashkv/error.h"
#include "runtime/embedded_kernels.h"
#include "runtime/nvrtc_library.h"

namespace flashkv::runtime {
namespace {

void check_nvrtc(nvrtcResult r, const std::string& what, const std::string& key) {
  if (r != NVRTC_SUCCESS)
    fail("NVRTC ", what, " failed for kernel ", key, ": ", nvrtc().nvrtcGetErrorString(r));
}

struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    if (*p) nvrtc().nvrtcDestroyProgram(p);
    delete p;
  }
};

}  // namespace

namespace {
std::mutex& process_options_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::string>& process_options() {
  static std::vector<std::string> options;
  return options;
}
}  // namespace

void add_process_nvrtc_option(const std::string& option) {
  std::lock_guard<std::mutex> lock(process_options_mutex());
  process_options().push_back(option);
}

std::vector<std::string> base_nvrtc_options(const std::string& arch) {
  // -default-device: every function without a space qualifier is device code, so the kernel
  //  headers need no __device__ on small helpers that NVRTC would otherwise treat as host.
  // No --use_fast_math: exp2/log2 are chosen explicitly in the kernels where they matter.
  std::vector<std::string> opts = {"--gpu-architecture=" + arch, "-std=c++17", "-default-device",
                                   "--fmad=true", "-DFLASHKV_NVRTC=1"};
  std::lock_guard<std::mutex> lock(process_options_mutex());
  opts.insert(opts.end(), process_options().begin(), process_options().end());
  // FLASHKV_NVRTC_OPTIONS: more options, space-separated, for investigations (e.g.
  // "--ptxas-options=-v" with FLASHKV_NVRTC_LOG=1 prints registers and spills). They enter the
  // kernel cache's key like every option here.
  if (const char* extra = std::getenv("FLASHKV_NVRTC_OPTIONS")) {
    std::istringstream words(extra);
    for (std::string w; words >> w;) opts.push_back(w);
  }
  return opts;
}

std::string nvrtc_version_string() {
  int major = 0, minor = 0;
  nvrtc().nvrtcVersion(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

CompiledKernels nvrtc_compile(const CompileRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  const Nvrtc& api = nvrtc();  // before the program's deleter, which needs it, exists
  const auto& files = embedded_kernel_files();
  std::vector<const char*> header_sources, header_names;
  for (const auto& f : files) {
    header_sources.push_back(f.source.c_str());
    header_names.push_back(f.path);
  }
  std::unique_ptr<nvrtcProgram, ProgramDeleter> prog(new nvrtcProgram(nullptr));
  check_nvrtc(api.nvrtcCreateProgram(prog.get(), req.source.c_str(), (req.key_name + ".cu").c_str(),
                                     static_cast<int>(files.size()), header_sources.data(),
                                     header_names.data()),
              "nvrtcCreateProgram", req.key_name);
  for (const auto& e : req.name_expressions) {
    check_nvrtc(api.nvrtcAddNameExpression(*prog, e.c_str()), "nvrtcAddNameExpression(" + e + ")",
                req.key_name);
  }
  std::vector<std::string> opts = base_nvrtc_options(req.arch);
  opts.insert(opts.end(), req.options.begin(), req.options.end());
  std::vector<const char*> opt_ptrs;
  for (const auto& o : opts) opt_ptrs.push_back(o.c_str());
  nvrtcResult r =
      api.nvrtcCompileProgram(*prog, static_cast<int>(opt_ptrs.size()), opt_ptrs.data());
  if (r != NVRTC_SUCCESS) {
    size_t log_size = 0;
    api.nvrtcGetProgramLogSize(*prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size) api.nvrtcGetProgramLog(*prog, log.data());
    fail("NVRTC failed to compile kernel ", req.key_name, " for ", req.arch, ": ",
         api.nvrtcGetErrorString(r), "\n", log);
  }
  if (std::getenv("FLASHKV_NVRTC_LOG") !=
      nullptr) {  // compiler warnings (ptxas: wgmma serialization, spills)
    size_t log_size = 0;
    api.nvrtcGetProgramLogSize(*prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size) api.nvrtcGetProgramLog(*prog, log.data());
    if (log.find_first_not_of(std::string("\0 \n", 3)) != std::string::npos)
      std::fprintf(stderr, "flashkv: NVRTC log for %s:\n%s\n", req.key_name.c_str(), log.c_str());
  }
  CompiledKernels out;
  size_t cubin_size = 0;
  check_nvrtc(api.nvrtcGetCUBINSize(*prog, &cubin_size), "nvrtcGetCUBINSize", req.key_name);
  out.cubin.resize(cubin_size);
  check_nvrtc(api.nvrtcGetCUBIN(*prog, out.cubin.data()), "nvrtcGetCUBIN", req.key_name);
  for (const auto& e : req.name_expressions) {
    const char* lowered = nullptr;
    check_nvrtc(api.nvrtcGetLoweredName(*prog, e.c_str(), &lowered),
                "nvrtcGetLoweredName(" + e + ")", req.key_name);
    out.name_expressions.push_back(e);
    out.lowered_names.push_back(lowered);
  }
  out.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace flashkv::runtime
