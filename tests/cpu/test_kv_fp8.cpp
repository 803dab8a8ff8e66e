// The fp8 (e4m3 / e5m2) KV cache on the CPU: check_kv_scale's refusals name the argument; the
// reference attention over an fp8 cache with scales (per tensor, per KV head) equals the reference
// over an f32 cache holding the dequantized values; the quantizing append stores exactly
// float_to_e4m3 / float_to_e5m2(float(x) / scale, saturate) in each new slot, pins the rounding of
// exact ties, saturation, infinities and NaN, and leaves every other byte alone; plan checks take
// a 16-bit q over an fp8 cache and nothing else new.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/cuda_view.h"
#include "common/gpu_util.h"
#include "common/kv_fp8_util.h"
#include "common/test_util.h"
#include "flashkv/attention.h"
#include "flashkv/error.h"
#include "flashkv/kv_ops.h"
#include "flashkv/plan_checks.h"
#include "flashkv/reference.h"

namespace flashkv {
namespace {

using test::error_of;
using test::make_i32;

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kNaNF = std::numeric_limits<float>::quiet_NaN();

// --- check_kv_scale ----------------------------------------------------------------------------

struct ScaleTensors {
  HostTensor one{DType::f32, {1}}, heads{DType::f32, {8}};
  ScaleTensors() {
    one.fill(0.5);
    heads.fill_random(3, 0.5, 2.0);
  }
};

void check8(const KVScale& s, DType dt = DType::e4m3, Device dev = Device::cpu(),
            bool gpu = false) {
  check_kv_scale(s, dt, 8, dev, gpu, "paged_kv.scale");
}

TEST(KvFp8Scale, AcceptsFactorsAndTensorsOfOneOrNumKvHeads) {
  const ScaleTensors t;
  for (DType dt : {DType::e4m3, DType::e5m2}) {
    for (bool gpu : {false, true}) {
      EXPECT_NO_THROW(check8({}, dt, Device::cpu(), gpu));
      EXPECT_NO_THROW(check8({.k = 1e-3f, .v = 100.0f}, dt, Device::cpu(), gpu));
      EXPECT_NO_THROW(check8({.k = 2.0f, .k_tensor = t.one.view()}, dt, Device::cpu(), gpu));
      EXPECT_NO_THROW(
          check8({.k_tensor = t.heads.view(), .v_tensor = t.one.view()}, dt, Device::cpu(), gpu));
    }
    // Tensors on the cache's device (views that claim cuda:0: nothing reads them here).
    EXPECT_NO_THROW(check8({.k_tensor = test::as_cuda_view(t.heads.view()),
                            .v_tensor = test::as_cuda_view(t.one.view())},
                           dt, Device::cuda(0), true));
  }
  // The CPU reference takes scales for any dtype.
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    EXPECT_NO_THROW(check8({.k = 3.0f, .v_tensor = t.heads.view()}, dt, Device::cpu(), false));
  }
}

TEST(KvFp8Scale, WrongDtypeNamesTheTensor) {
  HostTensor h16(DType::f16, {8}), bf(DType::bf16, {1}), i32(DType::i32, {8});
  EXPECT_ERROR_HAS(check8({.k_tensor = h16.view()}),
                   "paged_kv.scale.k_tensor: expected f32, got f16");
  EXPECT_ERROR_HAS(check8({.v_tensor = bf.view()}),
                   "paged_kv.scale.v_tensor: expected f32, got bf16");
  EXPECT_ERROR_HAS(check8({.k_tensor = i32.view()}),
                   "paged_kv.scale.k_tensor: expected f32, got i32");
}

TEST(KvFp8Scale, WrongShapeNamesTheTensorAndTheHeadCount) {
  HostTensor three(DType::f32, {3}), two_d(DType::f32, {8, 1}), empty(DType::f32, {0});
  EXPECT_ERROR_HAS(check8({.k_tensor = three.view()}),
                   "paged_kv.scale.k_tensor: expected shape [1] or [8] (num_kv_heads), got [3]");
  EXPECT_ERROR_HAS(check8({.v_tensor = three.view()}),
                   "paged_kv.scale.v_tensor: expected shape [1] or [8] (num_kv_heads), got [3]");
  EXPECT_ERROR_HAS(check8({.k_tensor = two_d.view()}),
                   "paged_kv.scale.k_tensor: expected shape [1] or [8] (num_kv_heads), got [8, 1]");
  EXPECT_ERROR_HAS(check8({.v_tensor = empty.view()}), "paged_kv.scale.v_tensor: expected shape");
  // Per head, but every other float: not contiguous.
  HostTensor sixteen(DType::f32, {16});
  const TensorView strided(sixteen.data(), DType::f32, {8}, {2}, Device::cpu());
  EXPECT_ERROR_HAS(check8({.k_tensor = strided}),
                   "paged_kv.scale.k_tensor: expected a contiguous tensor");
}

TEST(KvFp8Scale, WrongDeviceNamesTheTensorAndTheCachesDevice) {
  const ScaleTensors t;
  // A host cache with a tensor on cuda:0 (a view with a host pointer: only its device is read).
  EXPECT_ERROR_HAS(check8({.k_tensor = test::as_cuda_view(t.heads.view())}),
                   "paged_kv.scale.k_tensor: expected a tensor on cpu (the cache's device), got "
                   "cuda:0");
  // A cuda:0 cache with a host tensor.
  EXPECT_ERROR_HAS(check8({.v_tensor = t.one.view()}, DType::e4m3, Device::cuda(0), true),
                   "paged_kv.scale.v_tensor: expected a tensor on cuda:0 (the cache's device), got "
                   "cpu");
  EXPECT_ERROR_HAS(
      check8({.k_tensor = test::as_cuda_view(t.one.view())}, DType::e5m2, Device::cuda(1), true),
      "paged_kv.scale.k_tensor: expected a tensor on cuda:1");
}

TEST(KvFp8Scale, FactorsMustBeFiniteAndPositive) {
  for (float bad : {0.0f, -0.0f, -1.0f, kInfF, -kInfF, kNaNF}) {
    SCOPED_TRACE(bad);
    EXPECT_ERROR_HAS(check8({.k = bad}), "paged_kv.scale.k: expected a finite scale > 0, got ");
    EXPECT_ERROR_HAS(check8({.v = bad}), "paged_kv.scale.v: expected a finite scale > 0, got ");
  }
  EXPECT_NO_THROW(check8({.k = std::numeric_limits<float>::denorm_min(), .v = 3e38f}));
}

TEST(KvFp8Scale, SixteenBitCachesTakeNoScaleOnTheGpu) {
  const ScaleTensors t;
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::string want = std::string("paged_kv.scale: dequantization scales apply to fp8 ") +
                             "(e4m3, e5m2) caches on the GPU; this cache is " + dtype_name(dt);
    EXPECT_ERROR_HAS(check8({.k = 2.0f}, dt, Device::cpu(), true), want);
    EXPECT_ERROR_HAS(check8({.v = 0.5f}, dt, Device::cpu(), true), want);
    // A tensor is a scale even when its entries happen to be 1.
    HostTensor ones(DType::f32, {1});
    ones.fill(1.0);
    EXPECT_ERROR_HAS(check8({.v_tensor = ones.view()}, dt, Device::cpu(), true), want);
    EXPECT_NO_THROW(check8({}, dt, Device::cpu(), true));
    EXPECT_NO_THROW(check8({.k = 2.0f, .v_tensor = ones.view()}, dt, Device::cpu(), false));
  }
}

