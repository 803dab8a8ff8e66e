// MultiLevelCascade on the GPU against the CPU reference of plain attention over the same page
// table (and plain BatchDecode): 1-3 levels, prefixes of 1 page to 32 768 tokens, groups of 1-64
// requests, suffixes of 0-4 096 tokens, causal append on the last level, pages 1 and 16, GQA and
// MHA, group members scattered through the batch (the gather path), automatic use, CUDA graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "common/gpu_util.h"
#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/reference.h"
#include "runtime/driver.h"

namespace flashkv::test {
namespace {

// A batch whose requests share prefixes: `groups` groups of `group_size` requests; each group
// shares `prefix` tokens (whole pages), the first half of each group shares `nested` more, and
// every request then has its own suffix of [suffix_min, suffix_max] tokens.
struct SharedBatchSpec {
  int groups = 2, group_size = 4;
  int64_t prefix = 256, nested = 0, suffix_min = 1, suffix_max = 64;
  int page_size = 16, num_qo_heads = 32, num_kv_heads = 8, head_dim = 128;
  int qo_len = 1;        // > 1: append (causal) rows per request
  bool shuffle = false;  // scatter the groups' members through the batch
  DType dtype = DType::f16;
  DType fp8_kv = DType::f32;  // e4m3 / e5m2: an fp8 cache with scales k 0.5, v 2 (else: dtype)
  uint64_t seed = 1;
  DType kv_dtype() const { return is_fp8_dtype(fp8_kv) ? fp8_kv : dtype; }
  std::string str() const {
    std::ostringstream os;
    os << groups << "x" << group_size << " prefix " << prefix << " nested " << nested << " suffix "
       << suffix_min << ".." << suffix_max << " page " << page_size << " H" << num_qo_heads << "/"
       << num_kv_heads << " D" << head_dim << " qo " << qo_len << (shuffle ? " shuffled" : "")
       << (is_fp8_dtype(fp8_kv) ? std::string(" kv ") + dtype_name(fp8_kv) : "");
    return os.str();
  }
};

struct SharedBatch {
  int batch = 0;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last;
  HostTensor k, v, q;
  int64_t num_pages = 0;
};

SharedBatch make_shared_batch(const SharedBatchSpec& s) {
  std::mt19937 rng(static_cast<uint32_t>(s.seed));
  SharedBatch b;
  std::vector<std::vector<int32_t>> pages;
  std::vector<int64_t> lens;
  int32_t next = 0;
  auto take = [&](int64_t tokens) {
    std::vector<int32_t> p;
    for (int64_t t = 0; t < tokens; t += s.page_size) p.push_back(next++);
    return p;
  };
  for (int g = 0; g < s.groups; ++g) {
    const auto shared = take(s.prefix), nested = take(s.nested);
    for (int r = 0; r < s.group_size; ++r) {
      std::vector<int32_t> p = shared;
      int64_t len = s.prefix;
      if (r < (s.group_size + 1) / 2 && s.nested > 0) {
        p.insert(p.end(), nested.begin(), nested.end());
        len += s.nested;
      }
      const int64_t suffix =
          s.suffix_min + static_cast<int64_t>(rng() % (s.suffix_max - s.suffix_min + 1));
      const auto own = take(suffix);
      p.insert(p.end(), own.begin(), own.end());
      pages.push_back(p);
      lens.push_back(len + suffix);
    }
  }
  std::vector<int> order(pages.size());
  std::iota(order.begin(), order.end(), 0);
  if (s.shuffle) std::shuffle(order.begin(), order.end(), rng);
  // Page ids scattered through the pool.
  std::vector<int32_t> perm(next);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i : order) {
    for (int32_t p : pages[i]) b.kv_indices.push_back(perm[p]);
    b.kv_indptr.push_back(static_cast<int32_t>(b.kv_indices.size()));
    const int64_t np = static_cast<int64_t>(pages[i].size());
    b.last.push_back(np ? static_cast<int32_t>(lens[i] - (np - 1) * s.page_size) : 0);
    b.qo_indptr.push_back(b.qo_indptr.back() + s.qo_len);
  }
  b.batch = static_cast<int>(order.size());
  b.num_pages = std::max<int64_t>(next, 1);
  b.k = HostTensor(s.kv_dtype(), {b.num_pages, s.page_size, s.num_kv_heads, s.head_dim});
  b.v = b.k;
  b.k.fill_random(s.seed * 5 + 1);
  b.v.fill_random(s.seed * 5 + 2);
  b.q = HostTensor(s.dtype, {b.qo_indptr.back(), s.num_qo_heads, s.head_dim});
  b.q.fill_random(s.seed * 5 + 3);
  return b;
}

// The scales of an fp8 batch's cache (identity for a 16-bit one).
KVScale batch_scale(const SharedBatch& b) {
  KVScale s;
  if (is_fp8_dtype(b.k.dtype())) {
    s.k = 0.5f;
    s.v = 2.0f;
  }
  return s;
}

PagedKVCache host_cache(SharedBatch& b) {
  PagedKVCache c{
      b.k.view(),
      b.v.view(),
      KVLayout::NHD,
      TensorView(b.kv_indptr.data(), DType::i32, {b.batch + 1}),
      TensorView(b.kv_indices.data(), DType::i32, {static_cast<int64_t>(b.kv_indices.size())}),
      TensorView(b.last.data(), DType::i32, {b.batch})};
  c.scale = batch_scale(b);
  return c;
}

struct CascadeRun {
  HostTensor out, lse;
  CascadePlanInfo info;
};

// Plans and runs the cascade on the GPU (one shot), in a workspace of ws_bytes (0: the size that
// never limits splitting; SIZE_MAX: MultiLevelCascade::min_workspace_bytes).
CascadeRun run_cascade(SharedBatch& b, const SharedBatchSpec& s, CascadePlanOptions opts,
                       size_t ws_bytes = 0) {
  const bool decode = s.qo_len == 1;
  MultiLevelCascadeConfig cfg;
  cfg.max_batch = std::max(b.batch, 1);
  cfg.max_qo_tokens = decode ? 0 : b.qo_indptr.back();
  cfg.max_pages = std::max<int64_t>(static_cast<int64_t>(b.kv_indices.size()), 1);
  cfg.num_qo_heads = s.num_qo_heads;
  cfg.head_dim = s.head_dim;
  DeviceBuffer ws(ws_bytes == 0          ? MultiLevelCascade::workspace_bytes(cfg)
                  : ws_bytes == SIZE_MAX ? MultiLevelCascade::min_workspace_bytes(cfg)
                                         : ws_bytes);
  MultiLevelCascade casc(cfg, ws.data(), ws.size());
  CascadeBatch cb{decode ? nullptr : b.qo_indptr.data(),
                  b.kv_indptr.data(),
                  b.kv_indices.data(),
                  b.last.data(),
                  b.batch,
                  s.page_size};
  Stream st = create_stream();
  casc.plan(cb, {s.num_qo_heads, s.num_kv_heads, s.head_dim, s.dtype, s.fp8_kv}, opts, st);
  DeviceTensor dk = to_device(b.k), dv = to_device(b.v), dq = to_device(b.q);
  CascadeRun r{b.q, HostTensor(DType::f32, {b.q.shape()[0], s.num_qo_heads}), casc.plan_info()};
  DeviceTensor dout = poisoned_like(b.q), dlse = poisoned_like(r.lse);
  PagedKVCache kv{dk.view, dv.view, KVLayout::NHD, {}, {}, {}};
  kv.scale = batch_scale(b);
  casc.run(dq.view, kv, dout.view, dlse.view, st);
  synchronize(st);
  destroy_stream(st);
  to_host(dout, r.out);
  to_host(dlse, r.lse);
  return r;
}

// The reference: plain attention of every request over its whole page list (and its LSE, when
// the run returned one: natural log, -inf for a row that sees nothing).
void expect_matches_plain(SharedBatch& b, const SharedBatchSpec& s, const HostTensor& out,
                          const HostTensor* lse = nullptr) {
  HostTensor ref(DType::f32, {b.qo_indptr.back(), s.num_qo_heads, s.head_dim}), lowp = b.q;
  HostTensor ref_lse(DType::f32, {b.qo_indptr.back(), s.num_qo_heads});
  const PagedKVCache c = host_cache(b);
  if (s.qo_len == 1) {
    reference::batch_decode(b.q.view(), c, ref.view(), ref_lse.view(), {});
  } else {
    AttentionOptions ao;
    ao.causal = true;
    reference::batch_prefill_paged(b.q.view(),
                                   TensorView(b.qo_indptr.data(), DType::i32, {b.batch + 1}), c,
                                   ref.view(), ref_lse.view(), ao);
  }
  for (int64_t i = 0; i < ref.numel(); ++i) lowp.set(i, ref.get(i));
  EXPECT_TRUE(matches_reference(out.to_doubles(), ref.to_doubles(), lowp.to_doubles(), s.dtype))
      << s.str();
  if (lse != nullptr) {
    const auto got = lse->to_doubles();
    EXPECT_FALSE(any_nan(got)) << s.str();
    EXPECT_LE(rel_err(got, ref_lse.to_doubles()), 1e-4) << s.str() << ": lse";
  }
}

// Levels detection finds: none shared (groups of one) → 1; a nested prefix counts only when at
// least two members share it (the first half of each group, rounded up).
int expected_levels(const SharedBatchSpec& s) {
  if (s.group_size < 2) return 1;
  return s.nested > 0 && (s.group_size + 1) / 2 >= 2 ? 3 : 2;
}

class CascadeGpu : public GpuTest {};

TEST_F(CascadeGpu, TwoAndThreeLevelsMatchPlainAttention) {
  CascadePlanOptions always;
  always.use = CascadePlanOptions::Use::kAlways;
  std::vector<SharedBatchSpec> specs;
  specs.push_back({});                                             // 2 levels, GQA
  specs.push_back({.groups = 3, .group_size = 5, .nested = 128});  // 3 levels
  specs.push_back(
      {.groups = 1, .group_size = 64, .prefix = 8192, .suffix_min = 128, .suffix_max = 1024});
  specs.push_back({.groups = 4,
                   .group_size = 4,
                   .prefix = 48,
                   .nested = 32,
                   .page_size = 1,
                   .num_qo_heads = 8,
                   .num_kv_heads = 8,
                   .shuffle = true});  // MHA, page 1
  specs.push_back({.groups = 2, .group_size = 3, .prefix = 16, .suffix_min = 0, .suffix_max = 0});
  specs.push_back({.groups = 2,
                   .group_size = 2,
                   .prefix = 32768,
                   .suffix_min = 0,
                   .suffix_max = 4096,
                   .shuffle = true,
                   .dtype = DType::bf16});
  specs.push_back({.groups = 3,
                   .group_size = 4,
                   .prefix = 512,
                   .nested = 64,
                   .suffix_min = 5,
                   .suffix_max = 300,
                   .qo_len = 7,
                   .shuffle = true});  // causal append
  for (auto& s : specs) {
    SharedBatch b = make_shared_batch(s);
    const CascadeRun r = run_cascade(b, s, always);
    EXPECT_TRUE(r.info.cascade) << s.str();
    EXPECT_EQ(r.info.num_levels, expected_levels(s)) << s.str();
    EXPECT_LT(r.info.cascade_kv_bytes, r.info.plain_kv_bytes) << s.str();
    expect_matches_plain(b, s, r.out, &r.lse);
  }
}

// FlashInfer's tests give cascades 16 MB; the levels share the buffer and fit their splits into
// it (at the minimum: no splits), with the same answer.
TEST_F(CascadeGpu, LevelsFitSmallWorkspaces) {
  CascadePlanOptions always;
  always.use = CascadePlanOptions::Use::kAlways;
  std::vector<SharedBatchSpec> specs;
  specs.push_back({.groups = 3, .group_size = 5, .nested = 128});
  specs.push_back({.groups = 2,
                   .group_size = 2,
                   .prefix = 32768,
                   .suffix_min = 0,
                   .suffix_max = 4096,
                   .shuffle = true,
                   .dtype = DType::bf16});
  specs.push_back({.groups = 3,
                   .group_size = 4,
                   .prefix = 512,
                   .nested = 64,
                   .suffix_min = 5,
                   .suffix_max = 300,
                   .qo_len = 7,
                   .shuffle = true});
  for (auto& s : specs) {
    for (size_t bytes : {size_t{16} << 20, SIZE_MAX}) {
      SharedBatch b = make_shared_batch(s);
      const CascadeRun r = run_cascade(b, s, always, bytes);
      EXPECT_TRUE(r.info.cascade) << s.str();
      if (bytes == SIZE_MAX) EXPECT_EQ(r.info.num_split_tiles, 0) << s.str();
      expect_matches_plain(b, s, r.out, &r.lse);
    }
  }
  // The 32k shared prompt splits in a full workspace; at the minimum it may not, and says so.
  SharedBatch b = make_shared_batch(specs[1]);
  EXPECT_TRUE(run_cascade(b, specs[1], always, SIZE_MAX).info.split_limited);
  EXPECT_FALSE(run_cascade(b, specs[1], always).info.split_limited);
}

TEST_F(CascadeGpu, AutomaticUseFollowsTheCostModel) {
  // Nothing shared (groups of one): plain attention, one level.
  SharedBatchSpec none{.groups = 8, .group_size = 1};
  SharedBatch b = make_shared_batch(none);
  CascadeRun r = run_cascade(b, none, {});
  EXPECT_FALSE(r.info.cascade);
  EXPECT_EQ(r.info.num_levels, 1);
  expect_matches_plain(b, none, r.out, &r.lse);
  // 64 requests sharing 8k tokens: hundreds of microseconds of KV reads saved.
  SharedBatchSpec big{
      .groups = 1, .group_size = 64, .prefix = 8192, .suffix_min = 128, .suffix_max = 256};
  SharedBatch b2 = make_shared_batch(big);
  r = run_cascade(b2, big, {});
  EXPECT_TRUE(r.info.cascade);
  expect_matches_plain(b2, big, r.out);
  // Forced off.
  CascadePlanOptions never;
  never.use = CascadePlanOptions::Use::kNever;
  r = run_cascade(b2, big, never);
  EXPECT_FALSE(r.info.cascade);
  expect_matches_plain(b2, big, r.out);
}

// One graph captured at the first plan; replays after plans with different sharing structures
// (3 levels, 2 levels, none), each checked against the reference.
TEST_F(CascadeGpu, CapturedRunReplaysAcrossDifferentSharing) {
  using runtime::check_cu;
  const runtime::Driver& d = runtime::driver();
  const std::vector<SharedBatchSpec> specs = {
      {.groups = 2, .group_size = 4, .nested = 64, .shuffle = true, .seed = 3},
      {.groups = 1, .group_size = 8, .prefix = 1024, .seed = 4},
      {.groups = 8, .group_size = 1, .seed = 5},
      {.groups = 4, .group_size = 2, .prefix = 32, .nested = 16, .seed = 6}};
  MultiLevelCascadeConfig cfg;
  cfg.max_batch = 8;
  cfg.max_pages = 4096;
  DeviceBuffer ws(MultiLevelCascade::workspace_bytes(cfg));
  MultiLevelCascade casc(cfg, ws.data(), ws.size());
  CascadePlanOptions opts;
  opts.use = CascadePlanOptions::Use::kAlways;
  opts.enable_cuda_graph = true;
  // Fixed device buffers the graph captures: a pool of pages big enough for every spec.
  const int64_t pool = 4096;
  HostTensor qh(DType::f16, {8, 32, 128});
  DeviceTensor dq = poisoned_like(qh), dout = poisoned_like(qh);
  HostTensor kh(DType::f16, {pool, 16, 8, 128});
  DeviceTensor dk = poisoned_like(kh), dv = poisoned_like(kh);
  PagedKVCache kv{dk.view, dv.view, KVLayout::NHD, {}, {}, {}};
  Stream st = create_stream();
  CUgraphExec exec = nullptr;
  CUgraph graph = nullptr;
  for (const auto& s : specs) {
    SharedBatch b = make_shared_batch(s);
    ASSERT_LE(b.num_pages, pool);
    ASSERT_EQ(b.batch, 8);
    check_cu(
        d.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dk.view.data()), b.k.data(), b.k.nbytes()),
        "k");
    check_cu(
        d.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dv.view.data()), b.v.data(), b.v.nbytes()),
        "v");
    check_cu(
        d.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dq.view.data()), b.q.data(), b.q.nbytes()),
        "q");
    casc.plan({nullptr, b.kv_indptr.data(), b.kv_indices.data(), b.last.data(), b.batch, 16},
              {32, 8, 128, DType::f16}, opts, st);
    EXPECT_EQ(casc.plan_info().cascade, s.group_size > 1) << s.str();
    EXPECT_EQ(casc.plan_info().num_levels, expected_levels(s)) << s.str();
    if (exec == nullptr) {
      check_cu(d.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
      casc.run(dq.view, kv, dout.view, {}, st);
      check_cu(d.cuStreamEndCapture(st, &graph), "end capture");
      check_cu(d.cuGraphInstantiate(&exec, graph, 0), "instantiate");
    }
    check_cu(d.cuGraphLaunch(exec, st), "launch");
    synchronize(st);
    HostTensor out = b.q;
    to_host(dout, out);
    expect_matches_plain(b, s, out);
  }
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  destroy_stream(st);
}

