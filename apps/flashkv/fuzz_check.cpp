#include "fuzz_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "reference/tolerance.h"

namespace flashkv::cli {

void FuzzOutcome::fail(const std::string& why) {
  pass = false;
  worst = std::max(worst, 2.0);
  detail += (detail.empty() ? "" : "; ") + why;
}

void FuzzOutcome::check_output(const std::string& name, const HostTensor& got,
                               const HostTensor& ref, DType compute_dtype,
                               const std::vector<int64_t>& rows) {
  if (got.numel() != ref.numel()) return fail(name + ": size differs from the reference");
  const std::vector<double> g = got.to_doubles(), r = ref.to_doubles(),
                            lowp = rounded_to(ref, got.dtype()).to_doubles();
  const int64_t n0 = got.shape().empty() ? 1 : got.shape()[0];
  const int64_t row = n0 > 0 ? got.numel() / n0 : 0;
  const std::vector<int64_t> seg = rows.empty() ? std::vector<int64_t>{0, n0} : rows;
  const double floor = reference::tolerance_floor(compute_dtype);
  for (size_t i = 0; i + 1 < seg.size(); ++i) {
    const auto b = static_cast<size_t>(seg[i] * row), e = static_cast<size_t>(seg[i + 1] * row);
    if (b == e) continue;
    const std::vector<double> gs(g.begin() + b, g.begin() + e), rs(r.begin() + b, r.begin() + e),
        ls(lowp.begin() + b, lowp.begin() + e);
    const reference::ToleranceCheck t = reference::check_tolerance(gs, rs, ls, floor);
    worst = std::max(worst, std::isnan(t.err) ? 1e9 : t.err / t.bound);
    if (!t.pass) {
      std::ostringstream os;
      os << name;
      if (seg.size() > 2) os << " request " << i;
      os << ": " << t.str();
      fail(os.str());
    }
  }
}

void FuzzOutcome::check_close(const std::string& name, const HostTensor& got, const HostTensor& ref,
                              double tol) {
  if (got.numel() != ref.numel()) return fail(name + ": size differs from the reference");
  const double err = relative_error(got.to_doubles(), ref.to_doubles());
  worst = std::max(worst, std::isnan(err) ? 1e9 : err / tol);
  if (!(err <= tol)) {
    std::ostringstream os;
    os << name << ": rel_err " << err << " > " << tol;
    fail(os.str());
  }
}

double lse_tolerance(DType q_dtype, bool rope) {
  return rope ? std::max(kLseTolerance, 2 * reference::tolerance_floor(q_dtype)) : kLseTolerance;
}

void FuzzOutcome::check_lse(const std::string& name, const HostTensor& got, const HostTensor& ref,
                            double tol) {
  if (got.numel() != ref.numel()) return fail(name + ": size differs from the reference");
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), r = ref.get(i);
    const double d = std::isinf(r) ? (g == r ? 0.0 : 1e9) : std::abs(g - r);  // NaN: d is NaN
    const double ratio = d / (tol * std::max(1.0, std::abs(r)));
    worst = std::max(worst, std::isnan(ratio) ? 1e9 : ratio);
    if (!(ratio <= 1.0) && bad++ == 0) first = i;
  }
  if (bad > 0) {
    std::ostringstream os;
    os << name << ": " << bad << " elements off by more than " << tol << " x max(1, |lse|), the "
       << "first [" << first << "] = " << got.get(first) << ", expected " << ref.get(first);
    fail(os.str());
  }
}

void FuzzOutcome::check_ulps(const std::string& name, const HostTensor& got,
                             const HostTensor& ref) {
  if (got.nbytes() != ref.nbytes() || got.dtype() != ref.dtype())
    return fail(name + ": size or dtype differs from the reference");
  const size_t elem = dtype_size(got.dtype());
  // Sign-magnitude bit patterns as ordered integers: neighbouring values differ by 1.
  auto ordered = [&](const void* base, int64_t i) {
    uint32_t bits = 0;
    std::memcpy(&bits, static_cast<const unsigned char*>(base) + i * elem, elem);
    const uint32_t sign = 1u << (8 * elem - 1);
    return (bits & sign) ? -static_cast<int64_t>(bits & ~sign) : static_cast<int64_t>(bits);
  };
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::abs(ordered(got.data(), i) - ordered(ref.data(), i)) > 1) {
      std::ostringstream os;
      os << name << ": element " << i << " is " << got.get(i) << ", more than one unit in the "
         << "last place from " << ref.get(i);
      return fail(os.str());
    }
  }
}

void FuzzOutcome::check_bitwise(const std::string& name, const HostTensor& got,
                                const HostTensor& ref) {
  if (got.nbytes() != ref.nbytes()) return fail(name + ": size differs from the reference");
  const auto* a = static_cast<const unsigned char*>(got.data());
  const auto* b = static_cast<const unsigned char*>(ref.data());
  const size_t elem = dtype_size(got.dtype());
  for (size_t i = 0; i < got.nbytes(); ++i) {
    if (a[i] != b[i]) {
      std::ostringstream os;
      os << name << ": element " << i / elem << " differs (" << got.get(i / elem) << " vs "
         << ref.get(i / elem) << ")";
      return fail(os.str());
    }
  }
}

HostTensor rounded_to(const HostTensor& t, DType dtype) {
  HostTensor r(dtype, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
  return r;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& lens) {
  std::vector<int64_t> o{0};
  for (int64_t l : lens) o.push_back(o.back() + l);
  return o;
}

}  // namespace flashkv::cli
