// The fused decode step (BatchDecode::run_step) against (a) the three unfused GPU ops it replaces
// — apply_rope_pos_ids, append_paged_kv_cache, run() — bitwise, cache and outputs, and (b) the CPU
// reference of the same three ops, within the tolerance rule. Shapes: GQA/MHA, head_dim 64/128/256,
// pages 1/16/64, NHD/HND/interleaved k/v, f16/bf16, each RoPE form, split-KV forced, requests of
// length 0 before the step, pages that fill exactly and new pages; CUDA-graph replays; bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

#include "common/gpu_util.h"
#include "flashkv/decode.h"
#include "flashkv/device_errors.h"
#include "flashkv/kv_ops.h"
#include "flashkv/reference.h"
#include "flashkv/reference_kv_ops.h"
#include "runtime/driver.h"

namespace flashkv::test {
namespace {

using Rope = DecodeStepOptions::Rope;

struct StepCase {
  std::vector<int64_t> kv_lens;  // after the append: the new token is at kv_len - 1
  int num_qo_heads = 32, num_kv_heads = 8, head_dim = 128, page_size = 16;
  KVLayout layout = KVLayout::NHD;
  DType dtype = DType::f16;   // q, new_k, new_v, out (and the cache unless fp8_kv says otherwise)
  DType fp8_kv = DType::f32;  // e4m3 / e5m2: an fp8 cache the step quantizes into
  KVScaleCase scale;
  bool interleaved = false;
  Rope rope = Rope::kLlama31;
  int rotary_dim = 0;
  bool rope_interleave = false;
  bool pos_ids = false;  // random RoPE positions instead of kv_len - 1
  DecodePlanOptions opts{};
  uint64_t seed = 1;

