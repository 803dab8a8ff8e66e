// One batch-prefill configuration run on the GPU (paged or ragged KV) and checked against the CPU
// reference.
//
// The inputs (random q ragged by qo_indptr, a paged cache with shuffled pages and the same KV as
// ragged tensors, their device copies) and the reference are built once per case by
// make_prefill_inputs(); run_prefill() then plans and runs either wrapper on them as often as a
// test likes (tile sizes, split options, paged vs ragged), so the reference (the slow part: it
// accumulates in double on the CPU) is computed once.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_util.h"
#include "flashkv/prefill.h"
#include "runtime/scoped_stream.h"

namespace flashkv::test {

// (qo_len, kv_len) per request.
using PrefillRequests = std::vector<std::pair<int64_t, int64_t>>;

struct PrefillCase {
  std::vector<int64_t> qo_lens, kv_lens;  // per request, same size; 0 allowed in both
  int num_qo_heads = 8, num_kv_heads = 2, head_dim = 128, page_size = 16;
  KVLayout layout = KVLayout::NHD;
  DType dtype = DType::f16;    // q, k, v and out
  DType fp8_kv = DType::f32;   // e4m3 / e5m2: k and v in fp8 (paged and ragged); else in dtype
  KVScaleCase scale;           // the fp8 cache's scales (ragged runs pass the same)
  bool interleaved = false;    // one kv[num_pages, 2, ...] tensor instead of k and v
  bool with_lse = true;        // false: run() gets an undefined lse view
  bool nan_padding = false;    // page slots past each request's KV hold NaN (make_paged_cache)
  PrefillPlanOptions opts{};   // opts.causal and opts.sm_scale also drive the reference
  size_t workspace_bytes = 0;  // 0: workspace_bytes(cfg) (never limits splitting)
  uint64_t seed = 1;

  int batch() const { return static_cast<int>(qo_lens.size()); }
  DType kv_dtype() const { return is_fp8_dtype(fp8_kv) ? fp8_kv : dtype; }
  void set_requests(const PrefillRequests& reqs);  // qo_lens and kv_lens from (qo, kv) pairs
  int64_t nnz_qo() const;
  int64_t nnz_kv() const;
  std::string str() const;
};

// Host inputs, their device copies and the reference. Move-only (it owns device buffers).
struct PrefillInputs {
  PrefillCase c;
  PagedCacheHost cache;  // the paged KV plus the same KV ragged (cache.k_ragged, cache.kv_indptr)
  HostTensor qo_indptr;  // i32 [batch + 1]
  HostTensor q;          // [nnz_qo, H_qo, D], random, never zero
  HostTensor ref;        // f32 [nnz_qo, H_qo, D]: reference::batch_prefill_paged in f32
  HostTensor ref_lowp;   // ref rounded to c.dtype
  HostTensor ref_lse;    // f32 [nnz_qo, H_qo]
  DeviceCache dcache;
  DeviceTensor dq, dk_ragged, dv_ragged;
};

// Calls fn on every case of the dtype (f16, bf16) x head_dim (64, 128, 256) x KV heads x causal
// matrix, in that order: `reqs`, num_qo_heads query heads, seeds seed0, seed0 + 1, ...; the
// storage (page size 1/5/16/64, NHD/HND, interleaved) rotates with the case index, independently
// of causal.
void for_each_matrix_case(const PrefillRequests& reqs, int num_qo_heads,
                          std::span<const int> kv_heads, uint64_t seed0,
                          const std::function<void(const PrefillCase&)>& fn);

// Builds everything from c.seed. With `same_data`, whose case must have the same lengths, heads,
// head_dim, dtype, causal, sm_scale and seed (only the storage: page size, layout, interleaving may
// differ), its reference is reused: make_paged_cache draws the KV per logical position from the
// seed, so the logical KV and q are the same and so is the answer.
PrefillInputs make_prefill_inputs(const PrefillCase& c, const PrefillInputs* same_data = nullptr);

enum class PrefillKV { kPaged, kRagged };
const char* prefill_kv_name(PrefillKV kv);

struct PrefillOutcome {
  ToleranceCheck out;
  int64_t out_nan = 0;  // output elements still NaN (unwritten: out was poisoned before run())
  double lse_err = 0;
  bool lse_nan = false;
  // (row, head) pairs whose reference saw no key (lse -inf) but whose output is not exactly
  // out = 0, lse = -inf (attention.h); and how many such pairs the reference has.
  int64_t bad_empty_rows = 0, empty_rows = 0;
  HostTensor out_host;  // the kernel's output, for bitwise comparisons
  HostTensor lse_host;  // the kernel's lse (poison when the case has with_lse = false)
  PrefillPlanInfo plan;
};

// Plans and runs one BatchPrefillPaged / BatchPrefillRagged with `opts` on a fresh workspace, out
// and lse poisoned with NaN first, and compares with the reference. opts.causal and opts.sm_scale
// must be the case's (the reference was computed with them). Paged runs also hand plan() the host
// copy of kv_indices (opts.kv_indices_host / num_pages), which must accept the valid page ids.
PrefillOutcome run_prefill(const PrefillInputs& in, PrefillKV kv, const PrefillPlanOptions& opts);
PrefillOutcome run_prefill(const PrefillInputs& in, PrefillKV kv = PrefillKV::kPaged);

// Asserts: out passes the tolerance rule of test_util.h, lse has no NaN and is within 1e-4
// relative (when requested), and every row that sees no key is exactly (0, -inf).
void expect_prefill_ok(const PrefillInputs& in, const PrefillOutcome& o,
                       const std::string& what = "");

// Builds, runs the paged wrapper with the case's options, checks, and returns the outcome.
PrefillOutcome check_prefill_case(const PrefillCase& c);

// --- helpers for tests that build their own batches (graph tests, sampled long prompts) ---

// `t` rounded to `dtype` element by element. The reference rounds once, at the end, so rounding
// its f32 output is what writing it to a tensor of the dtype gives (up to ties after the f32
// rounding), without a second reference run.
HostTensor rounded_to(const HostTensor& t, DType dtype);
// The (row, head) pairs with ref_lse == -inf whose out row is not all exactly 0 or, when `lse` is
// given, whose lse is not -inf. `empty` (optional) receives how many pairs have ref_lse == -inf.
int64_t count_bad_empty_rows(const HostTensor& out, const HostTensor* lse,
                             const HostTensor& ref_lse, int64_t* empty = nullptr);
// qo_indptr / kv_indptr-style prefix sums of `lens` as an i32 host tensor.
HostTensor indptr_of(const std::vector<int64_t>& lens);
// A BatchPrefillConfig with these limits (and the defaults for the rest).
BatchPrefillConfig prefill_config(int max_batch, int64_t max_qo_tokens, int num_qo_heads,
                                  int head_dim);

}  // namespace flashkv::test