// A cache of 2 requests (17 and 3 tokens, pages of 4, 2 KV heads, head_dim 8).
test::PagedCacheHost small_cache(DType dt) {
  return test::make_paged_cache({17, 3}, 4, 2, 8, KVLayout::NHD, dt, 5);
}

TEST(KvFp8Scale, EveryOpOverTheCacheChecksItsScale) {
  // validate_shapes() runs check_kv_scale, naming paged_kv.scale; the reference ops call it.
  test::PagedCacheHost c = small_cache(DType::e4m3);
  HostTensor q(DType::f16, {2, 4, 8}), out(DType::f32, {2, 4, 8});
  q.fill_random(1);
  HostTensor three(DType::f32, {3});
  three.fill(1.0);
  c.cache.scale.k_tensor = three.view();
  EXPECT_ERROR_HAS(reference::batch_decode(q.view(), c.cache, out.view(), {}),
                   "paged_kv.scale.k_tensor: expected shape [1] or [2] (num_kv_heads), got [3]");
  c.cache.scale = {.v = -2.0f};
  EXPECT_ERROR_HAS(reference::batch_decode(q.view(), c.cache, out.view(), {}),
                   "paged_kv.scale.v: expected a finite scale > 0");
  c.cache.scale = {};
  // The paged ops take the cache's scales, not AttentionOptions::kv_scale.
  AttentionOptions opts;
  opts.kv_scale.k = 2.0f;
  EXPECT_ERROR_HAS(reference::batch_decode(q.view(), c.cache, out.view(), {}, opts),
                   "opts.kv_scale: the paged ops take the cache's scales (paged_kv.scale)");
  const HostTensor qo_indptr = make_i32({0, 1, 2});
  EXPECT_ERROR_HAS(
      reference::batch_prefill_paged(q.view(), qo_indptr.view(), c.cache, out.view(), {}, opts),
      "opts.kv_scale: the paged ops take the cache's scales (paged_kv.scale)");
  // Contiguous KV: opts.kv_scale, checked under that name.
  opts.kv_scale = {.k = kNaNF};
  EXPECT_ERROR_HAS(
      reference::batch_prefill_ragged(q.view(), qo_indptr.view(), c.k_ragged.view(),
                                      c.v_ragged.view(), c.kv_indptr.view(), out.view(), {}, opts),
      "opts.kv_scale.k: expected a finite scale > 0");
}