  DType kv_dtype() const { return is_fp8_dtype(fp8_kv) ? fp8_kv : dtype; }
  std::string str() const {
    std::ostringstream os;
    os << dtype_name(dtype)
       << (is_fp8_dtype(fp8_kv) ? std::string(" kv ") + dtype_name(fp8_kv) : "") << scale.str()
       << " H" << num_qo_heads << "/" << num_kv_heads << " D" << head_dim << " page " << page_size
       << " " << kv_layout_name(layout) << (interleaved ? " kv-il" : "") << " rope "
       << static_cast<int>(rope) << " rd " << rotary_dim << (rope_interleave ? " gptj" : " neox")
       << (pos_ids ? " pos_ids" : "") << " batch " << kv_lens.size() << " split "
       << opts.fixed_split_size << (opts.backend == DecodeBackend::kCudaCores ? " cuda-cores" : "");
    return os.str();
  }
};

constexpr int kMaxPosition = 1 << 17;

// The f32 cos/sin cache of Llama RoPE (rope.h's convention) for `rotary_dim`.
HostTensor make_cos_sin_cache(int rotary_dim) {
  const std::vector<double> f = rope_frequencies(rotary_dim, RopeOptions{});
  HostTensor c(DType::f32, {kMaxPosition, rotary_dim});
  for (int64_t p = 0; p < kMaxPosition; ++p)
    for (int i = 0; i < rotary_dim / 2; ++i) {
      c.set(p * rotary_dim + i, std::cos(p * f[i]));
      c.set(p * rotary_dim + rotary_dim / 2 + i, std::sin(p * f[i]));
    }
  return c;
}

// The step's inputs on the host.
struct StepInputs {
  PagedCacheHost cache;
  HostTensor q, new_k, new_v, pos, batch_indices, positions, cos_sin;
};

StepInputs make_inputs(const StepCase& c) {
  const int64_t B = static_cast<int64_t>(c.kv_lens.size());
  StepInputs in;
  in.cache = make_paged_cache(c.kv_lens, c.page_size, c.num_kv_heads, c.head_dim, c.layout,
                              c.kv_dtype(), c.seed, true, c.interleaved);
  set_kv_scale(in.cache, c.scale, c.seed);
  in.q = HostTensor(c.dtype, {B, c.num_qo_heads, c.head_dim});
  in.new_k = HostTensor(c.dtype, {B, c.num_kv_heads, c.head_dim});
  in.new_v = HostTensor(c.dtype, {B, c.num_kv_heads, c.head_dim});
  in.q.fill_random(c.seed * 3 + 1);
  in.new_k.fill_random(c.seed * 3 + 2);
  in.new_v.fill_random(c.seed * 3 + 3);
  std::vector<int64_t> pos, bi;
  SplitMix64 rng(c.seed * 3 + 4);
  for (int64_t b = 0; b < B; ++b) {
    bi.push_back(b);
    pos.push_back(c.pos_ids ? static_cast<int64_t>(rng.next() % kMaxPosition) : c.kv_lens[b] - 1);
  }
  in.pos = make_i32(pos);
  in.batch_indices = make_i32(bi);
  std::vector<int64_t> at;
  for (int64_t len : c.kv_lens) at.push_back(len - 1);
  in.positions = make_i32(at);
  if (c.rope == Rope::kCosSinCache)
    in.cos_sin = make_cos_sin_cache(c.rotary_dim ? c.rotary_dim : c.head_dim);
  return in;
}

DecodeStepOptions step_options(const StepCase& c, const TensorView& pos_ids,
                               const TensorView& cos_sin) {
  DecodeStepOptions s;
  s.rope = c.rope;
  s.llama.rotary_dim = s.llama31.rotary_dim = c.rotary_dim;
  s.llama.interleave = s.llama31.interleave = c.rope_interleave;
  s.llama.rope_theta = 5e5;
  s.cos_sin_cache = cos_sin;
  s.is_neox = !c.rope_interleave;
  if (c.pos_ids) s.pos_ids = pos_ids;
  return s;
}

// apply_rope_pos_ids / apply_llama31_rope_pos_ids / apply_rope_with_cos_sin_cache as the step's
// options say (host or device tensors alike).
void unfused_rope(const StepCase& c, const DecodeStepOptions& s, const TensorView& q,
                  const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                  const TensorView& pos, Stream stream) {
  switch (c.rope) {
    case Rope::kLlama:
      return apply_rope_pos_ids(q, k, q_rope, k_rope, pos, s.llama, stream);
    case Rope::kLlama31:
      return apply_llama31_rope_pos_ids(q, k, q_rope, k_rope, pos, s.llama31, stream);
    case Rope::kCosSinCache:
      return apply_rope_with_cos_sin_cache(q, k, q_rope, k_rope, pos, s.cos_sin_cache, s.is_neox,
                                           stream);
    case Rope::kNone:
      break;
  }
}

// The bytes of a device cache's storage (k then v, or the interleaved kv).
std::vector<unsigned char> cache_bytes(const PagedCacheHost& like, const DeviceCache& d) {
  std::vector<unsigned char> out;
  auto add = [&](const HostTensor& shape, const DeviceTensor& t) {
    HostTensor h = shape;
    to_host(t, h);
    const auto* p = static_cast<const unsigned char*>(h.data());
    out.insert(out.end(), p, p + h.nbytes());
  };
  if (like.kv.numel() > 0) {
    add(like.kv, d.kv);
  } else {
    add(like.k, d.k);
    add(like.v, d.v);
  }
  return out;
}

// The appended keys (request b, head h at kv_len - 1) of a host cache, in order.
std::vector<double> appended_keys(const StepCase& c, const PagedKVCache& kv) {
  std::vector<double> out;
  const auto* indptr = kv.indptr.data_as<const int32_t>();
  const auto* indices = kv.indices.data_as<const int32_t>();
  for (size_t b = 0; b < c.kv_lens.size(); ++b) {
    const int64_t t = c.kv_lens[b] - 1;
    const int64_t page = indices[indptr[b] + t / c.page_size];
    for (int h = 0; h < c.num_kv_heads; ++h)
      for (int d = 0; d < c.head_dim; ++d)
        out.push_back(load_as_double(kv.k.data(), c.kv_dtype(),
                                     page * kv.page_stride() +
                                         (t % c.page_size) * kv.token_stride() +
                                         h * kv.head_stride() + d));
  }
  return out;
}

void run_step_case(const StepCase& c) {
  SCOPED_TRACE(c.str());
  const int64_t B = static_cast<int64_t>(c.kv_lens.size());
  StepInputs in = make_inputs(c);

  // The CPU reference of rope -> append -> decode.
  StepInputs ref = make_inputs(c);  // same seed: the same cache and inputs
  HostTensor q_rope = in.q, k_rope = in.new_k;
  DecodeStepOptions host_opts = step_options(c, {}, in.cos_sin.view());
  if (c.rope != Rope::kNone) {
    unfused_rope(c, host_opts, in.q.view(), in.new_k.view(), q_rope.view(), k_rope.view(),
                 in.pos.view(), nullptr);
  }
  reference::append_paged_kv_cache(k_rope.view(), in.new_v.view(), in.batch_indices.view(),
                                   in.positions.view(), ref.cache.cache);
  HostTensor out_ref(DType::f32, {B, c.num_qo_heads, c.head_dim}), out_lowp = in.q;
  HostTensor lse_ref(DType::f32, {B, c.num_qo_heads});
  reference::batch_decode(q_rope.view(), ref.cache.cache, out_ref.view(), lse_ref.view(), {});
  for (int64_t i = 0; i < out_ref.numel(); ++i) out_lowp.set(i, out_ref.get(i));

  // GPU: unfused on cache A, fused on cache B.
  DeviceCache a = to_device(in.cache), b = to_device(in.cache);
  DeviceTensor dq = to_device(in.q), dk = to_device(in.new_k), dv = to_device(in.new_v);
  DeviceTensor dpos = to_device(in.pos), dbi = to_device(in.batch_indices),
               dat = to_device(in.positions);
  DeviceTensor dcs = c.rope == Rope::kCosSinCache ? to_device(in.cos_sin) : DeviceTensor{};
  DeviceTensor dq_rope = poisoned_like(in.q), dk_rope = poisoned_like(in.new_k);
  HostTensor lse_shape(DType::f32, {B, c.num_qo_heads});
  DeviceTensor out_a = poisoned_like(in.q), out_b = poisoned_like(in.q);
  DeviceTensor lse_a = poisoned_like(lse_shape), lse_b = poisoned_like(lse_shape);
  const DecodeStepOptions s = step_options(c, dpos.view, dcs.view);

  BatchDecodeConfig cfg;
  cfg.max_batch = std::max<int>(1, static_cast<int>(B));
  cfg.num_qo_heads = c.num_qo_heads;
  cfg.head_dim = c.head_dim;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  Stream st = create_stream();
  dec.plan({.kv_indptr = in.cache.indptr.view().data_as<int32_t>(),
            .kv_last_page_len = in.cache.last_page_len.view().data_as<int32_t>(),
            .batch_size = static_cast<int>(B),
            .page_size = c.page_size},
           {.num_qo_heads = c.num_qo_heads,
            .num_kv_heads = c.num_kv_heads,
            .head_dim = c.head_dim,
            .q_dtype = c.dtype,
            .kv_dtype = c.kv_dtype(),
            .o_dtype = c.dtype},
           c.opts, st);
  if (c.opts.fixed_split_size > 0 &&
      *std::max_element(c.kv_lens.begin(), c.kv_lens.end()) > c.opts.fixed_split_size) {
    EXPECT_GT(dec.plan_info().num_split_tiles, 0) << "the case was meant to split";
  }
  const TensorView q_in = c.rope == Rope::kNone ? dq.view : dq_rope.view;
  const TensorView k_in = c.rope == Rope::kNone ? dk.view : dk_rope.view;
  if (c.rope != Rope::kNone)
    unfused_rope(c, s, dq.view, dk.view, dq_rope.view, dk_rope.view, dpos.view, st);
  append_paged_kv_cache(k_in, dv.view, dbi.view, dat.view, a.cache, st);
  dec.run(q_in, a.cache, out_a.view, lse_a.view, st);
  dec.run_step(dq.view, dk.view, dv.view, b.cache, out_b.view, lse_b.view, s, st);
  synchronize(st);
  destroy_stream(st);
  check_device_errors(0);

  HostTensor oa = in.q, ob = in.q, la = lse_shape, lb = lse_shape;
  to_host(out_a, oa);
  to_host(out_b, ob);
  to_host(lse_a, la);
  to_host(lse_b, lb);
  EXPECT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.nbytes())) << "fused output != unfused output";
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.nbytes())) << "fused lse != unfused lse";
  EXPECT_TRUE(cache_bytes(in.cache, a) == cache_bytes(in.cache, b))
      << "the fused step's cache differs from the unfused append's";
  EXPECT_TRUE(
      matches_reference(ob.to_doubles(), out_ref.to_doubles(), out_lowp.to_doubles(), c.dtype));
  EXPECT_LE(rel_err(lb.to_doubles(), lse_ref.to_doubles()), 1e-4);

  // The cache after the fused step: the appended keys within one unit roundoff of the reference's
  // (both round the same rotation once; the GPU's is in f32), everything else bitwise.
  PagedCacheHost got = make_paged_cache(c.kv_lens, c.page_size, c.num_kv_heads, c.head_dim,
                                        c.layout, c.kv_dtype(), c.seed, true, c.interleaved);
  if (got.kv.numel() > 0) {
    to_host(b.kv, got.kv);
  } else {
    to_host(b.k, got.k);
    to_host(b.v, got.v);
  }
  // (fp8: a rotation that rounds to the other side of a 16-bit tie moves the quantized key by up
  // to one fp8 step, 2^-3 of it: a few such keys stay far below 2^-4 of the norm.)
  EXPECT_LE(rel_err(appended_keys(c, got.cache), appended_keys(c, ref.cache.cache)),
            is_fp8_dtype(c.fp8_kv) ? 0.0625 : tolerance_floor(c.dtype));
  const HostTensor& ref_v = got.kv.numel() > 0 ? ref.cache.kv : ref.cache.v;
  const HostTensor& got_v = got.kv.numel() > 0 ? got.kv : got.v;
  if (got.kv.numel() == 0) {
    EXPECT_EQ(0, std::memcmp(ref_v.data(), got_v.data(), got_v.nbytes())) << "value cache";
  }
}

