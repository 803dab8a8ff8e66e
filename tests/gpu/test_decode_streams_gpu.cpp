// plan() and run() of one BatchDecode on more than one stream, with no host synchronization
// between steps: a plan must wait for the last run() and the last plan's copy, whatever stream
// they were on (they read and write the same workspace; runtime/plan_upload.h). Each run's output
// is checked against the reference.
#include <gtest/gtest.h>

#include "flashkv/reference.h"
#include "gpu/decode_case.h"

namespace flashkv::test {
namespace {

class DecodeStreamsGpu : public GpuTest {};

// One batch's inputs on the device and its reference output.
struct StreamBatch {
  PagedCacheHost cache;
  DeviceCache dc;
  HostTensor q, ref, ref_lowp;
  DeviceTensor dq;
};

StreamBatch make_batch(const std::vector<int64_t>& lens, int hq, int hkv, int d, uint64_t seed) {
  StreamBatch b;
  const int64_t B = static_cast<int64_t>(lens.size());
  b.cache = make_paged_cache(lens, 16, hkv, d, KVLayout::NHD, DType::f16, seed);
  b.q = HostTensor(DType::f16, {B, hq, d});
  b.q.fill_random(seed * 7 + 1);
  b.ref = HostTensor(DType::f32, {B, hq, d});
  b.ref_lowp = HostTensor(DType::f16, {B, hq, d});
  reference::batch_decode(b.q.view(), b.cache.cache, b.ref.view(), TensorView(),
                          AttentionOptions{});
  for (int64_t i = 0; i < b.ref.numel(); ++i) b.ref_lowp.set(i, b.ref.get(i));
  b.dc = to_device(b.cache);
  b.dq = to_device(b.q);
  return b;
}

TEST_F(DecodeStreamsGpu, PlansOnAnyStreamOrderAfterTheLastRunAndCopy) {
  constexpr int kHq = 32, kHkv = 8, kD = 128;
  // A: long requests, split across the GPU (its run reads the plan and the partial slots for
  // tens of microseconds); B: short and ragged, a different plan and grid.
  const StreamBatch a = make_batch({16384, 12000, 9000, 4096}, kHq, kHkv, kD, 11);
  const StreamBatch b = make_batch({1, 17, 300, 0, 1023, 64, 5, 2000}, kHq, kHkv, kD, 12);
  BatchDecodeConfig cfg;
  cfg.max_batch = 8;
  cfg.num_qo_heads = kHq;
  cfg.head_dim = kD;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  Stream s1 = create_stream(), s2 = create_stream();
  // (batch, the stream of its plan() and run()): replans on the other stream both ways, and on
  // the same stream.
  struct Step {
    const StreamBatch* batch;
    Stream stream;
  };
  const std::vector<Step> steps = {{&a, s1}, {&b, s2}, {&a, s1}, {&a, s2},
                                   {&b, s2}, {&a, s2}, {&b, s1}, {&a, s1}};
  std::vector<DeviceTensor> outs;
  std::vector<HostTensor> hosts;
  for (const Step& st : steps) {
    const StreamBatch& x = *st.batch;
    const int B = static_cast<int>(x.q.shape()[0]);
    hosts.emplace_back(DType::f16, x.q.shape());
    outs.push_back(poisoned_like(hosts.back()));
    dec.plan({.kv_indptr = x.cache.indptr.view().data_as<int32_t>(),
              .kv_last_page_len = x.cache.last_page_len.view().data_as<int32_t>(),
              .batch_size = B,
              .page_size = 16},
             {.num_qo_heads = kHq,
              .num_kv_heads = kHkv,
              .head_dim = kD,
              .q_dtype = DType::f16,
              .kv_dtype = DType::f16,
              .o_dtype = DType::f16},
             {}, st.stream);
    dec.run(x.dq.view, x.dc.cache, outs.back().view, TensorView(), st.stream);
  }
  synchronize(s1);
  synchronize(s2);
  for (size_t i = 0; i < steps.size(); ++i) {
    to_host(outs[i], hosts[i]);
    EXPECT_TRUE(matches_reference(hosts[i].to_doubles(), steps[i].batch->ref.to_doubles(),
                                  steps[i].batch->ref_lowp.to_doubles(), DType::f16))
        << "step " << i;
  }
  destroy_stream(s1);
  destroy_stream(s2);
}

}  // namespace
}  // namespace flashkv::test