TEST(KvFp8Scale, ValidateShapesUsesTheCachesDevice) {
  // A cache on cuda:0 (views of host memory; validate_shapes reads no element): a host scale
  // tensor is refused, and so is any scale on a 16-bit cache.
  for (DType dt : {DType::e4m3, DType::f16}) {
    test::PagedCacheHost c = small_cache(dt);
    PagedKVCache kv = c.cache;
    kv.k = test::as_cuda_view(c.k.view());
    kv.v = test::as_cuda_view(c.v.view());
    kv.indptr = test::as_cuda_view(c.indptr.view());
    kv.indices = test::as_cuda_view(c.indices.view());
    kv.last_page_len = test::as_cuda_view(c.last_page_len.view());
    EXPECT_NO_THROW(kv.validate_shapes());
    HostTensor one(DType::f32, {1});
    one.fill(2.0);
    kv.scale.k_tensor = one.view();
    EXPECT_ERROR_HAS(kv.validate_shapes(), "paged_kv.scale.k_tensor: expected a tensor on cuda:0");
    kv.scale = {.k = 2.0f};
    if (dt == DType::e4m3) {
      EXPECT_NO_THROW(kv.validate_shapes());
    } else {
      EXPECT_ERROR_HAS(kv.validate_shapes(), "paged_kv.scale: dequantization scales apply to fp8");
    }
  }
}

// --- the reference over an fp8 cache -----------------------------------------------------------

struct RefCase {
  DType fp8;
  KVLayout layout;
  int page_size;
  test::KVScaleCase scale;
};

// An f32 cache with `c`'s page table holding each fp8 element times its head's f32 scale (the
// product rounded to f32 once; exact when the scale has few significant bits, e.g. 100).
test::PagedCacheHost dequantized_copy(const test::PagedCacheHost& c,
                                      const std::vector<int64_t>& lens, int page_size, int heads,
                                      int dim, KVLayout layout, uint64_t seed) {
  test::PagedCacheHost f =
      test::make_paged_cache(lens, page_size, heads, dim, layout, DType::f32, seed);
  EXPECT_EQ(f.indices.to_doubles(), c.indices.to_doubles());  // same seed: same page table
  for (bool is_v : {false, true}) {
    const HostTensor& src = is_v ? c.v : c.k;
    HostTensor& dst = is_v ? f.v : f.k;
    const float factor = is_v ? c.cache.scale.v : c.cache.scale.k;
    const TensorView& t = is_v ? c.cache.scale.v_tensor : c.cache.scale.k_tensor;
    for (int64_t i = 0; i < src.numel(); ++i) {
      const int64_t h =
          layout == KVLayout::NHD ? (i / dim) % heads : (i / (int64_t{dim} * page_size)) % heads;
      dst.set(i, src.get(i) * static_cast<double>(test::fp8_head_scale(factor, t, h)));
    }
  }
  return f;
}