class DecodeStepGpu : public GpuTest {};

TEST_F(DecodeStepGpu, Llama31GqaMatchesUnfusedAndReference) {
  StepCase c;
  c.kv_lens = {1, 17, 300, 4097, 16, 33, 2, 1000};  // 1: empty before the step; 16: page fills;
  run_step_case(c);                                 // 17, 33: the append starts a page
  c.opts.fixed_split_size = 64;  // every long request split: the last chunk's CTA appends
  c.seed = 2;
  run_step_case(c);
}

TEST_F(DecodeStepGpu, LayoutsDtypesPagesAndRopeForms) {
  StepCase c;
  c.kv_lens = {5, 64, 65, 129, 700};
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
    for (DType dt : {DType::f16, DType::bf16})
      for (int page : {1, 16, 64}) {
        c.layout = layout;
        c.dtype = dt;
        c.page_size = page;
        c.seed += 1;
        run_step_case(c);
      }
  c = StepCase{};
  c.kv_lens = {3, 200, 4100};
  c.rope = Rope::kLlama;
  c.rotary_dim = 64;  // partial rotary: dims 64..127 copied
  c.rope_interleave = true;
  c.pos_ids = true;
  run_step_case(c);
  c.rope = Rope::kCosSinCache;
  c.rope_interleave = false;
  c.interleaved = true;
  run_step_case(c);
  c.rope = Rope::kNone;
  run_step_case(c);
}

