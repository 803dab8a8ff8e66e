// RoPE on the GPU (kernels/kv/rope.cuh) against the CPU reference, element by element: every
// entry point, dtype and supported head dim, both pairings, in place and out of place, GQA and
// MHA, partial rotary dims, strided rows (vector and element-by-element paths), positions up to
// 131072 (Llama 3.1 scaling, cos/sin cache), empty and single-token batches.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu/rope_case.h"

namespace flashkv::test {
namespace {

class RopeGpu : public GpuTest {};

constexpr RopeEntry kEntries[] = {RopeEntry::kRope, RopeEntry::kRopePosIds, RopeEntry::kLlama31,
                                  RopeEntry::kLlama31PosIds, RopeEntry::kCosSinCache};

// Positions up to 131072 where frequencies are computed; a 4096-row cos/sin cache otherwise
// (RopeGpu.LongCosSinCache covers a 131072-row one).
int64_t max_position(RopeEntry e) { return e == RopeEntry::kCosSinCache ? 4096 : 131072; }

TEST_F(RopeGpu, EveryEntryPointDtypeAndHeadDimMatchesReference) {
  uint64_t seed = 1;
  for (RopeEntry e : kEntries) {
    for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
      for (int d : {64, 128, 256}) {
        for (bool interleave : {false, true}) {
          for (bool in_place : {false, true}) {
            RopeCase c;
            c.entry = e;
            c.dtype = dt;
            c.head_dim = d;
            // GQA 32/8 at head_dim 128, MHA elsewhere.
            c.num_qo_heads = d == 128 ? 32 : 8;
            c.num_kv_heads = 8;
            c.interleave = interleave;
            c.in_place = in_place;
            c.max_position = max_position(e);
            c.seed = seed++;
            expect_rope_ok(c, run_rope_case(c));
          }
        }
      }
    }
  }
}

TEST_F(RopeGpu, PartialRotaryDimsCopyTheRest) {
  // (head_dim, rotary_dim): half, a quarter, one pair, and 24 (rotary_dim / 2 = 12 is not a
  // multiple of a 16-byte vector of f16/bf16: the element-by-element path).
  const std::pair<int, int> dims[] = {{128, 64}, {256, 64}, {64, 2}, {64, 24}};
  uint64_t seed = 1000;
  for (RopeEntry e : {RopeEntry::kRope, RopeEntry::kLlama31PosIds, RopeEntry::kCosSinCache}) {
    for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
      for (auto [d, r] : dims) {
        for (bool interleave : {false, true}) {
          for (bool in_place : {false, true}) {
            RopeCase c;
            c.entry = e;
            c.dtype = dt;
            c.num_qo_heads = 4;
            c.num_kv_heads = 2;
            c.head_dim = d;
            c.rotary_dim = r;
            c.interleave = interleave;
            c.in_place = in_place;
            c.max_position = max_position(e);
            c.seed = seed++;
            expect_rope_ok(c, run_rope_case(c));
          }
        }
      }
    }
  }
}

TEST_F(RopeGpu, StridedRowsVectorAndScalarPaths) {
  // Padding of 8 elements keeps 16-byte vectors for f16/bf16 (and 32 bytes for f32); 2 elements
  // break the alignment, so the kernel goes element by element. Out of place, the outputs'
  // padding must stay NaN.
  uint64_t seed = 2000;
  for (int pad : {8, 2}) {
    for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
      for (bool interleave : {false, true}) {
        for (bool in_place : {false, true}) {
          RopeCase c;
          c.entry = RopeEntry::kRopePosIds;
          c.dtype = dt;
          c.head_dim = 128;
          c.num_qo_heads = 32;
          c.num_kv_heads = 8;
          c.interleave = interleave;
          c.in_place = in_place;
          c.head_pad = pad;
          c.seed = seed++;
          expect_rope_ok(c, run_rope_case(c));
        }
      }
    }
  }
}

TEST_F(RopeGpu, LongCosSinCache) {
  for (bool interleave : {false, true}) {
    RopeCase c;
    c.entry = RopeEntry::kCosSinCache;
    c.dtype = DType::bf16;
    c.head_dim = 128;
    c.rotary_dim = 64;
    c.interleave = interleave;
    c.max_position = 131072;
    c.request_lens = {100, 300};
    c.seed = 3000 + interleave;
    expect_rope_ok(c, run_rope_case(c));
  }
}

TEST_F(RopeGpu, EmptyAndSingleTokenBatches) {
  const std::vector<std::vector<int64_t>> batches = {
      {}, {0, 0}, {1}, {0, 1, 0}, std::vector<int64_t>(64, 1)};  // the last: 64 decode requests
  uint64_t seed = 4000;
  for (RopeEntry e : kEntries) {
    for (const auto& lens : batches) {
      for (bool in_place : {false, true}) {
        RopeCase c;
        c.entry = e;
        c.dtype = DType::f16;
        c.request_lens = lens;
        c.in_place = in_place;
        c.max_position = max_position(e);
        c.seed = seed++;
        expect_rope_ok(c, run_rope_case(c));
      }
    }
  }
}

TEST_F(RopeGpu, InPlaceEqualsOutOfPlaceBitwise) {
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    for (bool interleave : {false, true}) {
      RopeCase c;
      c.entry = RopeEntry::kLlama31PosIds;
      c.dtype = dt;
      c.interleave = interleave;
      c.seed = 5000;
      const RopeOutcome out_of_place = run_rope_case(c);
      c.in_place = true;
      const RopeOutcome in_place = run_rope_case(c);
      ASSERT_EQ(out_of_place.q_out.nbytes(), in_place.q_out.nbytes());
      EXPECT_EQ(
          std::memcmp(out_of_place.q_out.data(), in_place.q_out.data(), in_place.q_out.nbytes()), 0)
          << c.str();
      EXPECT_EQ(
          std::memcmp(out_of_place.k_out.data(), in_place.k_out.data(), in_place.k_out.nbytes()), 0)
          << c.str();
    }
  }
}

}  // namespace
}  // namespace flashkv::test