TEST(KvFp8Reference, AttentionOverAScaledFp8CacheEqualsTheDequantizedF32Cache) {
  const std::vector<int64_t> lens = {37, 1, 16, 100, 5};
  const std::vector<int64_t> qo_lens = {5, 1, 0, 16, 5};  // prefill: <= the KV lengths
  const int hq = 8, hk = 2, dim = 64;
  const std::vector<test::KVScaleCase> scales = {
      {.k = 1e-3f, .v = 100.0f},               // per tensor, floats only
      {.k = 100.0f, .v = 1e-3f, .tensor = 1},  // times a [1] tensor
      {.k = 1e-3f, .v = 100.0f, .tensor = 2},  // times a per-KV-head tensor
      {.k = 1.0f, .v = 1.0f, .tensor = 2},     // the tensor alone
  };
  uint64_t seed = 10;
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
      for (const test::KVScaleCase& sc : scales) {
        const int ps = layout == KVLayout::NHD ? 16 : 5;
        ++seed;
        SCOPED_TRACE(std::string(dtype_name(fp8)) + " " + kv_layout_name(layout) + " page " +
                     std::to_string(ps) + sc.str());
        test::PagedCacheHost c = test::make_paged_cache(lens, ps, hk, dim, layout, fp8, seed);
        test::set_kv_scale(c, sc, seed);
        const test::PagedCacheHost f = dequantized_copy(c, lens, ps, hk, dim, layout, seed);

        // Decode: one query row per request.
        const auto batch = static_cast<int64_t>(lens.size());
        HostTensor q(DType::f16, {batch, hq, dim});
        q.fill_random(seed * 3 + 1);
        HostTensor out8(DType::f32, {batch, hq, dim}), out32(DType::f32, {batch, hq, dim});
        HostTensor lse8(DType::f32, {batch, hq}), lse32(DType::f32, {batch, hq});
        reference::batch_decode(q.view(), c.cache, out8.view(), lse8.view());
        reference::batch_decode(q.view(), f.cache, out32.view(), lse32.view());
        EXPECT_LE(test::rel_err(out8.to_doubles(), out32.to_doubles()), 1e-6) << "decode out";
        EXPECT_LE(test::rel_err(lse8.to_doubles(), lse32.to_doubles()), 1e-6) << "decode lse";
        // The scales were applied: without them the output is another one.
        HostTensor out_raw(DType::f32, {batch, hq, dim});
        PagedKVCache unscaled = c.cache;
        unscaled.scale = {};
        reference::batch_decode(q.view(), unscaled, out_raw.view(), {});
        EXPECT_GT(test::rel_err(out_raw.to_doubles(), out32.to_doubles()), 1e-2)
            << "the scales changed nothing";

        // Prefill, causal, ragged queries.
        std::vector<int64_t> qo_ptr = {0};
        for (int64_t n : qo_lens) qo_ptr.push_back(qo_ptr.back() + n);
        const HostTensor qo_indptr = make_i32(qo_ptr);
        const int64_t nq = qo_ptr.back();
        HostTensor pq(DType::bf16, {nq, hq, dim});
        pq.fill_random(seed * 3 + 2);
        HostTensor pout8(DType::f32, {nq, hq, dim}), pout32(DType::f32, {nq, hq, dim});
        HostTensor plse8(DType::f32, {nq, hq}), plse32(DType::f32, {nq, hq});
        const AttentionOptions causal{.causal = true};
        reference::batch_prefill_paged(pq.view(), qo_indptr.view(), c.cache, pout8.view(),
                                       plse8.view(), causal);
        reference::batch_prefill_paged(pq.view(), qo_indptr.view(), f.cache, pout32.view(),
                                       plse32.view(), causal);
        EXPECT_LE(test::rel_err(pout8.to_doubles(), pout32.to_doubles()), 1e-6) << "prefill out";
        EXPECT_LE(test::rel_err(plse8.to_doubles(), plse32.to_doubles()), 1e-6) << "prefill lse";
        EXPECT_FALSE(test::any_nan(pout8.to_doubles()));
      }
    }
  }
}

// --- the quantizing append (reference) ---------------------------------------------------------

// One append into an fp8 cache: requests with old_lens[i] cached tokens get append_lens[i] new
// ones; pages handed out scrambled, plus spare pages no request owns.
struct Fp8Append {
  test::CacheGeometry g;
  DType fp8, src;
  std::vector<int64_t> old_lens = {0, 3, 4, 7, 0, 1}, append_lens = {9, 1, 1, 0, 0, 14};
  HostTensor indptr, indices, last_page_len, batch_indices, positions;
  HostTensor k, v, kv;  // storage (kv when interleaved), filled with a byte pattern
  HostTensor new_k, new_v;
  HostTensor k_scale, v_scale;  // f32 scale tensors, when the case has them
  KVScale scale;

  Fp8Append(KVLayout layout, bool interleaved, int64_t page_size, int64_t heads, int64_t dim,
            DType fp8_, DType src_, uint64_t seed)
      : fp8(fp8_), src(src_) {
    g = {layout, interleaved, page_size, heads, dim};
    std::vector<int64_t> ptr = {0}, last, aptr = {0}, lens;
    int64_t pages = 0;
    for (size_t i = 0; i < old_lens.size(); ++i) {
      const int64_t len = old_lens[i] + append_lens[i], n = (len + page_size - 1) / page_size;
      pages += n;
      ptr.push_back(pages);
      last.push_back(n == 0 ? 0 : len - (n - 1) * page_size);
      aptr.push_back(aptr.back() + append_lens[i]);
      lens.push_back(len);
    }
    const int64_t num_pages = pages + 2;  // two spare pages
    std::vector<int64_t> ids;
    for (int64_t p = 0; p < pages; ++p) ids.push_back((p * 5 + 3) % num_pages);
    indptr = make_i32(ptr);
    indices = make_i32(ids);
    last_page_len = make_i32(last);
    const HostTensor append_indptr = make_i32(aptr), seq_lens = make_i32(lens);
    BatchIndicesPositions bp =
        get_batch_indices_positions(append_indptr.view(), seq_lens.view(), aptr.back());
    batch_indices = std::move(bp.batch_indices);
    positions = std::move(bp.positions);
    std::vector<int64_t> shape = {num_pages};
    if (interleaved) shape.push_back(2);
    if (layout == KVLayout::NHD) {
      shape.insert(shape.end(), {page_size, heads, dim});
    } else {
      shape.insert(shape.end(), {heads, page_size, dim});
    }
    if (interleaved) {
      kv = HostTensor(fp8, shape);
      test::fill_bytes(kv, seed * 7 + 1);
    } else {
      k = HostTensor(fp8, shape);
      v = HostTensor(fp8, shape);
      test::fill_bytes(k, seed * 7 + 1);
      test::fill_bytes(v, seed * 7 + 2);
    }
    new_k = HostTensor(src, {aptr.back(), heads, dim});
    new_v = HostTensor(src, {aptr.back(), heads, dim});
  }