TEST_F(DecodeStepGpu, Fp8CachesQuantizeLikeTheUnfusedAppend) {
  // The step quantizes the rotated key and the value with the cache's scales exactly as
  // append_paged_kv_cache does: cache and outputs bitwise equal to the unfused ops.
  StepCase c;
  c.kv_lens = {1, 17, 300, 4097, 16, 33};
  const KVScaleCase scales[] = {
      {1.0f, 1.0f, 0}, {0.02f, 0.5f, 0}, {0.5f, 2.0f, 2}, {4.0f, 0.25f, 1}};
  int i = 0;
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (DType dt : {DType::f16, DType::bf16}) {
      c.fp8_kv = kv;
      c.dtype = dt;
      c.scale = scales[i % 4];
      c.layout = i % 2 ? KVLayout::HND : KVLayout::NHD;
      c.page_size = i % 3 ? 16 : 1;
      c.head_dim = i % 2 ? 64 : 128;
      c.opts.backend = i % 2 ? DecodeBackend::kCudaCores : DecodeBackend::kAuto;
      c.opts.fixed_split_size = i == 2 ? 64 : 0;  // the last chunk's CTA appends
      c.rope = i == 3 ? Rope::kNone : Rope::kLlama31;
      c.seed = 500 + i++;
      run_step_case(c);
    }
}

