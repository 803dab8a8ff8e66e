// One batch-decode configuration run on the GPU and checked against the CPU reference.
#pragma once

#include <string>
#include <vector>

#include "common/gpu_util.h"
#include "flashkv/decode.h"

namespace flashkv::test {

struct DecodeCase {
  std::vector<int64_t> kv_lens;
  int num_qo_heads = 32, num_kv_heads = 8, head_dim = 128, page_size = 16;
  KVLayout layout = KVLayout::NHD;
  DType dtype = DType::f16;   // q and out (and the cache, unless fp8_kv says otherwise)
  DType fp8_kv = DType::f32;  // e4m3 / e5m2: an fp8 cache; any other value: the cache in dtype
  KVScaleCase scale;          // an fp8 cache's scales
  bool interleaved = false;
  DecodePlanOptions opts{};
  int ctas_per_sm = 0;        // BatchDecodeConfig.ctas_per_sm (0: auto)
  int num_sms_to_use = 0;     // BatchDecodeConfig.num_sms_to_use (0: all SMs)
  int64_t max_kv_tokens = 0;  // BatchDecodeConfig: sizing for fixed_split_size (0 and 0: none)
  int min_fixed_split_size = 0;
  size_t workspace_bytes = 0;  // 0: BatchDecode::workspace_bytes (never limits splitting)
  DType kv_dtype() const { return is_fp8_dtype(fp8_kv) ? fp8_kv : dtype; }
  uint64_t seed = 1;
  std::string str() const;
};

struct DecodeOutcome {
  ToleranceCheck out;                        // the whole batch
  std::vector<ToleranceCheck> out_requests;  // each request's rows alone
  double lse_err = 0;                        // the whole batch
  std::vector<double> lse_err_requests;      // each request's row alone
  bool lse_nan = false;
  HostTensor out_host;  // the kernel's output, for bitwise comparisons
  BatchDecode::PlanInfo plan;
};

// The tolerance rule (test_util.h) on each request's rows of out[batch, H_qo, D] alone. The
// batch-wide norm dilutes one wrong request: a request 10 % wrong among 1024 moves the batch's
// error by about 0.3 %, inside the bf16 bound. An empty request's reference is 0 (attention.h:
// out = 0), so its check is absolute: norm(out) <= floor.
std::vector<ToleranceCheck> check_tolerance_per_request(const std::vector<double>& out,
                                                        const std::vector<double>& ref,
                                                        const std::vector<double>& ref_lowp,
                                                        int64_t batch, double floor);
// rel_err of each request's LSE row of lse[batch, H_qo] (an empty request's -inf rows compare
// equal, error 0).
std::vector<double> rel_err_per_request(const std::vector<double>& got,
                                        const std::vector<double>& ref, int64_t batch);
// Success iff every request passes; the failure names the first few that do not.
::testing::AssertionResult every_request_passes(const std::vector<ToleranceCheck>& checks);
::testing::AssertionResult every_request_within(const std::vector<double>& errs, double bound);

// Builds the inputs from the case's seed, runs the reference (f32 and in the dtype) and the GPU.
DecodeOutcome run_decode_case(const DecodeCase& c);

// Asserts the outcome passes the tolerance rule and the LSE is within 1e-4 relative, for the
// whole batch and for every request alone.
void expect_decode_ok(const DecodeCase& c, const DecodeOutcome& o);

}  // namespace flashkv::test
