// One RoPE configuration (entry point, dtype, heads, dims, pairing, positions, in place or not)
// run on the GPU and checked element by element against the CPU reference.
#pragma once

#include <string>
#include <vector>

#include "common/gpu_util.h"

namespace flashkv::test {

enum class RopeEntry { kRope, kRopePosIds, kLlama31, kLlama31PosIds, kCosSinCache };
const char* rope_entry_name(RopeEntry e);

struct RopeCase {
  RopeEntry entry = RopeEntry::kRope;
  DType dtype = DType::f16;
  int num_qo_heads = 32, num_kv_heads = 8, head_dim = 128;
  int rotary_dim = 0;  // 0: head_dim
  bool interleave = false;
  bool in_place = false;
  // Rows of each request (indptr entry points) or, for pos_ids ones, just their sum as nnz.
  std::vector<int64_t> request_lens = {5, 0, 17, 1, 9};
  int64_t max_position = 4096;  // positions are drawn in [0, max_position)
  // Elements of padding after each head row (0: contiguous tensors). A padding that is not a
  // multiple of 16 bytes forces the kernel's element-by-element path.
  int head_pad = 0;
  uint64_t seed = 1;
  std::string str() const;
};

// The elementwise rule (STYLE.md, FA3's): |out - ref| <= min(2 |ref_lowp - ref| + u |ref|,
// 1e-2 |ref|) + floor, where ref is the reference in f32 on the same inputs (computed in double,
// rounded once to f32), ref_lowp the reference written in the dtype, u the dtype's unit roundoff
// and floor a small absolute term (the f32 cos/sin of the kernel, for |x| <= 1). NaN never passes.
struct ElementwiseCheck {
  int64_t count = 0, failures = 0, nan = 0;
  double max_err = 0;        // max |out - ref|
  double max_err_ratio = 0;  // max |out - ref| / bound
  std::string first_failure;
  bool pass() const { return count > 0 ? failures == 0 : true; }
  std::string str() const;
};
ElementwiseCheck check_elementwise(const std::vector<double>& out, const std::vector<double>& ref,
                                   const std::vector<double>& ref_lowp, DType dtype);

struct RopeOutcome {
  ElementwiseCheck q, k;
  bool padding_untouched = true;  // out-of-place outputs' padding still NaN
  HostTensor q_out, k_out;        // the kernel's outputs, [nnz, H, D] contiguous
};

// Builds inputs from the seed, runs the reference (f32 and the dtype) and the GPU op.
RopeOutcome run_rope_case(const RopeCase& c);
// Asserts both outputs pass and the padding was not written.
void expect_rope_ok(const RopeCase& c, const RopeOutcome& o);

}  // namespace flashkv::test
