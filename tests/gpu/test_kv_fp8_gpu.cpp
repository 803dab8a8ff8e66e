// append_paged_kv_cache into an fp8 (e4m3 / e5m2) cache on the GPU (kernels/kv/append.cuh:
// append_quantize_kernel, and append_kernel for fp8 rows) against the CPU reference over the WHOLE
// cache, bitwise: f16 / bf16 / f32 rows quantized with a per-tensor float scale, times a [1]
// tensor or a per-KV-head tensor; NHD / HND, separate and interleaved k/v, pages of 1 and 16,
// head_dim 64 / 128; 16-byte vectors and the element-by-element path (rows whose stride breaks
// the vector alignment). Row values cover every magnitude of the format, exact ties, saturation,
// infinities, zeros of both signs and (in their own test, so that a NaN encoding difference is
// told apart from a rounding one) NaN of both signs. The cache starts as a byte pattern holding
// every code: the slots no new token names must keep it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/gpu_util.h"
#include "common/kv_fp8_util.h"
#include "flashkv/device_errors.h"
#include "flashkv/kv_ops.h"
#include "flashkv/reference_kv_ops.h"
#include "gpu/append_case.h"

namespace flashkv::test {
namespace {

class KvFp8AppendGpu : public GpuTest {};

// Requests (old + new) that hit each page-boundary situation for page size ps (as
// test_kv_ops_gpu.cpp's).
void boundary_requests(int64_t ps, std::vector<int64_t>& old_lens,
                       std::vector<int64_t>& append_lens) {
  const std::vector<std::pair<int64_t, int64_t>> reqs = {
      {0, 3 * ps + 5},                        // prefill from empty over several pages
      {ps - 1, 1},                            // decode: fills its page exactly
      {ps, 1},                                // decode: starts a new page
      {2 * ps + 3, 0},                        // no new tokens
      {0, 0},                                 // empty, stays empty
      {5, 2 * ps + 7},                        // a prefill chunk after cached tokens
      {std::max<int64_t>(0, 2 * ps - 3), 3},  // crosses a page boundary
      {ps, ps},                               // a chunk that is exactly one page
  };
  for (auto [o, a] : reqs) {
    old_lens.push_back(o);
    append_lens.push_back(a);
  }
}

struct Fp8AppendCase {
  AppendCase base;  // base.dtype: the new rows' dtype (f16 / bf16 / f32, or the cache's own)
  DType cache = DType::e4m3;
  KVScaleCase scale;
  bool with_nan = false;
  std::string str() const {
    return base.str() + " -> " + dtype_name(cache) + scale.str() + (with_nan ? " with NaN" : "");
  }
};

std::string hex(unsigned b) {
  std::ostringstream os;
  os << "0x" << std::hex << (b & 0xff);
  return os.str();
}

// Builds the case (AppendInputs with its cache storage made fp8 and filled with a byte pattern,
// rows from fill_quantize_rows, or random bytes for fp8 rows), runs the reference on the host
// copy and the GPU on a device copy of the cache as it was, and expects both caches bitwise
// equal. Also expects the GPU to have left every byte outside the new tokens' slots as it was.
void expect_fp8_append_matches_reference(const Fp8AppendCase& c) {
  SCOPED_TRACE(c.str());
  const AppendCase& b = c.base;
  AppendInputs in = make_append_inputs(b);
  for (HostTensor* t : {&in.k, &in.v, &in.kv}) {
    if (t->numel() == 0) continue;
    *t = HostTensor(c.cache, t->shape());
    fill_bytes(*t, b.seed * 11 + (t == &in.v ? 2 : 1));
  }

  // Scales: host tensors for the reference, device copies for the kernel.
  PagedCacheHost sh;
  sh.cache = in.host_cache();
  set_kv_scale(sh, c.scale, b.seed);
  const KVScale host_scale = sh.cache.scale;
  auto head_scale = [&](bool is_v, int64_t h) {
    return is_v ? fp8_head_scale(host_scale.v, host_scale.v_tensor, h)
                : fp8_head_scale(host_scale.k, host_scale.k_tensor, h);
  };
  if (b.dtype == c.cache) {
    fill_bytes(in.new_k, b.seed * 11 + 3);  // copied as they are: any code
    fill_bytes(in.new_v, b.seed * 11 + 4);
  } else {
    fill_quantize_rows(
        in.new_k, b.row_pad, c.cache, [&](int64_t h) { return head_scale(false, h); }, c.with_nan,
        b.seed * 11 + 3);
    fill_quantize_rows(
        in.new_v, b.row_pad, c.cache, [&](int64_t h) { return head_scale(true, h); }, c.with_nan,
        b.seed * 11 + 4);
  }

  AppendDevice d = to_device(in, b);  // before the reference updates the host cache
  DeviceTensor dk_scale, dv_scale;
  d.cache.scale = host_scale;
  if (host_scale.k_tensor.defined()) {
    dk_scale = to_device(sh.k_scale);
    dv_scale = to_device(sh.v_scale);
    d.cache.scale.k_tensor = dk_scale.view;
    d.cache.scale.v_tensor = dv_scale.view;
  }
  const std::vector<HostTensor> before = [&] {
    std::vector<HostTensor> v;
    for (const HostTensor* t : cache_storage(in)) v.push_back(*t);
    return v;
  }();

  PagedKVCache host_cache = in.host_cache();
  host_cache.scale = host_scale;
  reference::append_paged_kv_cache(in.key_view(), in.value_view(), in.batch_indices.view(),
                                   in.positions.view(), host_cache);
  Stream s = create_stream();
  append_paged_kv_cache(d.key, d.value, d.batch_indices.view, d.positions.view, d.cache, s);
  synchronize(s);
  EXPECT_NO_THROW(check_device_errors(0, s));
  destroy_stream(s);

  const std::vector<HostTensor> got = cache_to_host(d, in);
  const std::vector<const HostTensor*> want = cache_storage(in);

  // Which elements the new tokens write (the rest must keep the pattern).
  const CacheGeometry g{b.layout, b.interleaved, b.page_size, b.num_kv_heads, b.head_dim};
  const std::vector<AppendSlot> slots =
      append_slots(in.indptr, in.indices, in.batch_indices, in.positions, b.page_size);
  std::vector<std::vector<bool>> written;
  for (const HostTensor& t : got) written.emplace_back(static_cast<size_t>(t.numel()), false);
  for (const AppendSlot& sl : slots) {
    for (bool is_v : {false, true}) {
      for (int64_t h = 0; h < b.num_kv_heads; ++h) {
        for (int64_t e = 0; e < b.head_dim; ++e) {
          written[b.interleaved ? 0 : (is_v ? 1 : 0)][g.index(sl.page, is_v, sl.slot, h, e)] = true;
        }
      }
    }
  }

  for (size_t i = 0; i < got.size(); ++i) {
    const auto* gb = static_cast<const uint8_t*>(got[i].data());
    const auto* wb = static_cast<const uint8_t*>(want[i]->data());
    const auto* bb = static_cast<const uint8_t*>(before[i].data());
    const size_t n = got[i].nbytes();
    int64_t differ = 0, first = -1, stray = 0, first_stray = -1;
    for (size_t j = 0; j < n; ++j) {
      if (gb[j] != wb[j]) {
        if (first < 0) first = static_cast<int64_t>(j);
        ++differ;
      }
      if (!written[i][j] && gb[j] != bb[j]) {
        if (first_stray < 0) first_stray = static_cast<int64_t>(j);
        ++stray;
      }
    }
    EXPECT_EQ(differ, 0) << "cache tensor " << i << ": " << differ
                         << " bytes differ from the reference's; the first at element " << first
                         << " (got " << (first < 0 ? "" : hex(gb[first])) << ", reference "
                         << (first < 0 ? "" : hex(wb[first])) << ", before the append "
                         << (first < 0 ? "" : hex(bb[first])) << ")";
    EXPECT_EQ(stray, 0) << "cache tensor " << i << ": " << stray
                        << " bytes outside the new tokens' slots changed; the first at element "
                        << first_stray;
  }
  // The test means something: with new tokens, the reference's cache did change.
  if (in.nnz > 0) {
    bool changed = false;
    for (size_t i = 0; i < before.size(); ++i)
      changed |= std::memcmp(before[i].data(), want[i]->data(), before[i].nbytes()) != 0;
    EXPECT_TRUE(changed);
  }
}

// Every (row dtype, scale kind, layout, page size, head_dim, access path) for one fp8 format.
void sweep(DType cache, uint64_t seed) {
  const std::vector<KVScaleCase> scales = {
      {.k = 1e-3f, .v = 100.0f},             // per tensor: the float alone
      {.k = 0.7f, .v = 3.3f, .tensor = 1},   // times a [1] tensor
      {.k = 1.0f, .v = 0.05f, .tensor = 2},  // times a [H_kv] tensor
  };
  for (DType src : {DType::f16, DType::bf16, DType::f32}) {
    for (const KVScaleCase& sc : scales) {
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
        for (int ps : {1, 16}) {
          for (int dim : {64, 128}) {
            // 0: contiguous rows, 16-byte vectors; 3: rows strided off the vector alignment,
            // element by element (V = 1).
            for (int pad : {0, 3}) {
              Fp8AppendCase c;
              boundary_requests(ps, c.base.old_lens, c.base.append_lens);
              c.base.page_size = ps;
              c.base.num_kv_heads = 4;
              c.base.head_dim = dim;
              c.base.layout = layout;
              c.base.dtype = src;
              c.base.row_pad = pad;
              c.base.interleaved = (seed % 5) == 0;
              c.base.seed = seed++;
              c.cache = cache;
              c.scale = sc;
              expect_fp8_append_matches_reference(c);
            }
          }
        }
      }
    }
  }
}

TEST_F(KvFp8AppendGpu, E4m3QuantizesBitwiseAsTheReference) { sweep(DType::e4m3, 1000); }

TEST_F(KvFp8AppendGpu, E5m2QuantizesBitwiseAsTheReference) { sweep(DType::e5m2, 2000); }

TEST_F(KvFp8AppendGpu, StridedRowsThatKeepTheVectorPath) {
  // Padding of 8 elements between head rows: f16 / bf16 rows keep 16-byte vectors, f32 too.
  uint64_t seed = 3000;
  for (DType cache : {DType::e4m3, DType::e5m2}) {
    for (DType src : {DType::f16, DType::bf16, DType::f32}) {
      Fp8AppendCase c;
      boundary_requests(16, c.base.old_lens, c.base.append_lens);
      c.base.dtype = src;
      c.base.row_pad = 8;
      c.base.layout = src == DType::bf16 ? KVLayout::HND : KVLayout::NHD;
      c.base.seed = seed++;
      c.cache = cache;
      c.scale = {.k = 0.3f, .v = 2.5f, .tensor = 2};
      expect_fp8_append_matches_reference(c);
    }
  }
}

TEST_F(KvFp8AppendGpu, NanInputsMatchTheReferenceBitwise) {
  // NaN of both signs (with payload bits) in f16 / bf16 / f32 rows, on both access paths: the
  // stored byte is the reference's NaN code (float_to_e4m3 / float_to_e5m2 of a NaN).
  uint64_t seed = 4000;
  for (DType cache : {DType::e4m3, DType::e5m2}) {
    for (DType src : {DType::f16, DType::bf16, DType::f32}) {
      for (int pad : {0, 3}) {
        Fp8AppendCase c;
        boundary_requests(16, c.base.old_lens, c.base.append_lens);
        c.base.dtype = src;
        c.base.row_pad = pad;
        c.base.head_dim = 64;
        c.base.seed = seed++;
        c.cache = cache;
        c.scale = {.k = 1.5f, .v = 0.25f, .tensor = 1};
        c.with_nan = true;
        expect_fp8_append_matches_reference(c);
      }
    }
  }
}

TEST_F(KvFp8AppendGpu, Fp8RowsAreCopiedWhateverTheScale) {
  // fp8 rows into a cache of their dtype: the copy kernel, every byte as it is (NaN codes and
  // e5m2 infinities included), the scales not applied.
  uint64_t seed = 5000;
  for (DType cache : {DType::e4m3, DType::e5m2}) {
    for (int pad : {0, 3}) {
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
        Fp8AppendCase c;
        boundary_requests(16, c.base.old_lens, c.base.append_lens);
        c.base.dtype = cache;
        c.base.row_pad = pad;
        c.base.layout = layout;
        c.base.interleaved = layout == KVLayout::HND;
        c.base.seed = seed++;
        c.cache = cache;
        c.scale = {.k = 0.5f, .v = 3.0f, .tensor = 2};
        expect_fp8_append_matches_reference(c);
      }
    }
  }
}

