#include "reference/tolerance.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "flashkv/host_tensor.h"

namespace flashkv::reference {

double tolerance_floor(DType compute_dtype) {
  switch (compute_dtype) {
    case DType::f32:
      return 1e-6;
    case DType::f16:
      return 0x1.0p-11;
    case DType::bf16:
    case DType::e4m3:
    case DType::e5m2:
      return 0x1.0p-8;
    default:
      throw std::invalid_argument("tolerance_floor: not a floating dtype");
  }
}

std::string ToleranceCheck::str() const {
  std::ostringstream os;
  os << "rel_err " << err << (pass ? " <= " : " > ") << "bound " << bound
     << " (err of the reference rounded to the output dtype: " << err_lowp << ")";
  return os.str();
}

ToleranceCheck check_tolerance(const std::vector<double>& out, const std::vector<double>& ref,
                               const std::vector<double>& ref_lowp, double floor) {
  ToleranceCheck r;
  r.err = relative_error(out, ref);
  r.err_lowp = relative_error(ref_lowp, ref);
  r.bound = std::min(2.0 * r.err_lowp + floor, kMaxRelTolerance);
  r.pass = r.err <= r.bound;  // false for NaN
  return r;
}

}  // namespace flashkv::reference
