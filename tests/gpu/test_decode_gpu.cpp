// Batch decode on the GPU vs the CPU reference across the shapes users have.
#include <gtest/gtest.h>

#include <random>

#include "flashkv/reference.h"
#include "gpu/decode_case.h"

namespace flashkv::test {
namespace {

class DecodeGpu : public GpuTest {};

// Lengths with the edge cases: empty, length 1, odd sizes, one longer than a chunk.
const std::vector<int64_t> kMixedLens = {0, 1, 17, 113, 577, 1023, 2051, 5};

TEST_F(DecodeGpu, HeadDimsGroupsPagesLayoutsDtypes) {
  struct Heads { int qo, kv; };
  // GQA ratios 1, 4, 8, 16 and MQA (32 query heads on one KV head).
  const Heads heads[] = {{8, 8}, {32, 8}, {32, 4}, {32, 2}, {32, 1}};
  uint64_t seed = 100;
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int d : {64, 128, 256}) {
      for (Heads h : heads) {
        for (int page : {1, 16, 64}) {
          DecodeCase c;
          c.kv_lens = kMixedLens;
          c.num_qo_heads = h.qo;
          c.num_kv_heads = h.kv;
          c.head_dim = d;
          c.page_size = page;
          c.dtype = dt;
          c.layout = (seed % 2) ? KVLayout::HND : KVLayout::NHD;
          c.interleaved = (seed % 3) == 0;
          c.seed = seed++;
          // Auto (tensor cores where supported), then the CUDA-core kernel on the same case.
          expect_decode_ok(c, run_decode_case(c));
          c.opts.backend = DecodeBackend::kCudaCores;
          expect_decode_ok(c, run_decode_case(c));
        }
      }
    }
  }
}

TEST_F(DecodeGpu, BothLayoutsAndInterleavingAgree) {
  for (KVLayout l : {KVLayout::NHD, KVLayout::HND}) {
    for (bool inter : {false, true}) {
      for (DecodeBackend b : {DecodeBackend::kTensorCores, DecodeBackend::kCudaCores}) {
      DecodeCase c;
      c.opts.backend = b;
      c.kv_lens = {300, 1, 4000};
      c.layout = l;
      c.interleaved = inter;
      c.seed = 7;
      expect_decode_ok(c, run_decode_case(c));
      }
    }
  }
}

TEST_F(DecodeGpu, OddPageSizesAndSmScale) {
  for (int page : {5, 7, 33}) {
    DecodeCase c;
    c.kv_lens = kMixedLens;
    c.page_size = page;
    c.opts.sm_scale = 0.3f;
    c.seed = 40 + page;
    expect_decode_ok(c, run_decode_case(c));
  }
}

TEST_F(DecodeGpu, AllEmptyAndSingleTokenBatches) {
  for (auto lens : {std::vector<int64_t>{0}, {0, 0, 0}, {1}, {1, 1, 1, 1}}) {
    DecodeCase c;
    c.kv_lens = lens;
    c.seed = 3;
    expect_decode_ok(c, run_decode_case(c));
  }
}

TEST_F(DecodeGpu, VeryLongRequestSplitsAcrossTheGpu) {
  for (DecodeBackend b : {DecodeBackend::kTensorCores, DecodeBackend::kCudaCores}) {
    DecodeCase c;
    c.kv_lens = {131072};
    c.opts.backend = b;
    c.seed = 11;
    const DecodeOutcome o = run_decode_case(c);
    expect_decode_ok(c, o);
    EXPECT_EQ(o.plan.tensor_cores, b == DecodeBackend::kTensorCores);
    EXPECT_GT(o.plan.num_split_tiles, 0) << "one long request must be split (split-KV)";
    EXPECT_GE(o.plan.num_work_items, o.plan.num_ctas / 2);
  }
}

TEST_F(DecodeGpu, Batch1024) {
  DecodeCase c;
  std::mt19937 rng(5);
  for (int i = 0; i < 1024; ++i) c.kv_lens.push_back(rng() % 600);
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.seed = 12;
  expect_decode_ok(c, run_decode_case(c));
}

TEST_F(DecodeGpu, MixedBatchWithEverything) {
  DecodeCase c;
  c.kv_lens = {0, 1, 65536, 5, 1000, 0, 17, 20000, 1};
  c.page_size = 5;
  c.layout = KVLayout::HND;
  c.dtype = DType::bf16;
  c.seed = 13;
  expect_decode_ok(c, run_decode_case(c));
}

TEST_F(DecodeGpu, SplitOptions) {
  for (int fixed : {0, 64, 1000}) {
    for (bool nosplit : {false, true}) {
      DecodeCase c;
      c.kv_lens = {4096, 3, 1500, 0, 777};
      c.opts.fixed_split_size = nosplit ? 0 : fixed;
      c.opts.disable_split_kv = nosplit;
      c.seed = 50 + fixed;
      const DecodeOutcome o = run_decode_case(c);
      expect_decode_ok(c, o);
      if (nosplit) {
        EXPECT_EQ(o.plan.num_split_tiles, 0);
      }
    }
  }
}

}  // namespace
}  // namespace flashkv::test
