// Batch decode over an fp8 (e4m3 / e5m2) KV cache on the GPU: against the CPU reference on the
// dequantized values (exact: an fp8 value times an f32 scale), with the tolerance rule of the query
// dtype; against f16 attention on the unquantized keys and values, within what fp8 rounding
// predicts; scales per tensor, as a device tensor (changed under a captured graph) and per KV
// head; split-KV, both kernels; bad input.
#include <gtest/gtest.h>

#include <cstring>

#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "gpu/decode_case.h"
#include "runtime/driver.h"

namespace flashkv::test {
namespace {

using runtime::check_cu;
using runtime::driver;

class DecodeFp8Gpu : public GpuTest {};

const std::vector<int64_t> kMixedLens = {0, 1, 17, 113, 577, 1023, 2051, 5};

// Every fp8 type with each query dtype, across head_dim 64/128/256, GQA 1/4/8/16 and MQA,
// pages 1/16/64 and NHD/HND (rotating with the case), on the auto kernel and the CUDA-core one.
TEST_F(DecodeFp8Gpu, ShapesAgainstReference) {
  struct Heads {
    int qo, kv;
  };
  const Heads heads[] = {{8, 8}, {32, 8}, {32, 4}, {32, 2}, {32, 1}};
  const int pages[] = {1, 16, 64};
  uint64_t seed = 700;
  int i = 0;
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (DType dt : {DType::f16, DType::bf16})
      for (int d : {64, 128, 256}) {
        for (int j = 0; j < 2; ++j, ++i) {  // two head shapes per (types, head_dim)
          DecodeCase c;
          c.kv_lens = kMixedLens;
          const Heads h = heads[(i * 3 + j) % 5];
          c.num_qo_heads = h.qo;
          c.num_kv_heads = h.kv;
          c.head_dim = d;
          c.page_size = pages[i % 3];
          c.dtype = dt;
          c.fp8_kv = kv;
          c.layout = i % 2 ? KVLayout::HND : KVLayout::NHD;
          c.interleaved = i % 5 == 0;
          c.seed = seed++;
          expect_decode_ok(c, run_decode_case(c));
          c.opts.backend = DecodeBackend::kCudaCores;
          expect_decode_ok(c, run_decode_case(c));
        }
      }
}

// Scales far from 1 (the logits and the output move by orders of magnitude), a [1] tensor and a
// per-KV-head tensor, on both kernels, with split-KV over one long request.
TEST_F(DecodeFp8Gpu, ScalesPerTensorAsTensorAndPerHead) {
  const KVScaleCase scales[] = {
      {1e-3f, 100.0f, 0}, {100.0f, 1e-3f, 0}, {0.7f, 1.3f, 1}, {1.0f, 1.0f, 2}, {0.05f, 20.0f, 2}};
  uint64_t seed = 800;
  for (const KVScaleCase& s : scales)
    for (DecodeBackend b : {DecodeBackend::kAuto, DecodeBackend::kCudaCores}) {
      DecodeCase c;
      c.kv_lens = {3, 4096, 31, 200};
      c.fp8_kv = seed % 2 ? DType::e5m2 : DType::e4m3;
      c.dtype = seed % 3 ? DType::f16 : DType::bf16;
      c.scale = s;
      c.opts.backend = b;
      c.seed = seed++;
      expect_decode_ok(c, run_decode_case(c));
    }
}

// Empty and length-1 requests, and one of 131072 tokens split over every SM.
TEST_F(DecodeFp8Gpu, EmptyLengthOneAndVeryLong) {
  DecodeCase c;
  c.kv_lens = {0, 1, 131072, 0, 1};
  c.fp8_kv = DType::e4m3;
  c.scale = {0.5f, 2.0f, 2};
  c.seed = 900;
  const DecodeOutcome o = run_decode_case(c);
  expect_decode_ok(c, o);
  EXPECT_GT(o.plan.num_split_tiles, 0) << "the long request was meant to split";
}

// Against attention on the unquantized keys and values (f16 cache, same logical values before
// rounding to fp8): the kernel's error stays within the error the fp8 rounding itself causes
// (the reference on the quantized cache vs the reference on the unquantized one) plus the query
// dtype's bound. Reported for the record.
TEST_F(DecodeFp8Gpu, MatchesUnquantizedAttentionWithinFp8Rounding) {
  for (DType kv : {DType::e4m3, DType::e5m2}) {
    const std::vector<int64_t> lens = {1, 100, 1000, 3000};
    const int H_qo = 32, H_kv = 8, D = 128, page = 16;
    const int64_t B = static_cast<int64_t>(lens.size());
    // One cache of f32 values; its fp8 copy rounds each value once (scale 1).
    PagedCacheHost exact = make_paged_cache(lens, page, H_kv, D, KVLayout::NHD, DType::f32, 42);
    PagedCacheHost q8 = make_paged_cache(lens, page, H_kv, D, KVLayout::NHD, kv, 42);
    for (int64_t i = 0; i < exact.k.numel(); ++i) {
      q8.k.set(i, exact.k.get(i));
      q8.v.set(i, exact.v.get(i));
    }
    HostTensor q(DType::f16, {B, H_qo, D});
    q.fill_random(43);
    HostTensor ref_exact(DType::f32, {B, H_qo, D}), ref_q8(DType::f32, {B, H_qo, D});
    reference::batch_decode(q.view(), exact.cache, ref_exact.view(), {}, {});
    reference::batch_decode(q.view(), q8.cache, ref_q8.view(), {}, {});

    DeviceCache dc = to_device(q8);
    DeviceTensor dq = to_device(q);
    HostTensor out(DType::f16, {B, H_qo, D});
    DeviceTensor dout = poisoned_like(out);
    BatchDecodeConfig cfg;
    cfg.max_batch = static_cast<int>(B);
    DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
    BatchDecode dec(cfg, ws.data(), ws.size());
    dec.plan({.kv_indptr = q8.indptr.view().data_as<int32_t>(),
              .kv_last_page_len = q8.last_page_len.view().data_as<int32_t>(),
              .batch_size = static_cast<int>(B),
              .page_size = page},
             {.num_qo_heads = H_qo, .num_kv_heads = H_kv, .head_dim = D, .kv_dtype = kv});
    dec.run(dq.view, dc.cache, dout.view, {});
    device_synchronize(0);
    to_host(dout, out);
    const double fp8_err = rel_err(ref_q8.to_doubles(), ref_exact.to_doubles());
    const double err = rel_err(out.to_doubles(), ref_exact.to_doubles());
    std::printf(
        "[ fp8 e2e ] %s: rel_err vs unquantized f32 attention %.3e (fp8 rounding alone "
        "%.3e)\n",
        dtype_name(kv), err, fp8_err);
    EXPECT_FALSE(any_nan(out.to_doubles()));
    EXPECT_LE(err, fp8_err + 2 * tolerance_floor(DType::f16)) << dtype_name(kv);
    // And what fp8 rounding predicts: a unit roundoff of 2^-4 (e4m3) / 2^-3 (e5m2) per element,
    // averaged down over the keys.
    EXPECT_LE(fp8_err, kv == DType::e4m3 ? 0.0625 : 0.125) << dtype_name(kv);
  }
}

// A captured run replays with the scale tensors' current contents: the scales change without a
// new capture. fixed_split_size keeps the output batch-invariant with fp8 too.
TEST_F(DecodeFp8Gpu, GraphReplayReadsScaleTensorsAndFixedSplitIsBatchInvariant) {
  const std::vector<int64_t> lens = {70, 1500, 9};
  const int H_qo = 16, H_kv = 4, D = 128, page = 16;
  const int64_t B = static_cast<int64_t>(lens.size());
  PagedCacheHost cache = make_paged_cache(lens, page, H_kv, D, KVLayout::NHD, DType::e4m3, 7);
  set_kv_scale(cache, {1.0f, 1.0f, 2}, 7);
  HostTensor q(DType::bf16, {B, H_qo, D});
  q.fill_random(8);
  DeviceCache dc = to_device(cache);
  DeviceTensor dq = to_device(q);
  HostTensor out(DType::bf16, {B, H_qo, D});
  DeviceTensor dout = poisoned_like(out);
  BatchDecodeConfig cfg;
  cfg.max_batch = 4;
  cfg.num_qo_heads = H_qo;
  cfg.max_kv_tokens = 4096;
  cfg.min_fixed_split_size = 64;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  DecodePlanOptions opts;
  opts.enable_cuda_graph = true;
  opts.fixed_split_size = 64;
  Stream s = create_stream();
  dec.plan({.kv_indptr = cache.indptr.view().data_as<int32_t>(),
            .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
            .batch_size = static_cast<int>(B),
            .page_size = page},
           {.num_qo_heads = H_qo,
            .num_kv_heads = H_kv,
            .head_dim = D,
            .q_dtype = DType::bf16,
            .kv_dtype = DType::e4m3,
            .o_dtype = DType::bf16},
           opts, s);
  const auto& drv = driver();
  synchronize(s);
  check_cu(drv.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture");
  dec.run(dq.view, dc.cache, dout.view, {}, s);
  CUgraph graph;
  check_cu(drv.cuStreamEndCapture(s, &graph), "end capture");
  CUgraphExec exec;
  check_cu(drv.cuGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int round = 0; round < 2; ++round) {
    // New per-head scales, written into the same device tensors the graph reads.
    set_kv_scale(cache, {round ? 3.0f : 0.25f, round ? 0.5f : 4.0f, 2}, 20 + round);
    dc.k_scale.buf.copy_from_host(cache.k_scale.data(), cache.k_scale.nbytes());
    dc.v_scale.buf.copy_from_host(cache.v_scale.data(), cache.v_scale.nbytes());
    dc.cache.scale.k = cache.cache.scale.k;  // (the host factors are baked into the capture:
    dc.cache.scale.v = cache.cache.scale.v;  // the reference must see what the graph has)
    HostTensor ref(DType::f32, {B, H_qo, D}), ref_lowp(DType::bf16, {B, H_qo, D});
    PagedKVCache as_captured = cache.cache;
    as_captured.scale.k = 1.0f;
    as_captured.scale.v = 1.0f;
    reference::batch_decode(q.view(), as_captured, ref.view(), {}, {});
    for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));
    check_cu(drv.cuGraphLaunch(exec, s), "graph launch");
    synchronize(s);
    to_host(dout, out);
    EXPECT_TRUE(
        matches_reference(out.to_doubles(), ref.to_doubles(), ref_lowp.to_doubles(), DType::bf16))
        << "replay " << round;
  }
  drv.cuGraphExecDestroy(exec);
  drv.cuGraphDestroy(graph);
  destroy_stream(s);