TEST_F(DecodeStepGpu, HeadDimsGroupsAndBothKernels) {
  StepCase c;
  c.kv_lens = {1, 31, 513, 2000};
  c.opts.fixed_split_size = 128;
  for (auto [hq, hk, d] :
       {std::tuple{8, 8, 64}, {32, 8, 64}, {16, 1, 128}, {32, 2, 128}, {8, 8, 256}, {32, 4, 256}}) {
    c.num_qo_heads = hq;
    c.num_kv_heads = hk;
    c.head_dim = d;
    c.seed += 1;
    run_step_case(c);
  }
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.opts.backend = DecodeBackend::kCudaCores;
  run_step_case(c);
}

TEST_F(DecodeStepGpu, OneLongRequestSplitOverAllSms) {
  StepCase c;
  c.kv_lens = {32768};
  run_step_case(c);
}

// A serving loop: run_step captured once into a CUDA graph (at the full batch), then per step the
// requests grow by one token (new pages allocated as they fill, one request leaving), re-plan and
// replay. A twin cache runs the unfused ops eagerly; caches and outputs must agree bitwise.
TEST_F(DecodeStepGpu, CapturedStepReplaysAcrossReplans) {
  using runtime::check_cu;
  const runtime::Driver& d = runtime::driver();
  constexpr int kBatch = 6, kHqo = 32, kHkv = 8, kD = 128, kPage = 16, kPool = 320, kSteps = 12;
  constexpr AttentionShape kShape{.num_qo_heads = kHqo,
                                  .num_kv_heads = kHkv,
                                  .head_dim = kD,
                                  .q_dtype = DType::f16,
                                  .kv_dtype = DType::f16,
                                  .o_dtype = DType::f16};
  std::vector<int64_t> lens{1, 15, 16, 40, 900, 3000};
  std::vector<std::vector<int64_t>> pages(kBatch);
  int next_page = 0;
  // Page ids handed out in a scrambled order from the pool.
  auto alloc = [&] { return (next_page++ * 37) % kPool; };
  for (int b = 0; b < kBatch; ++b)
    while (static_cast<int64_t>(pages[b].size()) * kPage < lens[b] + kSteps)
      pages[b].push_back(alloc());
  HostTensor pool_k(DType::f16, {kPool, kPage, kHkv, kD}), pool_v = pool_k;
  pool_k.fill_random(5);
  pool_v.fill_random(6);
  DeviceTensor ka = to_device(pool_k), va = to_device(pool_v), kb = to_device(pool_k),
               vb = to_device(pool_v);
  HostTensor q(DType::f16, {kBatch, kHqo, kD}), nk(DType::f16, {kBatch, kHkv, kD}), nv = nk;
  DeviceTensor dq = to_device(q), dk = to_device(nk), dv = to_device(nk);
  DeviceTensor dq_rope = to_device(q), dk_rope = to_device(nk);
  DeviceTensor out_a = poisoned_like(q), out_b = poisoned_like(q);
  HostTensor idx_cap(DType::i32, {kPool});
  idx_cap.fill(0);
  DeviceTensor indices = to_device(idx_cap);
  HostTensor pos_h(DType::i32, {kBatch}), bi_h(DType::i32, {kBatch});
  DeviceTensor pos = to_device(pos_h), bi = to_device(bi_h);

  BatchDecodeConfig cfg;
  cfg.max_batch = kBatch;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  DecodePlanOptions opts;
  opts.enable_cuda_graph = true;
  DecodeStepOptions s;
  s.rope = Rope::kLlama31;
  Stream st = create_stream();
  CUgraphExec exec = nullptr;
  CUgraph graph = nullptr;
  int batch = kBatch;
  for (int step = 0; step < kSteps; ++step) {
    if (step == 6) batch = kBatch - 1;  // the last request leaves
    std::vector<int32_t> indptr{0}, last, flat;
    std::vector<int64_t> at;
    for (int b = 0; b < batch; ++b) {
      lens[b] += 1;
      const int64_t np = (lens[b] + kPage - 1) / kPage;
      for (int64_t j = 0; j < np; ++j) flat.push_back(static_cast<int32_t>(pages[b][j]));
      indptr.push_back(static_cast<int32_t>(flat.size()));
      last.push_back(static_cast<int32_t>(lens[b] - (np - 1) * kPage));
      at.push_back(lens[b] - 1);
    }
    ASSERT_LE(flat.size(), static_cast<size_t>(kPool));
    q.fill_random(100 + step);
    nk.fill_random(200 + step);
    nv.fill_random(300 + step);
    for (auto [h, dt] : {std::pair{&q, &dq}, {&nk, &dk}, {&nv, &dv}}) {
      check_cu(d.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dt->view.data()), h->data(),
                                   h->nbytes(), st),
               "upload");
    }
    HostTensor at_t = make_i32(at), bi_t = make_i32([&] {
                                      std::vector<int64_t> v;
                                      for (int b = 0; b < batch; ++b) v.push_back(b);
                                      return v;
                                    }());
    HostTensor ip_t = make_i32(std::vector<int64_t>(indptr.begin(), indptr.end()));
    HostTensor last_t = make_i32(std::vector<int64_t>(last.begin(), last.end()));
    HostTensor flat_t = make_i32(std::vector<int64_t>(flat.begin(), flat.end()));
    check_cu(d.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(indices.view.data()), flat_t.data(),
                                 flat_t.nbytes(), st),
             "indices");
    check_cu(d.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(pos.view.data()), at_t.data(),
                                 at_t.nbytes(), st),
             "positions");
    check_cu(d.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(bi.view.data()), bi_t.data(),
                                 bi_t.nbytes(), st),
             "batch indices");
    DeviceTensor ip_d = to_device(ip_t), last_d = to_device(last_t);
    PagedKVCache ca{ka.view, va.view, KVLayout::NHD, ip_d.view, indices.view, last_d.view};
    PagedKVCache cb{kb.view, vb.view, KVLayout::NHD, ip_d.view, indices.view, last_d.view};
    dec.plan({.kv_indptr = indptr.data(),
              .kv_last_page_len = last.data(),
              .batch_size = batch,
              .page_size = kPage},
             kShape, opts, st);
    // Unfused, eager, on cache A.
    const TensorView posv = pos.view.slice0(0, batch), biv = bi.view.slice0(0, batch);
    apply_llama31_rope_pos_ids(dq.view.slice0(0, batch), dk.view.slice0(0, batch),
                               dq_rope.view.slice0(0, batch), dk_rope.view.slice0(0, batch), posv,
                               s.llama31, st);
    append_paged_kv_cache(dk_rope.view.slice0(0, batch), dv.view.slice0(0, batch), biv, posv, ca,
                          st);
    dec.run(dq_rope.view, ca, out_a.view, {}, st);
    // Fused: captured at the first step, replayed after.
    if (exec == nullptr) {
      check_cu(d.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture");
      dec.run_step(dq.view, dk.view, dv.view, cb, out_b.view, {}, s, st);
      check_cu(d.cuStreamEndCapture(st, &graph), "end capture");
      check_cu(d.cuGraphInstantiate(&exec, graph, 0), "instantiate");
    }
    check_cu(d.cuGraphLaunch(exec, st), "graph launch");
    synchronize(st);
    HostTensor oa = q, ob = q;
    to_host(out_a, oa);
    to_host(out_b, ob);
    EXPECT_EQ(0, std::memcmp(oa.data(), ob.data(), static_cast<size_t>(batch) * kHqo * kD * 2))
        << "step " << step;
    HostTensor ha = pool_k, hb = pool_k;
    to_host(ka, ha);
    to_host(kb, hb);
    EXPECT_EQ(0, std::memcmp(ha.data(), hb.data(), ha.nbytes())) << "k cache, step " << step;
    to_host(va, ha);
    to_host(vb, hb);
    EXPECT_EQ(0, std::memcmp(ha.data(), hb.data(), ha.nbytes())) << "v cache, step " << step;
  }
  d.cuGraphExecDestroy(exec);
  d.cuGraphDestroy(graph);
  destroy_stream(st);
  check_device_errors(0);
}

