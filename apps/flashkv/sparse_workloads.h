// The sparse workloads B1-B4 of docs/benchmarks.md, drawn exactly as
// python/flashkv/bench/sparse_workloads.py draws them (the same splitmix64 stream, so a pattern
// is the same bits in both): GQA 32/8, head_dim 128, f16.
// - B1 / B2: block-sparse causal prefill, M = N = 32768, R = C = 128 / 64. Block row i keeps its
//   band (the `band` blocks ending at its diagonal), the global column 0 and earlier blocks drawn
//   with one probability, so that the stored blocks are about `density` of the causal triangle
//   MB (MB + 1) / 2: the dense causal work, which "time <= 1.15 x dense time x density" refers to.
// - B3: batch 16, context 65536, 4096 tokens per request and KV head (vector sparsity).
// - B4: batch 16, context 131072, 256 pages of 16 per request and KV head (Quest-style).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashkv::cli {

// Steele et al.'s splitmix64 (the Python side has the same): one output per step.
struct SplitMix64 {
  uint64_t state;
  uint64_t next();
  double uniform();  // [0, 1) from the top 53 bits, exact in both languages
};

struct BlockWorkload {
  std::string id;
  int64_t n;       // M = N
  int block;       // R = C
  double density;  // of the causal triangle's blocks (the target)
  int band;
  uint64_t seed;
  int64_t blocks_per_side() const { return n / block; }
};

struct SelectWorkload {
  std::string id;
  int batch;
  int64_t context;
  int page;      // 1: tokens are selected; 16: pages of 16
  int selected;  // per request and KV head
  uint64_t seed;
  int64_t selected_tokens() const { return int64_t{selected} * page; }
};

std::vector<BlockWorkload> block_workloads();    // B1, B2
std::vector<SelectWorkload> select_workloads();  // B3, B4

struct BsrPattern {
  std::vector<int32_t> indptr, indices;  // each row ascending: the diagonal last
};
BsrPattern bsr_pattern(const BlockWorkload& w);
// Visible (query, key) pairs of a causal R == C pattern: R^2 per block below the diagonal,
// R (R + 1) / 2 on it.
int64_t causal_pairs(const BlockWorkload& w, const BsrPattern& p);
inline int64_t causal_blocks(int64_t mb) { return mb * (mb + 1) / 2; }

}  // namespace flashkv::cli