  // Scales: the factors, times a tensor of 1 entry (tensor 1) or of one entry per head (2).
  void set_scale(float kf, float vf, int tensor, const std::vector<float>& entries_k = {},
                 const std::vector<float>& entries_v = {}) {
    scale = {.k = kf, .v = vf};
    if (tensor > 0) {
      const int64_t n = tensor == 1 ? 1 : g.heads;
      k_scale = HostTensor(DType::f32, {n});
      v_scale = HostTensor(DType::f32, {n});
      for (int64_t i = 0; i < n; ++i) {
        k_scale.set(i, entries_k.empty() ? 0.6 + 0.37 * static_cast<double>(i) : entries_k[i]);
        v_scale.set(i, entries_v.empty() ? 1.9 - 0.21 * static_cast<double>(i) : entries_v[i]);
      }
      scale.k_tensor = k_scale.view();
      scale.v_tensor = v_scale.view();
    }
  }
  float head_scale(bool is_v, int64_t h) const {
    return is_v ? test::fp8_head_scale(scale.v, scale.v_tensor, h)
                : test::fp8_head_scale(scale.k, scale.k_tensor, h);
  }
  void fill_rows(bool with_nan, uint64_t seed) {
    test::fill_quantize_rows(
        new_k, 0, fp8, [&](int64_t h) { return head_scale(false, h); }, with_nan, seed * 7 + 3);
    test::fill_quantize_rows(
        new_v, 0, fp8, [&](int64_t h) { return head_scale(true, h); }, with_nan, seed * 7 + 4);
  }

  PagedKVCache cache() const {
    PagedKVCache c = g.interleaved
                         ? PagedKVCache::interleaved(kv.view(), g.layout, indptr.view(),
                                                     indices.view(), last_page_len.view())
                         : PagedKVCache{k.view(),      v.view(),       g.layout,
                                        indptr.view(), indices.view(), last_page_len.view()};
    c.scale = scale;
    return c;
  }
  void run() {
    append_paged_kv_cache(new_k.view(), new_v.view(), batch_indices.view(), positions.view(),
                          cache());
  }
  const HostTensor& storage(bool is_v) const { return g.interleaved ? kv : (is_v ? v : k); }
};

std::string hex(unsigned b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[(b >> 4) & 15] + digits[b & 15];
}

// Runs the append and checks every byte of the cache: each new element is
// fp8_quantized(float(x), its head's scale), every other byte is what it was. Returns the bytes
// the new elements got, in (token, k/v, head, d) order.
std::vector<uint8_t> append_and_check(Fp8Append& a, const std::string& what) {
  std::vector<std::vector<uint8_t>> want;
  for (bool is_v : {false, true}) {
    const HostTensor& s = a.storage(is_v);
    const auto* p = static_cast<const uint8_t*>(s.data());
    want.emplace_back(p, p + s.nbytes());
    if (a.g.interleaved) break;
  }
  const std::vector<test::AppendSlot> slots =
      test::append_slots(a.indptr, a.indices, a.batch_indices, a.positions, a.g.page_size);
  std::vector<uint8_t> stored;
  const int64_t heads = a.g.heads, dim = a.g.dim;
  for (size_t t = 0; t < slots.size(); ++t) {
    for (bool is_v : {false, true}) {
      const HostTensor& rows = is_v ? a.new_v : a.new_k;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < dim; ++d) {
          const int64_t i = (static_cast<int64_t>(t) * heads + h) * dim + d;
          const uint8_t b =
              test::fp8_quantized(test::element_as_float(rows, i), a.head_scale(is_v, h), a.fp8);
          want[a.g.interleaved ? 0 : (is_v ? 1 : 0)]
              [a.g.index(slots[t].page, is_v, slots[t].slot, h, d)] = b;
          stored.push_back(b);
        }
      }
    }
  }
  a.run();
  for (size_t i = 0; i < want.size(); ++i) {
    const auto* got = static_cast<const uint8_t*>(a.storage(i == 1).data());
    int64_t bad = 0, first = -1;
    for (size_t j = 0; j < want[i].size(); ++j) {
      if (got[j] != want[i][j]) {
        if (first < 0) first = static_cast<int64_t>(j);
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << what << ": cache tensor " << i << ", first difference at element " << first
                      << " (got " << (first < 0 ? "" : hex(got[first])) << ", expected "
                      << (first < 0 ? "" : hex(want[i][first])) << ")";
  }
  return stored;
}

TEST(KvFp8Append, QuantizesEachElementAndLeavesEveryOtherByteAlone) {
  struct ScaleSetup {
    float k, v;
    int tensor;
    std::vector<float> ek, ev;
  };
  const std::vector<ScaleSetup> setups = {
      {1e-3f, 100.0f, 0, {}, {}},  // per tensor, floats
      {0.5f, 4.0f, 0, {}, {}},     // per tensor, powers of two: exact ties
      {0.7f, 1.3f, 1, {}, {}},     // times a [1] tensor
      {1.0f, 1.0f, 2, {}, {}},     // per KV head
      {3.0f, 1e-3f, 2, {}, {}},    // factor times per head
      {1.0f, 1.0f, 2, {0.25f, 2.0f, 0.5f}, {8.0f, 0.125f, 1.0f}},  // per head, powers of two
  };
  uint64_t seed = 100;
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    for (DType src : {DType::f16, DType::bf16, DType::f32}) {
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
        for (const ScaleSetup& s : setups) {
          for (bool with_nan : {false, true}) {
            ++seed;
            const bool interleaved = seed % 3 == 0;
            Fp8Append a(layout, interleaved, 4, 3, 16, fp8, src, seed);
            a.set_scale(s.k, s.v, s.tensor, s.ek, s.ev);
            a.fill_rows(with_nan, seed);
            const std::string what = std::string(dtype_name(src)) + " -> " + dtype_name(fp8) + " " +
                                     kv_layout_name(layout) + (interleaved ? " interleaved" : "") +
                                     " scale k " + std::to_string(s.k) + " v " +
                                     std::to_string(s.v) + " tensor " + std::to_string(s.tensor) +
                                     (with_nan ? " with NaN" : "");
            SCOPED_TRACE(what);
            const std::vector<uint8_t> stored = append_and_check(a, what);
            // The inputs meant something: saturated, zero, and (with NaN) NaN codes were stored.
            const uint8_t max_code = fp8 == DType::e4m3 ? 0x7e : 0x7b;
            int64_t saturated = 0, zeros = 0, nans = 0;
            for (uint8_t b : stored) {
              saturated += (b & 0x7f) == max_code;
              zeros += (b & 0x7f) == 0;
              nans += fp8 == DType::e4m3 ? (b & 0x7f) == 0x7f : (b & 0x7f) > 0x7c;
            }
            EXPECT_GT(saturated, 10);
            EXPECT_GT(zeros, 10);
            if (with_nan) {
              EXPECT_GT(nans, 10);
            } else {
              EXPECT_EQ(nans, 0);
            }
          }
        }
      }
    }
  }
}