TEST_F(KvFp8AppendGpu, ManyDecodeTokensPerHeadScale) {
  // One new token per request for 257 requests (CTAs hold several tokens), 8 KV heads of 128.
  Fp8AppendCase c;
  SplitMix64 rng(7);
  for (int i = 0; i < 257; ++i) {
    c.base.old_lens.push_back(i % 16 == 0 ? 16 * (i % 5) : static_cast<int64_t>(rng.next() % 200));
    c.base.append_lens.push_back(1);
  }
  c.base.dtype = DType::bf16;
  c.scale = {.k = 0.02f, .v = 0.9f, .tensor = 2};
  uint64_t seed = 6000;
  for (DType cache : {DType::e4m3, DType::e5m2}) {
    c.cache = cache;
    c.base.seed = seed++;
    expect_fp8_append_matches_reference(c);
  }
}

TEST_F(KvFp8AppendGpu, ScalesOnTheWrongDeviceOrA16BitCacheAreRefused) {
  // Host-side checks before any launch: the cache is left as it was.
  AppendCase b;
  b.old_lens = {3};
  b.append_lens = {2};
  b.dtype = DType::f16;
  AppendInputs in = make_append_inputs(b);
  for (HostTensor* t : {&in.k, &in.v}) {
    *t = HostTensor(DType::e4m3, t->shape());
    fill_bytes(*t, 1);
  }
  AppendDevice d = to_device(in, b);
  HostTensor host_scale(DType::f32, {1});
  host_scale.fill(2.0);
  d.cache.scale.k_tensor = host_scale.view();
  EXPECT_NE(error_of([&] {
              append_paged_kv_cache(d.key, d.value, d.batch_indices.view, d.positions.view,
                                    d.cache);
            }).find("paged_kv.scale.k_tensor: expected a tensor on cuda:0"),
            std::string::npos);
  synchronize();
  const std::vector<HostTensor> got = cache_to_host(d, in);
  EXPECT_EQ(0, std::memcmp(got[0].data(), in.k.data(), in.k.nbytes()));
  EXPECT_EQ(0, std::memcmp(got[1].data(), in.v.data(), in.v.nbytes()));

  // A 16-bit cache with a scale.
  AppendInputs in16 = make_append_inputs(b);
  AppendDevice d16 = to_device(in16, b);
  d16.cache.scale.v = 0.5f;
  EXPECT_NE(error_of([&] {
              append_paged_kv_cache(d16.key, d16.value, d16.batch_indices.view, d16.positions.view,
                                    d16.cache);
            }).find("paged_kv.scale: dequantization scales apply to fp8"),
            std::string::npos);
}

}  // namespace
}  // namespace flashkv::test
