#include "workloads.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "flashkv/error.h"

namespace flashkv::cli {

std::vector<Workload> standard_workloads() {
  // D2/P2: "uniform in [512, 1024], seeded": the sequence the peers draw with Python's
  // random.Random(2025).randint, copied here so flashkv and the peers measure the same batch.
  const std::vector<int64_t> uni = {596, 1001, 689, 512, 892, 896, 749, 579,
                                    903, 922,  612, 556, 633, 728, 896, 613};
  // D3/P3: Zipf, l_i = max(16, round(16 * 1024 * i^-1.1 / sum_j j^-1.1)), i = 1..16.
  double s = 0;
  for (int j = 1; j <= 16; ++j) s += std::pow(j, -1.1);
  std::vector<int64_t> zipf;
  for (int i = 1; i <= 16; ++i)
    zipf.push_back(std::max<int64_t>(16, std::llround(16 * 1024 * std::pow(i, -1.1) / s)));
  return {{"D1", "decode", std::vector<int64_t>(16, 1024)},
          {"D2", "decode", uni},
          {"D3", "decode", zipf},
          {"D4", "decode", {32768}},
          {"D5", "decode", std::vector<int64_t>(64, 4096)},
          {"D6", "decode", std::vector<int64_t>(256, 2048)},
          {"P1", "prefill", std::vector<int64_t>(16, 1024)},
          {"P2", "prefill", uni},
          {"P3", "prefill", zipf},
          {"P4", "prefill", {8192}},
          {"P5", "prefill", {32768}},
          {"A1", "prefill", std::vector<int64_t>(16, 4096 + 512), std::vector<int64_t>(16, 512)},
          {"S1", "prefill", std::vector<int64_t>(64, 4096), std::vector<int64_t>(64, 4)}};
}

std::vector<Workload> read_workloads(const std::string& path) {
  std::ifstream in(path);
  check(static_cast<bool>(in), "--workloads-file: cannot read ", path);
  std::vector<Workload> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    Workload w;
    int64_t batch = 0;
    is >> w.id >> w.kind >> batch;
    for (int64_t i = 0, l; i < batch && is >> l; ++i) w.lens.push_back(l);
    check(static_cast<int64_t>(w.lens.size()) == batch, path, ": workload ", w.id, " lists ",
          w.lens.size(), " lengths, expected ", batch);
    out.push_back(w);
  }
  return out;
}

bool selected(const std::vector<std::string>& ids, const std::string& id) {
  return ids.empty() || std::find(ids.begin(), ids.end(), id) != ids.end();
}

std::vector<HeadShape> standard_shapes() { return {{"gqa-32-8", 32, 8}, {"mha-32-32", 32, 32}}; }

}  // namespace flashkv::cli
