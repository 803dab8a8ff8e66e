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

// LSE is computed in f32 from inputs the reference sees exactly: 1e-3 relative leaves room for
// f32 accumulation over long rows and for fused RoPE (q rotated, then rounded to its dtype).
inline constexpr double kLseTolerance = 1e-3;

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
  // Relative error of two LSE (or any f32) tensors (equal infinities count as equal).
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
