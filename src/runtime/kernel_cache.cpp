#include "runtime/kernel_cache.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "flashkv/error.h"
#include "runtime/driver.h"
#include "runtime/embedded_kernels.h"
#include "runtime/hash64.h"

namespace flashkv::runtime {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'F', 'K', 'V', 'C', 'U', 'B', 'I', 'N'};
constexpr uint32_t kFormatVersion = 1;

bool quiet() {
  const char* q = std::getenv("FLASHKV_QUIET");
  return q && *q && std::strcmp(q, "0") != 0;
}

uint64_t request_hash(const CompileRequest& req) {
  Hash64 st;
  auto add = [&](const std::string& s) {
    const uint64_t n = s.size();
    st.update(&n, sizeof(n));
    st.update(s.data(), s.size());
  };
  add(req.source);
  const uint64_t srcs = included_sources_hash(req.source);
  st.update(&srcs, sizeof(srcs));
  for (const auto& o : base_nvrtc_options(req.arch)) add(o);
  for (const auto& o : req.options) add(o);
  for (const auto& e : req.name_expressions) add(e);
  add(nvrtc_version_string());
  add(req.arch);
  return st.digest();
}

void put_u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& b, const std::string& s) {
  put_u32(b, static_cast<uint32_t>(s.size()));
  b += s;
}

std::string serialize(uint64_t key, const CompiledKernels& k) {
  std::string b(kMagic, sizeof(kMagic));
  put_u32(b, kFormatVersion);
  put_u64(b, key);
  put_u32(b, static_cast<uint32_t>(k.name_expressions.size()));
  for (size_t i = 0; i < k.name_expressions.size(); ++i) {
    put_str(b, k.name_expressions[i]);
    put_str(b, k.lowered_names[i]);
  }
  put_u64(b, k.cubin.size());
  b.append(k.cubin.data(), k.cubin.size());
  put_u64(b, Hash64::of(b.data(), b.size()));
  return b;
}

// Parses a cache entry; returns false on any inconsistency (truncation, bad checksum, wrong key).
bool deserialize(const std::string& b, uint64_t key, CompiledKernels* out) {
  size_t pos = 0;
  // Written so a huge n from a corrupt file cannot overflow the sum.
  auto need = [&](size_t n) { return pos <= b.size() && n <= b.size() - pos; };
  auto get_u32 = [&](uint32_t* v) {
    if (!need(4)) return false;
    std::memcpy(v, b.data() + pos, 4);
    pos += 4;
    return true;
  };
  auto get_u64 = [&](uint64_t* v) {
    if (!need(8)) return false;
    std::memcpy(v, b.data() + pos, 8);
    pos += 8;
    return true;
  };
  auto get_str = [&](std::string* s) {
    uint32_t n;
    if (!get_u32(&n) || !need(n)) return false;
    s->assign(b.data() + pos, n);
    pos += n;
    return true;
  };
  if (b.size() < sizeof(kMagic) + 8 || std::memcmp(b.data(), kMagic, sizeof(kMagic)) != 0)
    return false;
  const uint64_t stored_sum = [&] {
    uint64_t v;
    std::memcpy(&v, b.data() + b.size() - 8, 8);
    return v;
  }();
  if (Hash64::of(b.data(), b.size() - 8) != stored_sum) return false;
  pos = sizeof(kMagic);
  uint32_t version, count;
  uint64_t stored_key, cubin_size;
  if (!get_u32(&version) || version != kFormatVersion) return false;
  if (!get_u64(&stored_key) || stored_key != key) return false;
  if (!get_u32(&count)) return false;
  for (uint32_t i = 0; i < count; ++i) {
    std::string e, l;
    if (!get_str(&e) || !get_str(&l)) return false;
    out->name_expressions.push_back(e);
    out->lowered_names.push_back(l);
  }
  if (!get_u64(&cubin_size) || !need(cubin_size)) return false;
  out->cubin.assign(b.data() + pos, b.data() + pos + cubin_size);
  pos += cubin_size;
  return pos + 8 == b.size();
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

CUfunction LoadedModule::function(const std::string& name_expression) const {
  auto it = functions.find(name_expression);
  check(it != functions.end(), "kernel ", name_expression, " is not in its JIT module");
  return it->second;
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("FLASHKV_CACHE_DIR"); d && *d) return d;
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/flashkv";
  // Per user: a shared world-writable directory would let another user plant cubins.
  return "/tmp/flashkv-cache-" + std::to_string(getuid());
}

