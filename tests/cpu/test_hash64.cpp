// runtime/hash64.h: the kernel cache's key hash. The test binary is built without
// FLASHKV_HAVE_XXHASH (that define is the library's), so this checks the FNV-1a fallback that
// builds without xxhash.h use (the library's own xxHash path runs in every JIT test).
#include <gtest/gtest.h>

#include <string>

#include "runtime/hash64.h"

namespace flashkv::runtime {
namespace {

TEST(Hash64, FallbackIsFnv1a64) {
#ifndef FLASHKV_HAVE_XXHASH
  // The published FNV-1a 64-bit test vectors.
  EXPECT_EQ(Hash64::of("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(Hash64::of("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Hash64::of("foobar", 6), 0x85944171f73967e8ull);
#else
  GTEST_SKIP() << "built with xxHash";
#endif
}

TEST(Hash64, StreamingEqualsOneShotAndInputsDiffer) {
  const std::string s = "flashkv::DecodeTCConfig<__half, __half, 128, 4, 16> sm_90a";
  Hash64 h;
  h.update(s.data(), 10);
  h.update(s.data() + 10, s.size() - 10);
  EXPECT_EQ(h.digest(), Hash64::of(s.data(), s.size()));
  std::string t = s;
  t.back() = 'b';
  EXPECT_NE(Hash64::of(t.data(), t.size()), Hash64::of(s.data(), s.size()));
}

}  // namespace
}  // namespace flashkv::runtime
