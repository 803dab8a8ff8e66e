// parallel_for: the only concurrency of the host-side code (the CPU reference's requests x kv
// heads, HostTensor::fill_random's blocks). Not a public header.
//
// The GPU tests check 128k-token caches against the reference; single-threaded, building and
// checking them took minutes (tests/gpu ran 7+ min, almost all on the CPU).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace flashkv::detail {

// Calls fn(i) once for every i in [0, n), on up to std::thread::hardware_concurrency() threads
// (the caller's among them). Runs inline, in order, when n < 2 or on one core. Each thread takes
// the next index from a shared counter, so a few long items (a 128k-token request next to empty
// ones) do not leave the other threads idle. fn(i) must write only what no other index writes;
// results then do not depend on the thread count. The first exception fn throws is rethrown here
// once every thread has stopped.
template <class Fn>
void parallel_for(int64_t n, Fn&& fn) {
  const int64_t num_threads = std::min<int64_t>(n, std::thread::hardware_concurrency());
  if (num_threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::exception_ptr> errors(num_threads);  // one slot per thread: no lock
  auto worker = [&](int64_t t) {
    try {
      for (int64_t i = next++; i < n; i = next++) fn(i);
    } catch (...) {
      errors[t] = std::current_exception();
      next = n;  // the others stop after their current item
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(num_threads - 1);
  for (int64_t t = 1; t < num_threads; ++t) threads.emplace_back(worker, t);
  worker(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace flashkv::detail