TEST_F(DecodeStepGpu, BadInputsRaiseNamedErrors) {
  StepInputs in = make_inputs(StepCase{.kv_lens = {4, 1, 9}});
  DeviceCache dc = to_device(in.cache);
  DeviceTensor dq = to_device(in.q), dk = to_device(in.new_k), dv = to_device(in.new_v);
  DeviceTensor out = poisoned_like(in.q);
  BatchDecodeConfig cfg;
  cfg.max_batch = 4;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  DecodeStepOptions s;
  s.rope = Rope::kLlama31;
  EXPECT_NE(error_of([&] {
              dec.run_step(dq.view, dk.view, dv.view, dc.cache, out.view, {}, s);
            }).find("before a successful plan()"),
            std::string::npos);
  const AttentionShape shape{.num_qo_heads = 32,
                             .num_kv_heads = 8,
                             .head_dim = 128,
                             .q_dtype = DType::f16,
                             .kv_dtype = DType::f16,
                             .o_dtype = DType::f16};
  // A plan with a request of kv_len 0 has no slot for its new token.
  std::vector<int32_t> indptr{0, 1, 1, 2}, last{4, 0, 9};
  dec.plan({.kv_indptr = indptr.data(),
            .kv_last_page_len = last.data(),
            .batch_size = 3,
            .page_size = 16},
           shape);
  EXPECT_NE(error_of([&] {
              dec.run_step(dq.view, dk.view, dv.view, dc.cache, out.view, {}, s);
            }).find("kv_len >= 1"),
            std::string::npos);
  dec.plan({.kv_indptr = in.cache.indptr.view().data_as<int32_t>(),
            .kv_last_page_len = in.cache.last_page_len.view().data_as<int32_t>(),
            .batch_size = 3,
            .page_size = 16},
           shape);
  EXPECT_NE(error_of([&] {
              dec.run_step(dq.view, dq.view, dv.view, dc.cache, out.view, {}, s);
            }).find("new_k"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dec.run_step(dq.view, dk.view, dk.view.slice0(0, 2), dc.cache, out.view, {}, s);
            }).find("new_v"),
            std::string::npos);
  HostTensor short_cache(DType::f32, {8, 128});
  short_cache.fill_random(3);
  DeviceTensor dshort = to_device(short_cache);
  s.rope = Rope::kCosSinCache;
  s.cos_sin_cache = dshort.view;
  EXPECT_NE(error_of([&] {
              dec.run_step(dq.view, dk.view, dv.view, dc.cache, out.view, {}, s);
            }).find("cos_sin_cache"),
            std::string::npos);
  // A device-side bad position: reported by check_device_errors; that request's new token is not
  // written (its slot keeps its old bytes), the other requests' tokens are.
  HostTensor bad_pos = make_i32({0, -5, 2});
  DeviceTensor dbad = to_device(bad_pos);
  s.rope = Rope::kLlama31;
  s.pos_ids = dbad.view;
  HostTensor before = in.cache.k, after = in.cache.k;
  to_host(dc.k, before);
  dec.run_step(dq.view, dk.view, dv.view, dc.cache, out.view, {}, s);
  EXPECT_NE(error_of([&] { check_device_errors(0); }).find("-5"), std::string::npos);
  check_device_errors(0);  // reset: no error left
  to_host(dc.k, after);
  const PagedKVCache& hc = in.cache.cache;
  auto slot_bytes = [&](const HostTensor& t, int r, int64_t pos) {
    const int64_t page =
        hc.indices.data_as<const int32_t>()[hc.indptr.data_as<const int32_t>()[r] + pos / 16];
    const auto* base = static_cast<const unsigned char*>(t.data()) +
                       (page * hc.page_stride() + (pos % 16) * hc.token_stride()) * 2;
    return std::vector<unsigned char>(base, base + 8 * 128 * 2);  // NHD: the token's 8 heads
  };
  EXPECT_TRUE(slot_bytes(before, 1, 0) == slot_bytes(after, 1, 0)) << "a bad position was appended";
  EXPECT_FALSE(slot_bytes(before, 0, 3) == slot_bytes(after, 0, 3))
      << "a good token was not appended";
}

