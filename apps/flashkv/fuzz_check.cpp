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
