#include "runtime/nvrtc_library.h"

#include <cuda.h>  // CUDA_VERSION: the toolkit (and so the NVRTC major) this build's headers are of
#include <dlfcn.h>
#include <link.h>  // dlinfo's RTLD_DI_ORIGIN
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "flashkv/error.h"

namespace flashkv::runtime {
namespace {

std::mutex& search_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::string>& registered_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

bool is_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Where NVRTC may be, in order: a name without a slash is the dynamic loader's own search
// (LD_LIBRARY_PATH, ld.so.cache, an NVRTC the process already loaded, e.g. torch's).
std::vector<std::string> candidates() {
  const std::string so = nvrtc_soname();
  std::vector<std::string> out;
  {
    std::lock_guard<std::mutex> lock(search_mutex());
    for (const auto& d : registered_dirs()) out.push_back(d + "/" + so);
  }
  out.push_back(so);
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* home = std::getenv(var); home && *home) {
      out.push_back(std::string(home) + "/lib64/" + so);
      out.push_back(std::string(home) + "/lib/" + so);
    }
  }
  out.push_back("/usr/local/cuda/lib64/" + so);
  std::vector<std::string> unique;  // CUDA_HOME is often /usr/local/cuda itself
  for (const auto& c : out)
    if (std::find(unique.begin(), unique.end(), c) == unique.end()) unique.push_back(c);
  return unique;
}

// NVRTC loads its builtins (libnvrtc-builtins.so.MAJOR.MINOR) by name at its first compile, and
// the PyPI wheel's libnvrtc has no RPATH: outside the toolkit, the loader would not find them
// beside it (nvrtcCompileProgram fails with NVRTC_ERROR_BUILTIN_OPERATION_FAILURE). Loaded here
// from NVRTC's own directory first, the later load by name finds the same object already loaded.
void preload_builtins(void* lib, const Nvrtc& fns) {
  char dir[PATH_MAX] = {};
  if (dlinfo(lib, RTLD_DI_ORIGIN, dir) != 0) return;
  int major = 0, minor = 0;
  if (fns.nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return;
  const std::string builtins = std::string(dir) + "/libnvrtc-builtins.so." + std::to_string(major) +
                               "." + std::to_string(minor);
  if (is_file(builtins)) dlopen(builtins.c_str(), RTLD_NOW | RTLD_LOCAL);
}

#define FLASHKV_STR2(x) #x
#define FLASHKV_STR(x) FLASHKV_STR2(x)

Nvrtc load() {
  std::string looked;
  for (const std::string& path : candidates()) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      looked += "\n  " + path;
      if (path.find('/') == std::string::npos)
        looked += " (the loader's search)";
      else if (is_file(path))  // there, but unusable (another architecture, a missing library)
        looked += std::string(" (exists, but: ") + dlerror() + ")";
      continue;
    }
    Nvrtc fns;
#define FLASHKV_LOAD_PTR(name)                                                               \
  fns.name = reinterpret_cast<decltype(fns.name)>(dlsym(lib, FLASHKV_STR(name)));            \
  check(fns.name != nullptr, "NVRTC at ", path, " lacks ", FLASHKV_STR(name), " (expected ", \
        nvrtc_soname(), ")");
    FLASHKV_NVRTC_FUNCTIONS(FLASHKV_LOAD_PTR)
#undef FLASHKV_LOAD_PTR
    char dir[PATH_MAX] = {};
    fns.path =
        dlinfo(lib, RTLD_DI_ORIGIN, dir) == 0 ? std::string(dir) + "/" + nvrtc_soname() : path;
    preload_builtins(lib, fns);
    return fns;
  }
  fail("NVRTC (", nvrtc_soname(), ") not found; looked for:", looked, "\nInstall the CUDA ",
       CUDA_VERSION / 1000, " NVRTC wheel (pip install 'nvidia-cuda-nvrtc==", CUDA_VERSION / 1000,
       ".*'; the flashkv wheel depends on it) or the CUDA toolkit, or put "
       "the directory of ",
       nvrtc_soname(), " on LD_LIBRARY_PATH.");
}

}  // namespace

std::string nvrtc_soname() { return "libnvrtc.so." + std::to_string(CUDA_VERSION / 1000); }

void add_nvrtc_search_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(search_mutex());
  registered_dirs().push_back(dir);
}

const Nvrtc& nvrtc() {
  // A failed load throws on every call (a static whose initializer throws is initialized again
  // on the next call), so a search directory added after the error is still used.
  static const Nvrtc fns = load();
  return fns;
}

}  // namespace flashkv::runtime
