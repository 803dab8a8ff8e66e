// Benchmark plumbing shared by the bench subcommands: device random fill, median timing with
// CUDA events, the ceilings of docs/benchmarks.md, paged KV caches with rotated copies and
// the reference-check tolerance.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flashkv/dtype.h"
#include "flashkv/host_tensor.h"
#include "flashkv/paged_kv.h"
#include "flashkv/runtime.h"

namespace flashkv::cli {

// Fills n elements of `dtype` at `ptr` (device) with uniform values in [lo, hi).
void device_fill_uniform(void* ptr, DType dtype, size_t n, uint64_t seed, float lo, float hi,
                         Stream stream = nullptr);

// Median (and min) of `reps` timed calls of `fn` after `warmup` untimed ones, CUDA events around
// each call. A 200 us GPU spin precedes each start event (as the peers do, flashkv.bench.peers),
// so the events time the GPU's work, not the host's launch path, which host_us reports apart.
struct Timing {
  double median_us = 0, min_us = 0;
  int reps = 0;
  double host_us = 0;  // median host time of one call of fn (its launch path), not in median_us
};
Timing time_on_stream(Stream s, const std::function<void(int rep)>& fn, int warmup = 5,
                      int reps = 30);

struct Ceilings {
  double read_tbps = 0, copy_tbps = 0, gemm_f16_tflops = 0, gemm_bf16_tflops = 0;
  nlohmann::json to_json() const;
};
// Measures the read and copy bandwidth (>= 2 GiB) and the 8192^3 cuBLAS GEMM rates.
Ceilings measure_ceilings(Stream s);

// How many copies of inputs of `bytes_per_copy` to rotate through so that the 50 MB L2 does not
// flatter a kernel (docs/benchmarks.md): enough to cover 200 MB (4x L2), at most 8, at least 1.
int rotation_copies(size_t bytes_per_copy);

// A paged KV cache on the device (NHD, uniform values in [-1, 1)) of `copies` copies: copy c owns
// pages [c * pages_per_copy, (c + 1) * pages_per_copy), and each request's page ids are shuffled
// within the copy (scattered pages, as a real cache has). The page table (indptr, last) is the
// same for every copy; only the page ids differ.
struct BenchPagedKV {
  int num_kv_heads = 0, head_dim = 0, page_size = 0;
  DType dtype = DType::f16;
  KVLayout layout = KVLayout::NHD;  // of every page: NHD [page_size, H, D] or HND [H, page_size, D]
  std::vector<int64_t> lens;        // kv_len per request
  std::vector<int32_t> indptr, last;  // host page table: indptr[batch + 1], last_page_len[batch]
  int64_t pages_per_copy = 0;
  int copies = 1;
  std::vector<std::vector<int32_t>> indices;  // host page ids, per copy
  DeviceBuffer k, v, idx;

  // K and V bytes of one copy, real tokens only.
  size_t kv_bytes() const;
  // Allocates and fills k (seed), v (seed + 1) and the page ids (shuffled by mt19937(seed)).
  void build(int num_copies, uint64_t seed, Stream s);
  // The device cache of copy `c`. indptr / last_page_len views carry shapes only (plan() reads
  // the host arrays).
  PagedKVCache device_view(int c) const;
  // Copies the pages of request r of copy 0, in order, to k_dst / v_dst (host; room for
  // indptr[r+1] - indptr[r] pages each), in the cache's layout.
  void pages_to_host(int r, void* k_dst, void* v_dst) const;
};

// The CPU reference of one request's decode attention: k, v hold its pages in order (NHD
// [pages, page_size, H_kv, D] or HND [pages, H_kv, page_size, D] as `layout` says; at least one
// page), the last holding last_page_len tokens (0: an empty request);
// q [1, H_qo, D]. Returns the f32 output [1, H_qo, D] (what the benchmarks check against).
HostTensor reference_decode_request(const HostTensor& k, const HostTensor& v, int last_page_len,
                                    const HostTensor& q, float sm_scale = 0.f,
                                    KVLayout layout = KVLayout::NHD);

// The tolerance rule of tests/common/test_util.h (STYLE.md): `out` passes iff
//   rel_err(out, ref) <= min(2 * rel_err(ref rounded to dt, ref) + u(dt), 1e-2),
// u the unit roundoff of the dtype the kernel rounds P to (f16 2^-11, bf16 2^-8). `ref` is the
// high-precision reference (f32 or wider).
struct RefCheck {
  double err = 0, err_lowp = 0, bound = 0;
  bool pass = false;
};
RefCheck check_reference(const std::vector<double>& out, const std::vector<double>& ref, DType dt);

}  // namespace flashkv::cli
