// Helpers shared by every flashkv test (CPU and GPU): an owning host tensor, a paged-cache builder
// with shuffled pages, error metrics, and the tolerance rule of STYLE.md ("Tests that mean
// something", FA3's rule).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/paged_kv.h"
#include "flashkv/tensor.h"

namespace flashkv::test {

// HostTensor (include/flashkv/host_tensor.h) is the owning host tensor every test uses.
using flashkv::any_nan;
using flashkv::HostTensor;

// A 1-d i32 host tensor holding `values`.
HostTensor make_i32(const std::vector<int64_t>& values);
// A host tensor of `dtype` and `shape` holding `values` (rounded to the dtype), row-major.
HostTensor make_tensor(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values);

// A paged KV cache in host memory plus the same logical KV as ragged contiguous tensors.
// Values are drawn per logical position (request, token, head, dim) from `seed`, so two caches
// made with the same seed hold the same logical KV whatever their layout, page order or
// interleaving. Slots past a request's last token and pages no request uses hold random values
// too (not NaN: kernels may legitimately read a whole page and mask, and 0 * NaN is NaN).
struct PagedCacheHost {
  PagedCacheHost() = default;
  PagedCacheHost(PagedCacheHost&&) = default;
  PagedCacheHost& operator=(PagedCacheHost&&) = default;
  // `cache` points into this object's storage: a copy would alias the original.
  PagedCacheHost(const PagedCacheHost&) = delete;
  PagedCacheHost& operator=(const PagedCacheHost&) = delete;

  HostTensor k, v;  // [num_pages, page_size, H_kv, D] (NHD) / [num_pages, H_kv, page_size, D]
  HostTensor kv;    // [num_pages, 2, ...] instead of k and v when interleaved
  HostTensor indptr, indices, last_page_len;  // i32 page table
  HostTensor k_scale, v_scale;                // f32 scale tensors of an fp8 cache, when it has them
  PagedKVCache cache;

  std::vector<int64_t> kv_lens;
  HostTensor k_ragged, v_ragged;  // [sum kv_lens, H_kv, D], requests back to back
  HostTensor kv_indptr;           // i32 [batch + 1] into k_ragged / v_ragged
};

// Pages are shuffled (shuffle_pages) so indices are not the identity, which catches a kernel that
// ignores the page table. The slots past each request's last token hold random values, or NaN
// with nan_padding (a cache from torch.empty: kernels that read whole pages must not let them in).
PagedCacheHost make_paged_cache(const std::vector<int64_t>& kv_lens, int page_size,
                                int num_kv_heads, int head_dim, KVLayout layout, DType dtype,
                                uint64_t seed, bool shuffle_pages = true, bool interleaved = false,
                                bool nan_padding = false);

// relative_error / any_nan of host_tensor.h, under the names the tests use.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  return relative_error(a, b);
}

// The tolerance rule (STYLE.md, after FA3's tests): an output in a low-precision dtype passes iff
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
  bool pass = false;
  std::string str() const;
};
ToleranceCheck check_tolerance(const std::vector<double>& out, const std::vector<double>& ref,
                               const std::vector<double>& ref_lowp, double floor);

// The rule as a GoogleTest assertion, with floor = tolerance_floor(compute_dtype):
//   EXPECT_TRUE(matches_reference(out, ref, ref_lowp, DType::f16));
::testing::AssertionResult matches_reference(const std::vector<double>& out,
                                             const std::vector<double>& ref,
                                             const std::vector<double>& ref_lowp,
                                             DType compute_dtype);

// Runs `fn`, which must throw flashkv::Error, and returns the message (a test failure if it
// does not throw).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected flashkv::Error";
  return "";
}

// `s` with one member replaced: a plan() argument struct (DecodeBatch, PrefillBatch,
// AttentionShape) that is valid but for the field a bad-input test names, e.g.
//   dec.plan(with(batch, &DecodeBatch::batch_size, -1), shape);
template <class S, class M, class V>
S with(S s, M S::*member, const V& value) {
  s.*member = value;
  return s;
}

}  // namespace flashkv::test
