// TensorView: a non-owning view of a strided tensor on the host or on a CUDA device.
//
// flashkv never allocates or frees user tensors; it reads shapes, strides (in elements) and the
// device from views like this one. All shape/dtype/device/stride checks live here, once, and every
// check names the argument it is checking (e.g. "q", "paged_kv.k") in its error message.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "flashkv/dtype.h"

namespace flashkv {

struct Device {
  enum class Kind : uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  std::string str() const;  // "cpu" or "cuda:N"
  bool operator==(const Device&) const = default;
};

class TensorView {
 public:
  static constexpr int kMaxDims = 6;

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             Device device = Device::cpu());
  // View with explicit element strides; `strides` must have as many entries as `shape`.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides, Device device = Device::cpu());
  // Same, from arrays (for code that builds shapes at run time).
  TensorView(void* data, DType dtype, int ndim, const int64_t* shape, const int64_t* strides,
             Device device);

  bool defined() const { return data_ != nullptr || ndim_ > 0; }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int dim) const;    // negative dims count from the end
  int64_t stride(int dim) const;  // in elements
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  // A view of a sub-range [begin, end) of dimension 0 (same strides).
  TensorView slice0(int64_t begin, int64_t end) const;
  std::string shape_str() const;  // "[2, 32, 128]"
  std::string str() const;        // "f16[2, 32, 128] on cuda:0"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_{};
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

// --- checks (each throws flashkv::Error naming `name` and what was expected) ---
void check_defined(const TensorView& t, const char* name);
void check_dtype(const TensorView& t, const char* name, DType expected);
// Any of the given dtypes.
void check_dtype_in(const TensorView& t, const char* name, std::initializer_list<DType> allowed);
void check_ndim(const TensorView& t, const char* name, int ndim);
// `expected` entries < 0 are wildcards. Also checks ndim.
void check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected);
void check_device(const TensorView& t, const char* name, Device expected);
void check_contiguous(const TensorView& t, const char* name);
// The last dimension has stride 1 (rows may be strided), as vectorized kernels need.
void check_last_dim_contiguous(const TensorView& t, const char* name);
// The data pointer is aligned to `bytes` (16 for 16-byte vector loads).
void check_aligned(const TensorView& t, const char* name, size_t bytes);

}  // namespace flashkv
