// The standard workloads of ../shared/BENCHMARKS.md.
#pragma once

#include <string>
#include <vector>

namespace flashkv::cli {

struct Workload {
  std::string id;    // "D1"
  std::string kind;  // "decode" or "prefill"
  std::vector<int64_t> lens;
};

// D1-D6 and P1-P5 with the exact lengths ../shared/bench/peers_torch.py uses.
std::vector<Workload> standard_workloads();
// Reads "NAME KIND BATCH lens..." lines (peers_torch.py --emit-workloads).
std::vector<Workload> read_workloads(const std::string& path);

struct HeadShape {
  std::string name;  // "gqa-32-8"
  int num_qo_heads, num_kv_heads;
};
std::vector<HeadShape> standard_shapes();

}  // namespace flashkv::cli