namespace {
// The `#include "..."` targets named in `text` (all kernel includes are relative to kernels/).
std::vector<std::string> quoted_includes(std::string_view text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = text.find("#include", pos)) != std::string_view::npos) {
    pos += 8;
    const size_t open = text.find_first_not_of(" \t", pos);
    if (open == std::string_view::npos || text[open] != '"') continue;
    const size_t close = text.find('"', open + 1);
    if (close == std::string_view::npos) break;
    out.emplace_back(text.substr(open + 1, close - open - 1));
    pos = close;
  }
  return out;
}
}  // namespace

uint64_t included_sources_hash(const std::string& source) {
  // Only the embedded headers `source` reaches (transitively) enter the key, so editing the
  // prefill kernel does not invalidate cached decode cubins. A header not found is skipped here
  // (NVRTC reports it); a preprocessor-conditional include is hashed either way (conservative).
  static const std::map<std::string_view, std::string_view> files = [] {
    std::map<std::string_view, std::string_view> m;
    for (const auto& f : embedded_kernel_files()) m.emplace(f.path, f.source);
    return m;
  }();
  std::set<std::string> seen;
  std::vector<std::string> todo = quoted_includes(source);
  while (!todo.empty()) {
    std::string path = std::move(todo.back());
    todo.pop_back();
    if (!seen.insert(path).second) continue;
    auto it = files.find(path);
    if (it == files.end()) continue;
    for (auto& inc : quoted_includes(it->second)) todo.push_back(std::move(inc));
  }
  Hash64 st;
  for (const auto& path : seen) {  // std::set: sorted, so the order is deterministic
    auto it = files.find(path);
    if (it == files.end()) continue;
    st.update(path.c_str(), path.size() + 1);
    st.update(it->second.data(), it->second.size());
  }
  return st.digest();
}

std::string device_arch(int device) {
  const Driver& d = driver();
  CUdevice dev;
  check_cu(d.cuDeviceGet(&dev, device), "cuDeviceGet");
  int major = 0, minor = 0;
  check_cu(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
           "cuDeviceGetAttribute");
  check_cu(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
           "cuDeviceGetAttribute");
  // Architecture-specific targets (sm_90a, sm_100a) unlock wgmma/setmaxnreg; the cubin is then
  // only valid on that exact architecture, which is the device we are compiling for.
  return "sm_" + std::to_string(major) + std::to_string(minor) + (major >= 9 ? "a" : "");
}

KernelCache& KernelCache::instance() {
  static KernelCache cache;
  return cache;
}

KernelCache::KernelCache() {
  dir_ = default_cache_dir();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || access(dir_.c_str(), W_OK) != 0) {
    if (!quiet())
      std::fprintf(stderr, "flashkv: kernel cache dir %s is not writable; caching in memory only\n",
                   dir_.c_str());
    dir_.clear();
  }
}

std::string KernelCache::directory() const { return dir_; }

JitStats KernelCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

KernelCache::CompiledPtr KernelCache::compiled(const std::string& id, const std::string& arch,
                                               const RequestFactory& make, bool* cold) {
  const std::string mem_key = id + "@" + arch;
  std::promise<CompiledPtr> promise;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (auto it = compiled_.find(mem_key); it != compiled_.end()) {
      *cold = false;
      return it->second;
    }
    if (auto it = pending_.find(mem_key); it != pending_.end()) {
      // Another thread is compiling this id: wait for it (its error, if any, is rethrown here).
      std::shared_future<CompiledPtr> f = it->second;
      lock.unlock();
      *cold = false;
      return f.get();
    }
    pending_.emplace(mem_key, promise.get_future().share());
  }
  try {
    CompiledPtr result = load_or_compile(id, arch, make, cold);
    std::lock_guard<std::mutex> lock(mu_);
    compiled_[mem_key] = result;
    pending_.erase(mem_key);
    promise.set_value(result);
    return result;
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(mem_key);
    promise.set_exception(std::current_exception());
    throw;
  }
}

