#include "gpu/prefill_graph_util.h"

#include <algorithm>
#include <random>

namespace flashkv::test {

void Graph::reset() {
  if (exec) runtime::driver().cuGraphExecDestroy(exec);
  if (graph) runtime::driver().cuGraphDestroy(graph);
  exec = nullptr;
  graph = nullptr;
}

void Graph::launch(Stream s) const {
  runtime::check_cu(runtime::driver().cuGraphLaunch(exec, s), "cuGraphLaunch");
}

PrefillPlanOptions graph_plan_options(int tile_rows) {
  PrefillPlanOptions opts;
  opts.causal = true;
  opts.enable_cuda_graph = true;
  opts.tile_rows = tile_rows;
  return opts;
}

std::vector<std::vector<Req>> serving_trace(int steps, int max_batch, int64_t qo_cap,
                                            uint64_t seed) {
  struct Running {
    int64_t ctx, prompt_left;
    bool long_ctx;
  };
  std::mt19937 rng(seed);
  std::vector<Running> run = {{0, 300, false}, {0, 1, false}, {500, 0, false}};
  std::vector<std::vector<Req>> trace;
  for (int step = 0; step < steps; ++step) {
    if (step == 8) {
      if (static_cast<int>(run.size()) >= max_batch) run.erase(run.begin());
      run.push_back({20000, 48, true});
    } else if (static_cast<int>(run.size()) < max_batch) {
      run.push_back({0, static_cast<int64_t>(rng() % 700) + 1, false});
    }
    if (step == 14) std::erase_if(run, [](const Running& r) { return r.long_ctx; });
    if (step % 4 == 3 && run.size() > 1) run.erase(run.begin() + rng() % run.size());
    std::vector<Req> reqs;
    int64_t budget = qo_cap;
    for (size_t i = 0; i < run.size(); ++i) {
      Running& r = run[i];
      const int64_t later = static_cast<int64_t>(run.size() - i - 1);  // one token each, at least
      int64_t qo = 1;
      if (r.long_ctx) {
        qo = std::min<int64_t>(16, budget - later);
      } else if (r.prompt_left > 0) {
        qo = std::min<int64_t>(
            {r.prompt_left, 64 + static_cast<int64_t>(rng() % 192), budget - later});
      }
      if (step == 17 && i == 1) qo = 0;  // paused this step: KV but no queries
      qo = std::max<int64_t>(0, qo);
      reqs.push_back({qo, r.ctx + qo});
      r.ctx += qo;
      r.prompt_left = std::max<int64_t>(0, r.prompt_left - qo);
      budget -= qo;
    }
    trace.push_back(reqs);
  }
  return trace;
}

bool has_long_context(const std::vector<Req>& reqs) {
  return std::any_of(reqs.begin(), reqs.end(), [](const Req& r) { return r.kv >= 20000; });
}

std::string step_tag(size_t step, int batch, int64_t nnz_qo) {
  return "step " + std::to_string(step) + " batch " + std::to_string(batch) + " nnz_qo " +
         std::to_string(nnz_qo);
}

HostTensor upload_random(DeviceTensor& d, DType dtype, const std::vector<int64_t>& shape,
                         uint64_t seed) {
  HostTensor h(dtype, shape);
  h.fill_random(seed);
  if (h.numel() > 0) d.buf.copy_from_host(h.data(), h.nbytes());
  return h;
}

void repoison(DeviceTensor& out, DeviceTensor& lse) {
  out.buf.fill_bytes(0xff);
  lse.buf.fill_bytes(0xff);
}

OutLse reference_rows(int64_t rows, int heads, int dim) {
  return {HostTensor(DType::f32, {rows, heads, dim}), HostTensor(DType::f32, {rows, heads})};
}

OutLse read_rows(const DeviceTensor& dout, const DeviceTensor& dlse, DType dtype, int64_t rows,
                 int heads, int dim) {
  OutLse got{HostTensor(dtype, {rows, heads, dim}), HostTensor(DType::f32, {rows, heads})};
  if (rows > 0) {
    dout.buf.copy_to_host(got.out.data(), got.out.nbytes());
    dlse.buf.copy_to_host(got.lse.data(), got.lse.nbytes());
  }
  return got;
}

void expect_matches_reference(const OutLse& got, const OutLse& ref, DType dtype,
                              const std::string& tag) {
  EXPECT_TRUE(matches_reference(got.out.to_doubles(), ref.out.to_doubles(),
                                rounded_to(ref.out, dtype).to_doubles(), dtype))
      << tag;
  EXPECT_LE(rel_err(got.lse.to_doubles(), ref.lse.to_doubles()), 1e-4) << tag << ": lse";
  EXPECT_EQ(count_bad_empty_rows(got.out, &got.lse, ref.lse), 0) << tag;
}

}  // namespace flashkv::test
