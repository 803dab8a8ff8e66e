// flashkv::Error — the one exception type of the library.
//
// Every public function reports bad input and failed CUDA/NVRTC calls by throwing flashkv::Error
// with a message that names the argument, the index where relevant, and what was expected.
// Nothing in flashkv aborts the process.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace flashkv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A valid request flashkv has no implementation of yet (a quantized KV format no GPU kernel
// reads: kv_quant.h). Python raises NotImplementedError for it; it is still a flashkv::Error.
class NotImplementedError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

// Throws flashkv::Error whose message is the concatenation of `parts`.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(detail::concat(parts...));
}

// Throws flashkv::NotImplementedError whose message is the concatenation of `parts`.
template <class... Parts>
[[noreturn]] void fail_not_implemented(const Parts&... parts) {
  throw NotImplementedError(detail::concat(parts...));
}

// Throws flashkv::Error with the concatenated message when `ok` is false. The message is only
// built on failure, so this is cheap on the hot path.
template <class... Parts>
inline void check(bool ok, const Parts&... parts) {
  if (!ok) fail(parts...);
}

}  // namespace flashkv
