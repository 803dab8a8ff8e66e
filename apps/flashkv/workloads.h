// The standard workloads of docs/benchmarks.md.
#pragma once

#include <string>
#include <vector>

namespace flashkv::cli {

struct Workload {
  std::string id;                // "D1"
  std::string kind;              // "decode" or "prefill"
  std::vector<int64_t> lens;     // kv_len per request
  std::vector<int64_t> qo_lens;  // prefill: query rows per request; empty: qo_len = kv_len
  int64_t qo_len(size_t i) const { return qo_lens.empty() ? lens[i] : qo_lens[i]; }
};

// D1-D6 and P1-P5 with the exact lengths the peers (python/flashkv/bench/peers) use, then the
// prefill workloads with qo_len < kv_len: A1 (append: 16 requests, 512 new query tokens on 4096
// cached, so qo_len 512, kv_len 4608) and S1 (speculative verification: 64 requests, qo_len 4,
// kv_len 4096). All prefill workloads are causal (queries aligned to the end of the KV).
std::vector<Workload> standard_workloads();
// Reads "NAME KIND BATCH lens..." lines (`python -m flashkv.bench.peers --emit-workloads`).
std::vector<Workload> read_workloads(const std::string& path);

// True when `ids` is empty (no selection: everything) or holds `id`.
bool selected(const std::vector<std::string>& ids, const std::string& id);

struct HeadShape {
  std::string name;  // "gqa-32-8"
  int num_qo_heads, num_kv_heads;
};
std::vector<HeadShape> standard_shapes();

}  // namespace flashkv::cli
