// A 64-bit streaming hash for the kernel cache's keys and file checksums: xxHash's XXH3 where its
// header is installed (Debian's libxxhash-dev; header-only, no run-time dependency), else a
// 64-bit FNV-1a. The fallback exists because machines that build flashkv without a package index
// have been seen without xxhash.h (the H200 image, whose `pip install .` must work as it is). A
// cache entry is found by its key alone (its file carries the key, name expressions and cubin, not
// the request), so two requests whose keys collide would share an entry: both hashes are 64-bit,
// which makes an accidental collision negligible, but neither is collision-resistant. Builds with
// and without xxHash name the same request differently (a cold cache, never a wrong hit).
// FLASHKV_HAVE_XXHASH is set by CMakeLists.txt when it finds the header.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef FLASHKV_HAVE_XXHASH
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

namespace flashkv::runtime {

class Hash64 {
 public:
#ifdef FLASHKV_HAVE_XXHASH
  Hash64() : st_(XXH3_createState()) { XXH3_64bits_reset(st_); }
  ~Hash64() { XXH3_freeState(st_); }
  void update(const void* data, size_t n) { XXH3_64bits_update(st_, data, n); }
  uint64_t digest() const { return XXH3_64bits_digest(st_); }
#else
  Hash64() = default;
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 0x100000001b3ull;  // FNV-1a, 64-bit prime
  }
  uint64_t digest() const { return h_; }
#endif
  Hash64(const Hash64&) = delete;
  Hash64& operator=(const Hash64&) = delete;

  static uint64_t of(const void* data, size_t n) {
    Hash64 h;
    h.update(data, n);
    return h.digest();
  }

 private:
#ifdef FLASHKV_HAVE_XXHASH
  XXH3_state_t* st_;
#else
  uint64_t h_ = 0xcbf29ce484222325ull;  // FNV-1a offset basis
#endif
};

}  // namespace flashkv::runtime
