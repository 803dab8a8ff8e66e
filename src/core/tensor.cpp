// TensorView and the shared argument checks. Every message starts with the argument's name so a
// user who passed the wrong tensor knows which one without reading our source. Messages that
// format a shape are built only on failure (`if (!ok) fail(...)`, not check(ok, ..., str(x)),
// whose arguments C++ evaluates eagerly): views are made on every run() of every layer.
#include "flashkv/tensor.h"

#include <cstdint>
#include <sstream>

#include "flashkv/error.h"

namespace flashkv {
namespace {

std::string dims_str(int ndim, const int64_t* dims) {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << dims[i];
  os << ']';
  return os.str();
}

// Shape with wildcards (< 0) printed as '*', for "expected shape [*, 16, 8, 128]".
std::string pattern_str(std::initializer_list<int64_t> dims) {
  std::ostringstream os;
  os << '[';
  bool first = true;
  for (int64_t d : dims) {
    os << (first ? "" : ", ");
    if (d < 0) {
      os << '*';
    } else {
      os << d;
    }
    first = false;
  }
  os << ']';
  return os.str();
}

void check_ndim_limit(int ndim) {
  check(ndim >= 0 && ndim <= TensorView::kMaxDims, "TensorView: ndim must be in [0, ",
        TensorView::kMaxDims, "], got ", ndim);
}

}  // namespace

std::string Device::str() const {
  return kind == Kind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

TensorView::TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device)
    : data_(data), dtype_(dtype), device_(device) {
  check_ndim_limit(static_cast<int>(shape.size()));
  ndim_ = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    if (s < 0) fail("TensorView: shape entries must be >= 0, got ", pattern_str(shape));
    shape_[i++] = s;
  }
  // Row-major: the last dimension is the fastest.
  int64_t stride = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    strides_[d] = stride;
    stride *= shape_[d];
  }
}

TensorView::TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides, Device device)
    : data_(data), dtype_(dtype), device_(device) {
  check_ndim_limit(static_cast<int>(shape.size()));
  if (shape.size() != strides.size()) {
    fail("TensorView: shape ", pattern_str(shape), " has ", shape.size(), " dims but ",
         strides.size(), " strides were given");
  }
  ndim_ = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    if (s < 0) fail("TensorView: shape entries must be >= 0, got ", pattern_str(shape));
    shape_[i++] = s;
  }
  i = 0;
  for (int64_t s : strides) strides_[i++] = s;
}

TensorView::TensorView(void* data, DType dtype, int ndim, const int64_t* shape,
                       const int64_t* strides, Device device)
    : data_(data), dtype_(dtype), device_(device) {
  check_ndim_limit(ndim);
  ndim_ = ndim;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0) fail("TensorView: shape entries must be >= 0, got ", dims_str(ndim, shape));
    shape_[d] = shape[d];
  }
  if (strides != nullptr) {
    for (int d = 0; d < ndim; ++d) strides_[d] = strides[d];
  } else {
    // A null stride array means contiguous; handy when converting from DLPack (strides == NULL).
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      strides_[d] = stride;
      stride *= shape_[d];
    }
  }
}

int64_t TensorView::size(int dim) const {
  const int d = dim < 0 ? dim + ndim_ : dim;
  // shape_str() only on failure: size() and stride() sit in per-element loops.
  if (d < 0 || d >= ndim_) {
    fail("TensorView::size: dim ", dim, " is out of range for a ", ndim_, "-d tensor ",
         shape_str());
  }
  return shape_[d];
}

int64_t TensorView::stride(int dim) const {
  const int d = dim < 0 ? dim + ndim_ : dim;
  // shape_str() only on failure: size() and stride() sit in per-element loops.
  if (d < 0 || d >= ndim_) {
    fail("TensorView::stride: dim ", dim, " is out of range for a ", ndim_, "-d tensor ",
         shape_str());
  }
  return strides_[d];
}