// Pinned bytes (not derived from float_to_e4m3 / float_to_e5m2): round-to-nearest-even on exact
// ties, subnormals, saturation of finite values and infinities, zeros' signs, NaN. Values are in
// units of the format, stored times a power-of-two scale (so the division is exact).
TEST(KvFp8Append, PinsTiesSaturationAndSpecialValues) {
  struct Pin {
    double units;
    uint8_t e4m3, e5m2;
  };
  const double inf = std::numeric_limits<double>::infinity();
  // Bytes worked out by hand (e4m3: bias 7, 3 mantissa bits, max 448; e5m2: bias 15, 2 bits, max
  // 57344); every value is exact in f16, bf16 and f32 at the scales used, or overflows f16 to an
  // infinity, which saturates alike.
  const std::vector<Pin> pins = {
      {1.0, 0x38, 0x3c},      {-1.0, 0xb8, 0xbc},
      {1.0625, 0x38, 0x3c},    // e4m3: tie 1 | 1.125 -> 1 (even)
      {1.1875, 0x3a, 0x3d},    // e4m3: tie 1.125 | 1.25 -> 1.25 (even)
      {1.125, 0x39, 0x3c},     // e5m2: tie 1 | 1.25 -> 1
      {1.375, 0x3b, 0x3e},     // e5m2: tie 1.25 | 1.5 -> 1.5
      {0.171875, 0x23, 0x32},  // e5m2: tie 0.15625 | 0.1875 -> 0.1875
      {248.0, 0x78, 0x5c},     // e4m3: tie 240 | 256 -> 256
      {0x1p-10, 0x00, 0x14},   // e4m3: tie 0 | 2^-9 (smallest subnormal) -> +0
      {0x3p-10, 0x02, 0x1a},   // e4m3: tie 2^-9 | 2^-8 -> 2^-8
      {0x5p-10, 0x02, 0x1d},   // e4m3: tie 2^-8 | 3 * 2^-9 -> 2^-8
      {0x1p-17, 0x00, 0x00},   // e5m2: tie 0 | 2^-16 -> +0
      {-0x1p-17, 0x80, 0x80},  // ... -0
      {0x3p-17, 0x00, 0x02},   // e5m2: tie 2^-16 | 2^-15 -> 2^-15
      {448.0, 0x7e, 0x5f},     // e4m3 max
      {464.0, 0x7e, 0x5f},     // e4m3: half an ulp past the max -> the max
      {-1000.0, 0xfe, 0xe4},   // e4m3 saturates; e5m2 -1024
      {57344.0, 0x7e, 0x7b},   // e5m2 max
      {61440.0, 0x7e, 0x7b},   // e5m2: half an ulp past the max -> the max
      {-1e9, 0xfe, 0xfb},      // saturates
      {inf, 0x7e, 0x7b},       // infinities saturate
      {-inf, 0xfe, 0xfb},     {0.0, 0x00, 0x00},
      {-0.0, 0x80, 0x80},
  };
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    for (DType src : {DType::f16, DType::bf16, DType::f32}) {
      for (float s : {0.5f, 1.0f, 8.0f}) {
        SCOPED_TRACE(std::string(dtype_name(src)) + " -> " + dtype_name(fp8) + " scale " +
                     std::to_string(s));
        const int64_t dim = 32;  // >= pins.size() + 2
        ASSERT_LE(pins.size() + 2, static_cast<size_t>(dim));
        Fp8Append a(KVLayout::NHD, false, 4, 1, dim, fp8, src, 9);
        a.set_scale(s, s, 0);
        for (int64_t i = 0; i < a.new_k.numel(); ++i) {
          const int64_t d = i % dim;
          if (d < static_cast<int64_t>(pins.size())) {
            a.new_k.set(i, pins[d].units * s);
            a.new_v.set(i, pins[d].units * s);
          } else {
            test::set_nan(a.new_k, i, d % 2 == 1);
            test::set_nan(a.new_v, i, d % 2 == 1);
          }
        }
        a.run();
        const std::vector<test::AppendSlot> slots =
            test::append_slots(a.indptr, a.indices, a.batch_indices, a.positions, 4);
        const auto* kb = static_cast<const uint8_t*>(a.k.data());
        const auto* vb = static_cast<const uint8_t*>(a.v.data());
        for (size_t t = 0; t < slots.size(); ++t) {
          for (int64_t d = 0; d < dim; ++d) {
            const int64_t at = a.g.index(slots[t].page, false, slots[t].slot, 0, d);
            const uint8_t got = kb[at];
            EXPECT_EQ(got, vb[at]) << "k and v got different bytes for one value, d " << d;
            if (d >= static_cast<int64_t>(pins.size())) {
              // NaN stays a NaN (which of the NaN codes is the bitwise tests' business).
              const bool nan = fp8 == DType::e4m3 ? (got & 0x7f) == 0x7f : (got & 0x7f) > 0x7c;
              EXPECT_TRUE(nan) << "NaN (d " << d << ") stored as " << hex(got);
              continue;
            }
            const Pin& p = pins[d];
            const uint8_t want = fp8 == DType::e4m3 ? p.e4m3 : p.e5m2;
            EXPECT_EQ(got, want) << p.units << " units stored as " << hex(got) << ", expected "
                                 << hex(want);
          }
        }
      }
    }
  }
}