KernelCache::CompiledPtr KernelCache::load_or_compile(const std::string& id,
                                                      const std::string& arch,
                                                      const RequestFactory& make, bool* cold) {
  CompileRequest req = make();
  req.arch = arch;
  if (req.key_name.empty()) req.key_name = id;
  const uint64_t key = request_hash(req);
  const std::string path = dir_.empty() ? "" : dir_ + "/" + hex(key) + ".fkvbin";
  auto result = std::make_shared<CompiledKernels>();
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      if (deserialize(ss.str(), key, result.get())) {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.disk_hits;
        *cold = false;
        return result;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.corrupt_entries;
      }
      if (!quiet())
        std::fprintf(stderr, "flashkv: cache entry %s is corrupt; recompiling\n", path.c_str());
      *result = CompiledKernels{};
    }
  }
  if (!quiet())
    std::fprintf(stderr, "flashkv: compiling %s for %s ...\n", id.c_str(), arch.c_str());
  *result = nvrtc_compile(req);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.compiles;
    stats_.compile_ms += result->compile_ms;
  }
  if (!quiet())
    std::fprintf(stderr, "flashkv: compiled %s in %.0f ms\n", id.c_str(), result->compile_ms);
  *cold = true;
  if (!path.empty()) {
    // Temp file + rename: readers see either the old entry, no entry, or the complete new one.
    std::ostringstream tmp;
    tmp << path << ".tmp." << getpid() << "."
        << std::hash<std::thread::id>{}(std::this_thread::get_id());
    const std::string data = serialize(key, *result);
    {
      std::ofstream out(tmp.str(), std::ios::binary | std::ios::trunc);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
    }
    std::error_code ec;
    fs::rename(tmp.str(), path, ec);
    if (ec) fs::remove(tmp.str(), ec);
  }
  return result;
}

const LoadedModule& KernelCache::module(const std::string& id, int device,
                                        const RequestFactory& make) {
  const std::string loaded_key = id + "@" + std::to_string(device);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = loaded_.find(loaded_key); it != loaded_.end()) {
      ++stats_.memory_hits;
      return *it->second;
    }
    ensure_context(device);
  }
  bool cold = false;
  auto ck = compiled(id, device_arch(device), make, &cold);  // NVRTC without the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = loaded_.find(loaded_key); it != loaded_.end()) return *it->second;  // raced
  ensure_context(device);  // current on this thread for the load
  const Driver& d = driver();
  auto mod = std::make_unique<LoadedModule>();
  check_cu(d.cuModuleLoadData(&mod->module, ck->cubin.data()), "cuModuleLoadData(" + id + ")");
  for (size_t i = 0; i < ck->name_expressions.size(); ++i) {
    CUfunction f;
    check_cu(d.cuModuleGetFunction(&f, mod->module, ck->lowered_names[i].c_str()),
             "cuModuleGetFunction(" + id + ": " + ck->name_expressions[i] + ")");
    mod->functions[ck->name_expressions[i]] = f;
  }
  auto& ref = *mod;
  loaded_[loaded_key] = std::move(mod);
  return ref;
}

std::string KernelCache::entry_path(const std::string& id, const std::string& arch,
                                    const RequestFactory& make) const {
  if (dir_.empty()) return "";
  CompileRequest req = make();
  req.arch = arch;
  if (req.key_name.empty()) req.key_name = id;
  return dir_ + "/" + hex(request_hash(req)) + ".fkvbin";
}

bool KernelCache::precompile(const std::string& id, const std::string& arch,
                             const RequestFactory& make) {
  bool cold = false;
  compiled(id, arch, make, &cold);
  return cold;
}

}  // namespace flashkv::runtime