int64_t TensorView::numel() const {
  // An undefined view holds nothing; a defined 0-d view is a scalar.
  if (!defined()) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool TensorView::is_contiguous() const {
  // Strides of size-1 dimensions never matter, and an empty tensor has no layout to speak of
  // (PyTorch uses the same rule, so views coming from it agree with torch's is_contiguous()).
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

TensorView TensorView::slice0(int64_t begin, int64_t end) const {
  check(ndim_ >= 1, "TensorView::slice0: needs at least 1 dimension, got a 0-d tensor");
  check(0 <= begin && begin <= end && end <= shape_[0], "TensorView::slice0: range [", begin, ", ",
        end, ") is out of bounds for dimension 0 of size ", shape_[0]);
  TensorView out = *this;
  out.shape_[0] = end - begin;
  if (data_ != nullptr) {
    const int64_t offset = begin * strides_[0] * static_cast<int64_t>(dtype_size(dtype_));
    out.data_ = static_cast<char*>(data_) + offset;
  }
  return out;
}

std::string TensorView::shape_str() const { return dims_str(ndim_, shape_.data()); }

std::string TensorView::str() const {
  return std::string(dtype_name(dtype_)) + shape_str() + " on " + device_.str();
}

// --- checks ---------------------------------------------------------------------------------

void check_defined(const TensorView& t, const char* name) {
  check(t.defined(), name, ": expected a tensor, got an undefined (empty) view");
}

void check_dtype(const TensorView& t, const char* name, DType expected) {
  check(t.dtype() == expected, name, ": expected dtype ", dtype_name(expected), ", got ",
        dtype_name(t.dtype()));
}

void check_dtype_in(const TensorView& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (t.dtype() == d) return;
  }
  std::ostringstream os;
  bool first = true;
  for (DType d : allowed) {
    os << (first ? "" : " or ") << dtype_name(d);
    first = false;
  }
  fail(name, ": expected dtype ", os.str(), ", got ", dtype_name(t.dtype()));
}

void check_ndim(const TensorView& t, const char* name, int ndim) {
  if (!(t.ndim() == ndim)) {
    fail(name, ": expected ", ndim, "-d tensor, got ", t.ndim(), "-d with shape ", t.shape_str());
  }
}

void check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected) {
  bool ok = t.ndim() == static_cast<int>(expected.size());
  int d = 0;
  for (int64_t e : expected) {
    if (!ok) break;
    ok = e < 0 || t.size(d) == e;
    ++d;
  }
  if (!(ok)) {
    fail(name, ": expected shape ", pattern_str(expected), ", got ", t.shape_str());
  }
}

void check_device(const TensorView& t, const char* name, Device expected) {
  if (!(t.device() == expected)) {
    fail(name, ": expected device ", expected.str(), ", got ", t.device().str());
  }
}

void check_contiguous(const TensorView& t, const char* name) {
  if (t.is_contiguous()) return;
  std::ostringstream strides;
  strides << '[';
  for (int d = 0; d < t.ndim(); ++d) strides << (d ? ", " : "") << t.stride(d);
  strides << ']';
  fail(name, ": expected a contiguous tensor, got shape ", t.shape_str(), " with strides ",
       strides.str());
}

void check_last_dim_contiguous(const TensorView& t, const char* name) {
  check(t.ndim() >= 1, name, ": expected at least 1 dimension, got a 0-d tensor");
  // A last dimension of size 1 has no meaningful stride.
  if (!(t.stride(-1) == 1 || t.size(-1) <= 1)) {
    fail(name, ": expected the last dimension to have stride 1, got stride ", t.stride(-1),
         " (shape ", t.shape_str(), ")");
  }
}

void check_aligned(const TensorView& t, const char* name, size_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(t.data());
  if (bytes == 0 || addr % bytes == 0) return;
  std::ostringstream hex;
  hex << std::hex << addr;
  fail(name, ": expected data pointer aligned to ", bytes, " bytes, got address 0x", hex.str(),
       " (", addr % bytes, " bytes past a boundary)");
}

}  // namespace flashkv
