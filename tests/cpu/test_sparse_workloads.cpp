// The B1 / B2 patterns of `flashkv bench sparse` (apps/flashkv/sparse_workloads.h) are the bits
// python -m flashkv.bench draws (python/tests/test_bench.py pins the same numbers): stored
// blocks, a position-weighted checksum of the indices, the visible pairs; each row ascending with
// its diagonal last and column 0 present.
#include <gtest/gtest.h>

#include "sparse_workloads.h"

namespace flashkv::cli {
namespace {

TEST(SparseWorkloads, PatternsMatchThePythonBenchmark) {
  const struct {
    size_t blocks;
    long long checksum, pairs;
  } expect[] = {{3296, 1188712, 51920896}, {1287, 716784, 4239360}};
  const auto ws = block_workloads();
  ASSERT_EQ(ws.size(), 2u);
  for (size_t k = 0; k < ws.size(); ++k) {
    SCOPED_TRACE(ws[k].id);
    const BsrPattern p = bsr_pattern(ws[k]);
    long long sum = 0;
    for (size_t i = 0; i < p.indices.size(); ++i)
      sum += p.indices[i] * static_cast<long long>(i % 7 + 1);
    EXPECT_EQ(p.indices.size(), expect[k].blocks);
    EXPECT_EQ(sum, expect[k].checksum);
    EXPECT_EQ(causal_pairs(ws[k], p), expect[k].pairs);
    for (size_t i = 0; i + 1 < p.indptr.size(); ++i) {
      ASSERT_LT(p.indptr[i], p.indptr[i + 1]);
      EXPECT_EQ(p.indices[p.indptr[i]], 0);
      EXPECT_EQ(p.indices[p.indptr[i + 1] - 1], static_cast<int32_t>(i));
      for (int32_t t = p.indptr[i] + 1; t < p.indptr[i + 1]; ++t)
        ASSERT_LT(p.indices[t - 1], p.indices[t]);
    }
  }
}

}  // namespace
}  // namespace flashkv::cli
