// `flashkv fuzz`: how one configuration's results are judged. Every output is held to STYLE.md's
// tolerance rule (reference/tolerance.h: never looser than 1e-2 relative, NaN never passes),
// per request where the op has requests (a batch-wide norm dilutes one wrong request), an empty
// request's rows absolutely (its reference is 0); LSE within kLseTolerance; caches bitwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashkv/host_tensor.h"

namespace flashkv::cli {

// LSE is computed in f32 from inputs the reference sees exactly: within 1e-3 of max(1, |lse|)
// per element, as the variant GPU tests hold it (f32 accumulation over long rows). With RoPE in
// the kernel the rotated q and k are rounded to q's dtype (variant.cuh), so every logit carries
// that rounding: 2 unit roundoffs of the dtype there (bf16: 7.8e-3).
inline constexpr double kLseTolerance = 1e-3;
double lse_tolerance(DType q_dtype, bool rope);

struct FuzzOutcome {
  bool pass = true;
  double worst = 0;    // the largest err / bound of any check (> 1: failed)
  std::string detail;  // the failed checks, or the error an op raised

  void fail(const std::string& why);
  // `got` (an output in the kernel's dtype) against `ref` (the reference written to f32) with
  // the tolerance floor of `compute_dtype`, separately on each row range [rows[i], rows[i + 1])
  // (rows empty: the whole tensor); a row is numel / shape[0] elements.
  void check_output(const std::string& name, const HostTensor& got, const HostTensor& ref,
                    DType compute_dtype, const std::vector<int64_t>& rows = {});
  // LSE per element: |got - ref| <= tol * max(1, |ref|); an infinite ref (a row that sees no
  // key) must be matched exactly; NaN fails.
  void check_lse(const std::string& name, const HostTensor& got, const HostTensor& ref, double tol);
  // Each element within one unit in the last place of the tensors' dtype (f16, bf16, fp8).
  void check_ulps(const std::string& name, const HostTensor& got, const HostTensor& ref);
  // Relative error of two f32 tensors (equal infinities count as equal): the CPU-only checks.
  void check_close(const std::string& name, const HostTensor& got, const HostTensor& ref,
                   double tol);
  // Bit for bit.
  void check_bitwise(const std::string& name, const HostTensor& got, const HostTensor& ref);
};

// `t` rounded to `dtype` element by element (what writing the f32 reference to a tensor of the
// output's dtype gives).
HostTensor rounded_to(const HostTensor& t, DType dtype);
// Prefix sums of `lens` (qo_indptr-style), as int64 row offsets.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& lens);

}  // namespace flashkv::cli
