#include "sparse_workloads.h"

#include <algorithm>
#include <set>

namespace flashkv::cli {

uint64_t SplitMix64::next() {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() { return static_cast<double>(next() >> 11) * (1.0 / (1ull << 53)); }

std::vector<BlockWorkload> block_workloads() {
  return {{"B1", 32768, 128, 0.10, 4, 2026}, {"B2", 32768, 64, 0.01, 1, 2027}};
}

std::vector<SelectWorkload> select_workloads() {
  return {{"B3", 16, 65536, 1, 4096, 2028}, {"B4", 16, 131072, 16, 256, 2029}};
}

BsrPattern bsr_pattern(const BlockWorkload& w) {
  const int64_t mb = w.blocks_per_side();
  const auto band_row = [&](int64_t i) {
    std::set<int64_t> row = {0};
    for (int64_t j = std::max<int64_t>(0, i - w.band + 1); j <= i; ++j) row.insert(j);
    return row;
  };
  int64_t base = 0, candidates = 0;  // candidates: columns 1 .. i - band of each row
  for (int64_t i = 0; i < mb; ++i) {
    base += static_cast<int64_t>(band_row(i).size());
    candidates += std::max<int64_t>(0, i - w.band);
  }
  const double p =
      candidates > 0
          ? std::max(0.0, w.density * static_cast<double>(causal_blocks(mb)) - double(base)) /
                static_cast<double>(candidates)
          : 0.0;
  SplitMix64 rng{w.seed};
  BsrPattern out;
  out.indptr.push_back(0);
  for (int64_t i = 0; i < mb; ++i) {
    std::set<int64_t> row = band_row(i);
    for (int64_t j = 1; j < i - w.band + 1; ++j)
      if (rng.uniform() < p) row.insert(j);
    for (int64_t j : row) out.indices.push_back(static_cast<int32_t>(j));
    out.indptr.push_back(static_cast<int32_t>(out.indices.size()));
  }
  return out;
}

int64_t causal_pairs(const BlockWorkload& w, const BsrPattern& p) {
  const int64_t r = w.block;
  int64_t pairs = 0;
  for (size_t i = 0; i + 1 < p.indptr.size(); ++i)
    for (int32_t t = p.indptr[i]; t < p.indptr[i + 1]; ++t)
      pairs += p.indices[t] < static_cast<int64_t>(i) ? r * r : r * (r + 1) / 2;
  return pairs;
}

}  // namespace flashkv::cli
