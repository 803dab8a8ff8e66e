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
#include "reference/tolerance.h"

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

// The tolerance rule (STYLE.md, after FA3's tests), shared with the CLI: reference/tolerance.h.
using reference::check_tolerance;
using reference::kMaxRelTolerance;
using reference::tolerance_floor;
using reference::ToleranceCheck;

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

// EXPECT that `stmt` throws flashkv::Error whose message contains `text` (a macro so that the
// failure points at the test's line and `stmt` can be any statement).
#define EXPECT_ERROR_HAS(stmt, text)                                      \
  do {                                                                    \
    const std::string msg_ = ::flashkv::test::error_of([&] { stmt; });    \
    EXPECT_NE(msg_.find(text), std::string::npos) << "message: " << msg_; \
  } while (0)

// `s` with one member replaced: a plan() argument struct (DecodeBatch, PrefillBatch,
// AttentionShape) that is valid but for the field a bad-input test names, e.g.
//   dec.plan(with(batch, &DecodeBatch::batch_size, -1), shape);
template <class S, class M, class V>
S with(S s, M S::*member, const V& value) {
  s.*member = value;
  return s;
}

}  // namespace flashkv::test
