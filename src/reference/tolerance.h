// The tolerance rule of STYLE.md ("Tests that mean something", FA3's rule): how an output of a
// low-precision kernel is compared with the CPU reference. One definition for the GPU tests
// (tests/common/test_util.h) and the CLI (`flashkv fuzz`), which has no GoogleTest. Not a public
// header.
#pragma once

#include <string>
#include <vector>

#include "flashkv/dtype.h"

namespace flashkv::reference {

// An output in a low-precision dtype passes iff
//   rel_err(out, ref) <= min(2 * rel_err(ref_lowp, ref) + floor, kMaxRelTolerance)
// where
//   ref      is the reference computed in high precision (the CPU reference writing to an f32
//            tensor: it accumulates in double and its f32 rounding, ~3e-8, is far below any bound),
//   ref_lowp is the same reference written to a tensor of out's dtype: the error that merely
//            storing the exact answer in that precision costs,
//   floor    covers what a correct kernel adds on top of that: rounding P to the input dtype
//            before the P·V product, f32 accumulation. tolerance_floor(compute_dtype) is one
//            unit roundoff of the dtype the kernel rounds P to, i.e. q's dtype (f16 2^-11,
//            bf16 2^-8, f32 1e-6; fp8 counts as bf16, though fp8 is a KV dtype and q stays 16-bit).
// The cap means the bound is never looser than 1e-2 relative, whatever the other terms say.
// Inputs must be rounded to their dtype before the reference sees them (HostTensor does that).
// Measured (ReferenceTestUtil.ToleranceAdmitsALowPrecisionKernelAndRejectsAMaskBug, D 64,
// kv_len 40/400, causal): a simulated correct kernel has err 2.8e-4 (f16) / 2.3e-3 (bf16) against
// bounds 9.0e-4 / 7.2e-3 (err_lowp 2.0e-4 / 1.6e-3); an off-by-one causal mask gives 5e-2..0.17.
inline constexpr double kMaxRelTolerance = 1e-2;
double tolerance_floor(DType compute_dtype);

struct ToleranceCheck {
  double err = 0;       // rel_err(out, ref)
  double err_lowp = 0;  // rel_err(ref_lowp, ref)
  double bound = 0;     // min(2 * err_lowp + floor, kMaxRelTolerance)
  bool pass = false;    // false whenever err is NaN
  std::string str() const;
};
ToleranceCheck check_tolerance(const std::vector<double>& out, const std::vector<double>& ref,
                               const std::vector<double>& ref_lowp, double floor);

}  // namespace flashkv::reference