  // Batch invariance: requests 0-2 give the same bits in a larger batch.
  DecodeCase a;
  a.kv_lens = {70, 1500, 9};
  a.num_qo_heads = H_qo;
  a.num_kv_heads = H_kv;
  a.fp8_kv = DType::e4m3;
  a.scale = {0.5f, 2.0f, 2};
  a.opts.fixed_split_size = 64;
  a.max_kv_tokens = 4096;
  a.min_fixed_split_size = 64;
  const DecodeOutcome full = run_decode_case(a);
  expect_decode_ok(a, full);
  a.kv_lens = {70, 1500, 9, 3000, 2};  // more requests: request 0-2's bits must not change
  const DecodeOutcome more = run_decode_case(a);
  expect_decode_ok(a, more);
  const size_t row_bytes = static_cast<size_t>(H_qo) * D * 2;
  EXPECT_EQ(0, std::memcmp(full.out_host.data(), more.out_host.data(), 3 * row_bytes))
      << "fixed_split_size output changed with the rest of the batch";
}

TEST_F(DecodeFp8Gpu, BadInputRaisesNamedErrors) {
  const std::vector<int64_t> lens = {10, 20};
  PagedCacheHost cache = make_paged_cache(lens, 16, 2, 64, KVLayout::NHD, DType::e4m3, 3);
  DeviceCache dc = to_device(cache);
  HostTensor q(DType::f16, {2, 8, 64});
  q.fill_random(4);
  DeviceTensor dq = to_device(q), dout = poisoned_like(q);
  BatchDecodeConfig cfg;
  cfg.max_batch = 2;
  cfg.num_qo_heads = 8;
  cfg.head_dim = 64;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  const DecodeBatch batch{.kv_indptr = cache.indptr.view().data_as<int32_t>(),
                          .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
                          .batch_size = 2,
                          .page_size = 16};
  const AttentionShape f16{.num_qo_heads = 8, .num_kv_heads = 2, .head_dim = 64};
  // An fp8 cache given to a plan made for f16 KV.
  dec.plan(batch, f16);
  EXPECT_NE(error_of([&] { dec.run(dq.view, dc.cache, dout.view, {}); }).find("paged_kv.k"),
            std::string::npos);
  // e4m3 queries (fp8 is a KV dtype), bf16 KV under f16 q.
  EXPECT_NE(error_of([&] {
              dec.plan(batch, with(f16, &AttentionShape::q_dtype, DType::e4m3));
            }).find("q_dtype"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dec.plan(batch, with(f16, &AttentionShape::kv_dtype, DType::bf16));
            }).find("kv_dtype"),
            std::string::npos);
  // Scale tensors on the wrong device, of the wrong shape or dtype; a scale on a 16-bit cache.
  dec.plan(batch, with(f16, &AttentionShape::kv_dtype, DType::e4m3));
  HostTensor host_scale(DType::f32, {1});
  host_scale.set(0, 2.0);
  PagedKVCache bad = dc.cache;
  bad.scale.k_tensor = host_scale.view();
  EXPECT_NE(error_of([&] { dec.run(dq.view, bad, dout.view, {}); }).find("paged_kv.scale.k_tensor"),
            std::string::npos);
  HostTensor three(DType::f32, {3});
  DeviceTensor d3 = to_device(three);
  bad = dc.cache;
  bad.scale.v_tensor = d3.view;
  EXPECT_NE(error_of([&] { dec.run(dq.view, bad, dout.view, {}); }).find("paged_kv.scale.v_tensor"),
            std::string::npos);
  HostTensor i32s = make_i32({1, 1});
  DeviceTensor di = to_device(i32s);
  bad = dc.cache;
  bad.scale.k_tensor = di.view;
  EXPECT_NE(error_of([&] { dec.run(dq.view, bad, dout.view, {}); }).find("f32"), std::string::npos);
  bad = dc.cache;
  bad.scale.k = 0.0f;
  EXPECT_NE(error_of([&] { dec.run(dq.view, bad, dout.view, {}); }).find("paged_kv.scale.k"),
            std::string::npos);
  EXPECT_TRUE(all_bytes_are(dout)) << "a refused run wrote its output";
  PagedCacheHost f16_cache = make_paged_cache(lens, 16, 2, 64, KVLayout::NHD, DType::f16, 3);
  DeviceCache d16 = to_device(f16_cache);
  d16.cache.scale.k = 2.0f;
  dec.plan(batch, f16);
  EXPECT_NE(error_of([&] { dec.run(dq.view, d16.cache, dout.view, {}); }).find("fp8"),
            std::string::npos);
  EXPECT_TRUE(all_bytes_are(dout));
}

}  // namespace
}  // namespace flashkv::test