TEST_F(CascadeGpu, BadInputsRaiseNamedErrors) {
  MultiLevelCascadeConfig cfg;
  cfg.max_batch = 4;
  DeviceBuffer ws(MultiLevelCascade::workspace_bytes(cfg));
  MultiLevelCascade casc(cfg, ws.data(), ws.size());
  HostTensor qh(DType::f16, {4, 32, 128});
  DeviceTensor dq = to_device(qh.fill_random(1)), dout = poisoned_like(qh);
  PagedKVCache kv;
  EXPECT_NE(
      error_of([&] { casc.run(dq.view, kv, dout.view, {}); }).find("before a successful plan"),
      std::string::npos);
  std::vector<int32_t> indptr{0, 1, 2, 3, 4, 5}, idx{0, 1, 2, 3, 4}, last{1, 1, 1, 1, 1};
  EXPECT_NE(error_of([&] {
              casc.plan({nullptr, indptr.data(), idx.data(), last.data(), 5, 16}, {});
            }).find("batch_size"),
            std::string::npos);
  std::vector<int32_t> qo{0, 2, 3, 4, 5};
  EXPECT_NE(error_of([&] {
              casc.plan({qo.data(), indptr.data(), idx.data(), last.data(), 4, 16}, {});
            }).find("one query row per request"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              MultiLevelCascadeConfig c;
              c.max_levels = 5;
              MultiLevelCascade::workspace_bytes(c);
            }).find("max_levels"),
            std::string::npos);
}

TEST_F(CascadeGpu, Fp8CacheLevelsMatchPlainAttention) {
  // Every level reads the fp8 cache with its scales; the ⊕ of the levels stays exact.
  CascadePlanOptions always;
  always.use = CascadePlanOptions::Use::kAlways;
  SharedBatchSpec d{.groups = 3, .group_size = 5, .nested = 128};
  d.fp8_kv = DType::e4m3;
  SharedBatch b = make_shared_batch(d);
  const CascadeRun r = run_cascade(b, d, always);
  EXPECT_EQ(r.info.num_levels, expected_levels(d));
  expect_matches_plain(b, d, r.out, &r.lse);
  SharedBatchSpec p{.groups = 2, .group_size = 4, .prefix = 512, .qo_len = 17};
  p.fp8_kv = DType::e5m2;
  p.dtype = DType::bf16;
  p.seed = 9;
  SharedBatch bp = make_shared_batch(p);
  const CascadeRun rp = run_cascade(bp, p, always);
  expect_matches_plain(bp, p, rp.out, &rp.lse);
}

}  // namespace
}  // namespace flashkv::test
