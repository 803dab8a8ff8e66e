// A CUDA stream destroyed at scope exit, also when a plan() or run() in its scope throws: the
// tests' and the CLI's (verify, fuzz) way to run an op on a stream of its own.
#pragma once

#include "flashkv/runtime.h"

namespace flashkv {

class ScopedStream {
 public:
  ScopedStream() : s_(create_stream()) {}
  ~ScopedStream() { destroy_stream(s_); }
  ScopedStream(const ScopedStream&) = delete;
  ScopedStream& operator=(const ScopedStream&) = delete;
  operator Stream() const { return s_; }

 private:
  Stream s_;
};

}  // namespace flashkv