TEST(KvFp8Append, Fp8RowsIntoTheirCacheAreCopiedUnscaled) {
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    Fp8Append a(KVLayout::HND, false, 4, 3, 16, fp8, fp8, 21);
    a.set_scale(0.3f, 7.0f, 2);
    test::fill_bytes(a.new_k, 22);  // every code, NaN and (e5m2) infinities included
    test::fill_bytes(a.new_v, 23);
    const std::vector<test::AppendSlot> slots =
        test::append_slots(a.indptr, a.indices, a.batch_indices, a.positions, 4);
    std::vector<uint8_t> want_k(static_cast<const uint8_t*>(a.k.data()),
                                static_cast<const uint8_t*>(a.k.data()) + a.k.nbytes());
    std::vector<uint8_t> want_v(static_cast<const uint8_t*>(a.v.data()),
                                static_cast<const uint8_t*>(a.v.data()) + a.v.nbytes());
    const auto* nk = static_cast<const uint8_t*>(a.new_k.data());
    const auto* nv = static_cast<const uint8_t*>(a.new_v.data());
    for (size_t t = 0; t < slots.size(); ++t) {
      for (int64_t h = 0; h < 3; ++h) {
        for (int64_t d = 0; d < 16; ++d) {
          const int64_t src = (static_cast<int64_t>(t) * 3 + h) * 16 + d;
          want_k[a.g.index(slots[t].page, false, slots[t].slot, h, d)] = nk[src];
          want_v[a.g.index(slots[t].page, true, slots[t].slot, h, d)] = nv[src];
        }
      }
    }
    a.run();
    EXPECT_EQ(0, std::memcmp(a.k.data(), want_k.data(), want_k.size())) << dtype_name(fp8);
    EXPECT_EQ(0, std::memcmp(a.v.data(), want_v.data(), want_v.size())) << dtype_name(fp8);
  }
}

