// The KV-cache ops on the GPU (kernels/kv/append.cuh): append_paged_kv_cache compared with the
// CPU reference over the WHOLE cache, bitwise (every slot no new token names must be unchanged),
// in every storage (NHD/HND, separate/interleaved k and v), dtype and page size, for prefill
// chunks, decode steps, pages that fill exactly and tokens that start a page; and
// get_batch_indices_positions against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "flashkv/device_errors.h"
#include "flashkv/kv_ops.h"
#include "flashkv/reference_kv_ops.h"
#include "gpu/append_case.h"

namespace flashkv::test {
namespace {

class KvAppendGpu : public GpuTest {};

// Requests (old + new) that hit each page-boundary situation for page size ps.
void boundary_requests(int64_t ps, std::vector<int64_t>& old_lens,
                       std::vector<int64_t>& append_lens) {
  const std::vector<std::pair<int64_t, int64_t>> reqs = {
      {0, 3 * ps + 5},                        // prefill from empty over several pages
      {ps - 1, 1},                            // decode: fills its page exactly
      {ps, 1},                                // decode: starts a new page
      {2 * ps + 3, 0},                        // no new tokens
      {0, 0},                                 // empty, stays empty
      {5, 2 * ps + 7},                        // a prefill chunk after cached tokens
      {std::max<int64_t>(0, 2 * ps - 3), 3},  // crosses a page boundary
      {ps, ps},                               // a chunk that is exactly one page
  };
  for (auto [o, a] : reqs) {
    old_lens.push_back(o);
    append_lens.push_back(a);
  }
}

TEST_F(KvAppendGpu, EveryLayoutMatchesReferenceBitwise) {
  uint64_t seed = 1;
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    for (bool interleaved : {false, true}) {
      for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
        for (int ps : {1, 16, 64}) {
          AppendCase c;
          boundary_requests(ps, c.old_lens, c.append_lens);
          c.page_size = ps;
          c.layout = layout;
          c.interleaved = interleaved;
          c.dtype = dt;
          c.seed = seed++;
          expect_append_matches_reference(c);
        }
      }
    }
  }
}

TEST_F(KvAppendGpu, HeadDimsAndHeadCounts) {
  uint64_t seed = 100;
  for (int d : {64, 128, 256}) {
    for (int h : {1, 4, 32}) {
      AppendCase c;
      boundary_requests(16, c.old_lens, c.append_lens);
      c.head_dim = d;
      c.num_kv_heads = h;
      c.layout = h == 4 ? KVLayout::HND : KVLayout::NHD;
      c.dtype = d == 256 ? DType::f32 : DType::bf16;
      c.seed = seed++;
      expect_append_matches_reference(c);
    }
  }
}

TEST_F(KvAppendGpu, DecodeStepOfManyRequests) {
  // One new token per request, 257 requests of assorted lengths (some at a page boundary).
  AppendCase c;
  SplitMix64 rng(7);
  for (int i = 0; i < 257; ++i) {
    c.old_lens.push_back(i % 16 == 0 ? 16 * (i % 5) : static_cast<int64_t>(rng.next() % 3000));
    c.append_lens.push_back(1);
  }
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    c.layout = layout;
    c.seed = 200 + static_cast<int>(layout);
    expect_append_matches_reference(c);
  }
}

TEST_F(KvAppendGpu, StridedRowsVectorAndScalarPaths) {
  // New rows with padding between heads: 8 elements keep 16-byte vectors (f16/bf16), 3 break the
  // alignment and the kernel copies element by element.
  uint64_t seed = 300;
  for (int pad : {8, 3}) {
    for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
      for (bool interleaved : {false, true}) {
        AppendCase c;
        boundary_requests(16, c.old_lens, c.append_lens);
        c.row_pad = pad;
        c.dtype = dt;
        c.interleaved = interleaved;
        c.layout = interleaved ? KVLayout::HND : KVLayout::NHD;
        c.seed = seed++;
        expect_append_matches_reference(c);
      }
    }
  }
}

TEST_F(KvAppendGpu, EmptyAppendsLeaveTheCacheAlone) {
  for (const auto& [old_lens, append_lens] :
       {std::pair<std::vector<int64_t>, std::vector<int64_t>>{{}, {}},
        {{0, 5, 16}, {0, 0, 0}},
        {{3}, {1}}}) {
    AppendCase c;
    c.old_lens = old_lens;
    c.append_lens = append_lens;
    c.seed = 400 + old_lens.size();
    expect_append_matches_reference(c);
  }
}

TEST_F(KvAppendGpu, GetBatchIndicesPositionsMatchesReference) {
  const std::vector<std::vector<int64_t>> appends = {
      {}, {0}, {1}, {5, 0, 17, 1, 0, 9}, std::vector<int64_t>(300, 1), {4096, 3}};
  uint64_t seed = 500;
  for (const auto& append_lens : appends) {
    std::vector<int64_t> ptr = {0}, seq;
    SplitMix64 rng(seed++);
    for (int64_t n : append_lens) {
      ptr.push_back(ptr.back() + n);
      seq.push_back(n + static_cast<int64_t>(rng.next() % 1000));  // cached before the append
    }
    const int64_t nnz = ptr.back();
    const HostTensor indptr = make_i32(ptr), seq_lens = make_i32(seq);
    const BatchIndicesPositions want =
        get_batch_indices_positions(indptr.view(), seq_lens.view(), nnz);
    HostTensor got_b(DType::i32, {nnz}), got_p(DType::i32, {nnz});
    const DeviceTensor d_indptr = to_device(indptr), d_seq = to_device(seq_lens);
    DeviceTensor d_b = poisoned_like(got_b), d_p = poisoned_like(got_p);
    get_batch_indices_positions(d_indptr.view, d_seq.view, d_b.view, d_p.view);
    synchronize();
    EXPECT_NO_THROW(check_device_errors());
    to_host(d_b, got_b);
    to_host(d_p, got_p);
    EXPECT_EQ(got_b.to_doubles(), want.batch_indices.to_doubles()) << "nnz " << nnz;
    EXPECT_EQ(got_p.to_doubles(), want.positions.to_doubles()) << "nnz " << nnz;
  }
}

}  // namespace
}  // namespace flashkv::test
