#include "flashkv/host_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "core/parallel.h"

namespace flashkv {
namespace {

// Whether the element at `p` of floating dtype `t` is +0 or -0: every bit but the sign is clear.
// Reading the bits is much cheaper than decoding the value (27 ns for an f16).
bool is_zero(const std::byte* p, DType t) {
  switch (dtype_size(t)) {
    case 1:
      return (static_cast<uint8_t>(*p) & 0x7f) == 0;
    case 2: {
      uint16_t bits;
      std::memcpy(&bits, p, sizeof(bits));
      return (bits & 0x7fff) == 0;
    }
    default: {
      uint32_t bits;
      std::memcpy(&bits, p, sizeof(bits));
      return (bits & 0x7fffffff) == 0;
    }
  }
}

// fill_random draws each block of this many elements from its own stream, so blocks fill in
// parallel and the values depend only on the seed and the position, not on the thread count.
constexpr int64_t kFillBlock = int64_t{1} << 16;

}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = 1;
  for (int64_t s : shape_) {
    if (s < 0) throw std::invalid_argument("HostTensor: negative dimension");
    numel_ *= s;
  }
  // Never empty, so even a tensor with no elements has a non-null data pointer and its view is
  // "defined"; 16 bytes of slack also keep every buffer 16-byte aligned in size.
  storage_.resize(std::max<size_t>(nbytes(), 16));
}

TensorView HostTensor::view() const {
  return TensorView(const_cast<std::byte*>(storage_.data()), dtype_,
                    static_cast<int>(shape_.size()), shape_.data(), /*strides=*/nullptr,
                    Device::cpu());
}

HostTensor& HostTensor::fill_random(uint64_t seed, double lo, double hi) {
  // Block b's stream starts at seed ^ (b * odd constant): block 0 is SplitMix64(seed) itself,
  // so a tensor of up to kFillBlock elements holds what a single sequential stream gives.
  const int64_t num_blocks = (numel_ + kFillBlock - 1) / kFillBlock;
  const size_t bytes = dtype_size(dtype_);
  detail::parallel_for(num_blocks, [&](int64_t b) {
    SplitMix64 rng(seed ^ (static_cast<uint64_t>(b) * 0xD1B54A32D192ED03ull));
    for (int64_t i = b * kFillBlock; i < std::min(numel_, (b + 1) * kFillBlock); ++i) {
      // Redraw values that round to zero; a range that only holds zero is a test bug.
      int attempts = 0;
      do {
        if (++attempts > 64) throw std::invalid_argument("fill_random: range rounds to zero");
        set(i, lo + (hi - lo) * rng.uniform());
      } while (dtype_ == DType::i32 ? get(i) == 0.0 : is_zero(storage_.data() + i * bytes, dtype_));
    }
  });
  return *this;
}

HostTensor& HostTensor::fill_poison() {
  return fill(dtype_ == DType::i32 ? std::numeric_limits<int32_t>::min()
                                   : std::numeric_limits<double>::quiet_NaN());
}

HostTensor& HostTensor::fill(double x) {
  for (int64_t i = 0; i < numel_; ++i) set(i, x);
  return *this;
}

std::vector<double> HostTensor::to_doubles() const {
  std::vector<double> out(numel_);
  for (int64_t i = 0; i < numel_; ++i) out[i] = get(i);
  return out;
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw std::invalid_argument("relative_error: size mismatch");
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      if (a[i] == b[i]) continue;  // the same infinity (NaN never compares equal)
      return std::numeric_limits<double>::infinity();
    }
    diff2 += (a[i] - b[i]) * (a[i] - b[i]);
    ref2 += b[i] * b[i];
  }
  return ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
}

bool any_nan(const std::vector<double>& a) {
  return std::any_of(a.begin(), a.end(), [](double x) { return std::isnan(x); });
}

}  // namespace flashkv