TEST(KvFp8Append, RefusesRowsOfAnotherDtypeNamingTheArgument) {
  // A 16-bit cache still takes only its own dtype.
  {
    Fp8Append a(KVLayout::NHD, false, 4, 3, 16, DType::f16, DType::bf16, 31);
    EXPECT_ERROR_HAS(a.run(), "append_key: expected dtype f16, got bf16");
  }
  {
    Fp8Append a(KVLayout::NHD, false, 4, 3, 16, DType::bf16, DType::f32, 31);
    EXPECT_ERROR_HAS(a.run(), "append_key: expected dtype bf16, got f32");
  }
  // An fp8 cache: f16 / bf16 / f32 rows or its own dtype; not the other fp8 format, not i32.
  {
    Fp8Append a(KVLayout::NHD, false, 4, 3, 16, DType::e5m2, DType::e4m3, 32);
    EXPECT_ERROR_HAS(a.run(), "append_key: expected dtype f16 or bf16 or f32, got e4m3");
  }
  {
    Fp8Append a(KVLayout::NHD, false, 4, 3, 16, DType::e4m3, DType::i32, 33);
    EXPECT_ERROR_HAS(a.run(), "append_key: expected dtype");
  }
  // Key and value rows of two dtypes.
  {
    Fp8Append a(KVLayout::NHD, false, 4, 3, 16, DType::e4m3, DType::f16, 34);
    a.new_v = HostTensor(DType::bf16, a.new_v.shape());
    EXPECT_ERROR_HAS(a.run(), "append_value: expected dtype f16, got bf16");
  }
  // A bad scale is refused before anything is written.
  {
    Fp8Append a(KVLayout::NHD, false, 4, 3, 16, DType::e4m3, DType::f16, 35);
    a.new_k.fill_random(1);
    a.new_v.fill_random(2);
    a.set_scale(0.0f, 1.0f, 0);
    const HostTensor before = a.k;
    EXPECT_ERROR_HAS(a.run(), "paged_kv.scale.k: expected a finite scale > 0");
    EXPECT_EQ(0, std::memcmp(before.data(), a.k.data(), a.k.nbytes()));
  }
}

// --- plan checks -------------------------------------------------------------------------------

TEST(KvFp8PlanChecks, SixteenBitQueriesOverAnFp8Cache) {
  const std::vector<int32_t> indptr = {0, 3, 3}, last = {8, 0}, qo = {0, 5, 6};
  auto decode = [&](DType q, DType kv, DType o, PlanTarget t) {
    check_decode_plan(indptr.data(), last.data(), 2, 32, 8, 128, 16, q, kv, o, t);
  };
  auto prefill = [&](DType q, DType kv, DType o, PlanTarget t, bool paged) {
    check_prefill_plan(qo.data(), indptr.data(), paged ? last.data() : nullptr, 2, 32, 8, 128, 16,
                       paged, q, kv, o, t);
  };
  for (PlanTarget t : {PlanTarget::kGpu, PlanTarget::kHost}) {
    for (DType q : {DType::f16, DType::bf16}) {
      for (DType kv : {DType::e4m3, DType::e5m2}) {
        EXPECT_NO_THROW(decode(q, kv, q, t));
        EXPECT_NO_THROW(prefill(q, kv, q, t, true));
        EXPECT_NO_THROW(prefill(q, kv, q, t, false));
      }
    }
    // fp8 queries: refused naming q_dtype.
    for (DType fp8 : {DType::e4m3, DType::e5m2}) {
      EXPECT_ERROR_HAS(decode(fp8, fp8, fp8, t), "q_dtype: expected f16");
      EXPECT_ERROR_HAS(prefill(fp8, fp8, fp8, t, true), "q_dtype: expected f16");
      EXPECT_ERROR_HAS(decode(fp8, DType::e4m3, DType::f16, t), "q_dtype");
      // The output stays in q's dtype.
      EXPECT_ERROR_HAS(decode(DType::f16, fp8, fp8, t), "o_dtype: expected f16 (the q dtype)");
      EXPECT_ERROR_HAS(prefill(DType::bf16, fp8, fp8, t, false),
                       "o_dtype: expected bf16 (the q dtype)");
    }
    // Any other KV dtype than q's or fp8.
    EXPECT_ERROR_HAS(decode(DType::f16, DType::bf16, DType::f16, t),
                     "kv_dtype: expected f16 (the q dtype) or an fp8 dtype (e4m3, e5m2), got bf16");
    EXPECT_ERROR_HAS(prefill(DType::bf16, DType::i32, DType::bf16, t, true), "kv_dtype");
  }
  // f32 queries are the CPU reference's only: over an fp8 cache the GPU refuses them (q_dtype).
  EXPECT_ERROR_HAS(decode(DType::f32, DType::e4m3, DType::f32, PlanTarget::kGpu),
                   "q_dtype: expected f16 or bf16, got f32");
  EXPECT_ERROR_HAS(prefill(DType::f32, DType::e5m2, DType::f32, PlanTarget::kGpu, true),
                   "q_dtype: expected f16 or bf16, got f32");
  EXPECT_ERROR_HAS(prefill(DType::f32, DType::e4m3, DType::f32, PlanTarget::kGpu, false),
                   "q_dtype: expected f16 or bf16, got f32");
}

}  // namespace
}  // namespace flashkv
