// HostTensor: a contiguous tensor in host memory that owns its storage, for the CPU reference,
// the tests and the CLI (users with their own tensors pass TensorViews instead).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/tensor.h"

namespace flashkv {

// splitmix64: tiny, and unlike std::uniform_real_distribution it gives the same numbers on every
// standard library, so a failing seed reproduces everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t state_;
};

// A contiguous host tensor that owns its storage. Copies are deep; views() taken before a move
// stay valid after it (the heap buffer moves with the vector).
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  // A contiguous CPU view (the view is mutable: tests hand it to ops as an output too).
  TensorView view() const;

  double get(int64_t i) const { return load_as_double(storage_.data(), dtype_, i); }
  void set(int64_t i, double x) { store_from_double(storage_.data(), dtype_, i, x); }

  // Uniform values in [lo, hi], rounded to the dtype (so what is stored is exactly what any
  // reference reads) and never zero: a zero hides a missed load or a missing scale.
  // Deterministic for a given seed on every platform; fills blocks of 64Ki elements in
  // parallel, each from its own stream, so the values do not depend on the thread count.
  HostTensor& fill_random(uint64_t seed, double lo = -1.0, double hi = 1.0);
  // NaN everywhere (i32: INT32_MIN), so an output element a kernel forgot to write is caught.
  HostTensor& fill_poison();
  HostTensor& fill(double x);
  std::vector<double> to_doubles() const;

 private:
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::vector<std::byte> storage_;
};

// ||a - b||_F / ||b||_F (||a - b||_F when b is all zero). Positions where a and b hold the same
// non-finite value (e.g. lse = -inf of an empty row) count as equal; any other NaN or infinity
// gives +inf. Sizes must match.
double relative_error(const std::vector<double>& a, const std::vector<double>& b);
bool any_nan(const std::vector<double>& a);

}  // namespace flashkv