// A CUDA graph that captured run_step holds its new_k / new_v / pos_ids pointers: a later plan
// with more requests than those hold is refused (the replay would read past them).
TEST_F(DecodeStepGpu, PlanRefusesWhatACapturedStepCannotRun) {
  using runtime::check_cu;
  const runtime::Driver& d = runtime::driver();
  StepInputs in = make_inputs(StepCase{.kv_lens = {5, 40, 17, 300, 9, 70}});
  DeviceCache dc = to_device(in.cache);
  HostTensor q8(DType::f16, {8, 32, 128}), k4(DType::f16, {4, 8, 128});
  DeviceTensor dq = to_device(q8.fill_random(1)), out = poisoned_like(q8);
  DeviceTensor dk = to_device(k4.fill_random(2)), dv = to_device(k4.fill_random(3));
  BatchDecodeConfig cfg;
  cfg.max_batch = 8;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  DecodePlanOptions opts;
  opts.enable_cuda_graph = true;
  // The first n requests of the table.
  const auto first = [&](int n) {
    return DecodeBatch{.kv_indptr = in.cache.indptr.view().data_as<int32_t>(),
                       .kv_last_page_len = in.cache.last_page_len.view().data_as<int32_t>(),
                       .batch_size = n,
                       .page_size = 16};
  };
  const AttentionShape shape{.num_qo_heads = 32,
                             .num_kv_heads = 8,
                             .head_dim = 128,
                             .q_dtype = DType::f16,
                             .kv_dtype = DType::f16,
                             .o_dtype = DType::f16};
  Stream st = create_stream();
  dec.plan(first(4), shape, opts, st);
  DecodeStepOptions s;
  s.rope = Rope::kLlama31;
  CUgraph graph;
  check_cu(d.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
  dec.run_step(dq.view, dk.view, dv.view, dc.cache, out.view, {}, s, st);
  check_cu(d.cuStreamEndCapture(st, &graph), "end capture");
  EXPECT_NE(error_of([&] { dec.plan(first(6), shape, opts, st); }).find("new_k"),
            std::string::npos);
  dec.plan(first(3), shape, opts, st);  // fits
  d.cuGraphDestroy(graph);
  dec.forget_captured_graphs();
  dec.plan(first(6), shape, opts, st);
  synchronize(st);
  destroy_stream(st);
}

}  // namespace
}  // namespace flashkv::test
