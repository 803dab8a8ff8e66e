// Helpers of the batch-prefill CUDA-graph tests (test_prefill_graph_gpu.cpp) and bad-input tests
// (test_prefill_bad_input_gpu.cpp): the fixture of their suite, a captured graph, named-error
// checks, the serving trace the replay tests re-plan along, and the per-step work and checks that
// the paged and the ragged replay tests share.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "flashkv/error.h"
#include "gpu/prefill_case.h"
#include "runtime/driver.h"

namespace flashkv::test {

// The fixture of the PrefillGraphGpu suite. Not in an anonymous namespace: the suite's tests live
// in two files, and GoogleTest requires all tests of a suite to use one fixture class.
class PrefillGraphGpu : public GpuTest {};

// A captured and instantiated graph, destroyed at scope exit.
struct Graph {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() { reset(); }
  void reset();
  void launch(Stream s) const;
};

// Captures fn() on `s` into `g`. If fn throws, the capture is ended (and its graph dropped)
// before the exception propagates, so the stream is usable again.
template <class Fn>
void capture(Graph& g, Stream s, Fn&& fn) {
  const auto& d = runtime::driver();
  runtime::check_cu(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                    "begin capture");
  try {
    fn();
  } catch (...) {
    CUgraph dropped = nullptr;
    d.cuStreamEndCapture(s, &dropped);
    if (dropped) d.cuGraphDestroy(dropped);
    throw;
  }
  runtime::check_cu(d.cuStreamEndCapture(s, &g.graph), "end capture");
  runtime::check_cu(d.cuGraphInstantiate(&g.exec, g.graph, 0), "instantiate");
}

// Expects fn() to throw flashkv::Error whose message contains one of `needles` (the argument).
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<const char*> needles) {
  const std::string msg = error_of(fn);
  bool named = false;
  std::string list;
  for (const char* n : needles) {
    named = named || msg.find(n) != std::string::npos;
    list += std::string(list.empty() ? "'" : ", '") + n + "'";
  }
  EXPECT_TRUE(named) << "the message names none of " << list << ": " << msg;
}

// Causal, planned for CUDA graphs, with a fixed query tile (the captured kernel must not change).
PrefillPlanOptions graph_plan_options(int tile_rows);

// --- the serving trace the replay tests re-plan along ---

struct Req {
  int64_t qo, kv;
};

// A serving loop: every running request either takes its next prefill chunk (qo > 1, appended
// after its context) or decodes one token; new prompts join, finished ones leave; at step 8 a
// request with a 20000-token cached context joins and appends 16-token chunks until it leaves at
// step 14 (its tiles split across CTAs: the merge runs inside the replayed graph); at step 17 one
// request has no queries (qo 0). Every step fits max_batch and the query capacity.
std::vector<std::vector<Req>> serving_trace(int steps, int max_batch, int64_t qo_cap,
                                            uint64_t seed);
// Whether the step carries the trace's long-context request (a KV of 20000 tokens or more).
bool has_long_context(const std::vector<Req>& reqs);
// "step S batch B nnz_qo N": how a replay test's failure messages start.
std::string step_tag(size_t step, int batch, int64_t nnz_qo);

// --- one replayed step ---

// A random host tensor of `shape` from `seed`, copied to the front of `d` unless it is empty.
HostTensor upload_random(DeviceTensor& d, DType dtype, const std::vector<int64_t>& shape,
                         uint64_t seed);
// Fills out and lse with NaN bytes again, so rows the next run leaves unwritten are caught.
void repoison(DeviceTensor& out, DeviceTensor& lse);

// Output rows [rows, heads, dim] and their lse [rows, heads] (f32).
struct OutLse {
  HostTensor out, lse;
};
// f32 tensors of that shape, for the reference to fill.
OutLse reference_rows(int64_t rows, int heads, int dim);
// The first `rows` rows of the device out (in `dtype`) and lse, copied back (none when rows is 0).
OutLse read_rows(const DeviceTensor& dout, const DeviceTensor& dlse, DType dtype, int64_t rows,
                 int heads, int dim);
// Expects `got` to match the reference: out by the tolerance rule of test_util.h, lse within 1e-4
// relative, and every (row, head) that sees no key exactly out = 0, lse = -inf. `tag` leads each
// failure message.
void expect_matches_reference(const OutLse& got, const OutLse& ref, DType dtype,
                              const std::string& tag);

}  // namespace flashkv::test
