// Tests of the CPU reference backend: hand-computed cases, an independent naive formula, the ⊕
// identities, edge rows (empty, fully masked), layout/storage equivalences and argument checks.
// The reference is the oracle of every GPU test, so it is checked against things it does not
// share code with: closed forms, a textbook formula, and itself through different storage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "flashkv/error.h"
#include "flashkv/reference.h"

namespace flashkv {
namespace {

using test::HostTensor;
using test::make_i32;
using test::make_paged_cache;
using test::make_tensor;
using test::rel_err;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kF32Tol = 1e-6;  // relative error of an f32-rounded double result

struct Result {
  std::vector<double> o, lse;
};

// Textbook attention over dense NHD doubles, written without the max trick and without any code
// of the reference: q[qo_len, hq, d], k/v[kv_len, hkv, d].
Result naive_attention(const std::vector<double>& q, int64_t qo_len, int hq,
                       const std::vector<double>& k, const std::vector<double>& v, int64_t kv_len,
                       int hkv, int d, double scale, bool causal) {
  Result r{std::vector<double>(qo_len * hq * d, 0.0), std::vector<double>(qo_len * hq, kNegInf)};
  for (int64_t i = 0; i < qo_len; ++i) {
    const int64_t visible =
        causal ? std::min(kv_len, std::max<int64_t>(0, kv_len - qo_len + i + 1)) : kv_len;
    for (int h = 0; h < hq; ++h) {
      const int g = h / (hq / hkv);
      double sum = 0.0;
      std::vector<double> acc(d, 0.0);
      for (int64_t j = 0; j < visible; ++j) {
        double s = 0.0;
        for (int x = 0; x < d; ++x) s += q[(i * hq + h) * d + x] * k[(j * hkv + g) * d + x];
        const double p = std::exp(scale * s);
        sum += p;
        for (int x = 0; x < d; ++x) acc[x] += p * v[(j * hkv + g) * d + x];
      }
      if (visible == 0) continue;
      for (int x = 0; x < d; ++x) r.o[(i * hq + h) * d + x] = acc[x] / sum;
      r.lse[i * hq + h] = std::log(sum);
    }
  }
  return r;
}

// Output tensors start as NaN so an element the reference forgot to write shows up.
struct Outputs {
  HostTensor out, lse;
  Outputs(int64_t rows, int64_t heads, int64_t dim, DType dtype = DType::f32)
      : out(dtype, {rows, heads, dim}), lse(DType::f32, {rows, heads}) {
    out.fill_poison();
    lse.fill_poison();
  }
  Result result() const { return {out.to_doubles(), lse.to_doubles()}; }
};

Result single_prefill(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                      KVLayout layout, AttentionOptions opts = {}, DType out_dtype = DType::f32) {
  Outputs o(q.shape()[0], q.shape()[1], q.shape()[2], out_dtype);
  reference::single_prefill(q.view(), k.view(), v.view(), o.out.view(), o.lse.view(), layout, opts);
  return o.result();
}

Result batch_prefill_paged(const HostTensor& q, const HostTensor& qo_indptr,
                           const test::PagedCacheHost& c, AttentionOptions opts = {}) {
  Outputs o(q.shape()[0], q.shape()[1], q.shape()[2]);
  reference::batch_prefill_paged(q.view(), qo_indptr.view(), c.cache, o.out.view(), o.lse.view(),
                                 opts);
  return o.result();
}

Result batch_prefill_ragged(const HostTensor& q, const HostTensor& qo_indptr,
                            const test::PagedCacheHost& c, AttentionOptions opts = {}) {
  Outputs o(q.shape()[0], q.shape()[1], q.shape()[2]);
  reference::batch_prefill_ragged(q.view(), qo_indptr.view(), c.k_ragged.view(), c.v_ragged.view(),
                                  c.kv_indptr.view(), o.out.view(), o.lse.view(), opts);
  return o.result();
}

Result batch_decode(const HostTensor& q, const test::PagedCacheHost& c,
                    AttentionOptions opts = {}) {
  Outputs o(q.shape()[0], q.shape()[1], q.shape()[2]);
  reference::batch_decode(q.view(), c.cache, o.out.view(), o.lse.view(), opts);
  return o.result();
}

HostTensor random(DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  HostTensor t(dtype, std::move(shape));
  t.fill_random(seed);
  return t;
}

// [kv_len, H, D] (NHD) -> [H, kv_len, D] (HND), same values.
HostTensor to_hnd(const HostTensor& nhd) {
  const int64_t n = nhd.shape()[0], h = nhd.shape()[1], d = nhd.shape()[2];
  HostTensor t(nhd.dtype(), {h, n, d});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h; ++j)
      for (int64_t x = 0; x < d; ++x) t.set((j * n + i) * d + x, nhd.get((i * h + j) * d + x));
  return t;
}

// Checks that `stmt` throws flashkv::Error whose message contains `needle`.
#define EXPECT_ERROR_MENTIONS(stmt, needle)                                         \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << #stmt " did not throw";                                      \
    } catch (const flashkv::Error& e) {                                             \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); \
    }                                                                               \
  } while (0)

// --- hand-computed cases -----------------------------------------------------------------------

TEST(ReferenceHand, OneKeyGivesItsValueAndScaledLogit) {
  const HostTensor q = make_tensor(DType::f32, {1, 1, 4}, {1, 2, -1, 0.5});
  const HostTensor k = make_tensor(DType::f32, {1, 1, 4}, {0.5, -1, 2, 4});
  const HostTensor v = make_tensor(DType::f32, {1, 1, 4}, {3, -2, 0.25, 7});
  const double dot = 0.5 - 2 - 2 + 2;
  for (float scale : {0.0f, 0.3f}) {
    const Result r = single_prefill(q, k, v, KVLayout::NHD, {.sm_scale = scale});
    EXPECT_EQ(r.o, v.to_doubles());
    const double s = scale == 0.0f ? 0.5 /* 1/sqrt(4) */ : static_cast<double>(scale);
    EXPECT_NEAR(r.lse[0], s * dot, 1e-6);
  }
}

TEST(ReferenceHand, TwoKeysKnownSoftmax) {
  // Logits 0 and ln 3 give weights 1/4 and 3/4; lse = ln(1 + 3).
  const HostTensor q = make_tensor(DType::f32, {1, 1, 1}, {1});
  const HostTensor k = make_tensor(DType::f32, {2, 1, 1}, {0, std::log(3.0)});
  const HostTensor v = make_tensor(DType::f32, {2, 1, 1}, {2, 6});
  const Result r = single_prefill(q, k, v, KVLayout::NHD, {.sm_scale = 1.0f});
  EXPECT_NEAR(r.o[0], 0.25 * 2 + 0.75 * 6, 1e-6);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-6);
}

TEST(ReferenceHand, HugeLogitsStayFinite) {
  // Logits 1000 and 999 overflow exp() without the max subtraction.
  const HostTensor q = make_tensor(DType::f32, {1, 1, 1}, {1});
  const HostTensor k = make_tensor(DType::f32, {2, 1, 1}, {1000, 999});
  const HostTensor v = make_tensor(DType::f32, {2, 1, 1}, {1, 0.5});
  const Result r = single_prefill(q, k, v, KVLayout::NHD, {.sm_scale = 1.0f});
  const double w0 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(r.o[0], w0 + (1 - w0) * 0.5, 1e-6);
  EXPECT_NEAR(r.lse[0], 1000 + std::log1p(std::exp(-1.0)), 1e-4);
}

// --- against the naive formula -------------------------------------------------------------------

TEST(ReferenceNaive, SinglePrefillDtypesHeadDimsAndMasks) {
  struct Case {
    DType dtype;
    int hq, hkv, d;
    int64_t qo_len, kv_len;
    bool causal;
  };
  const Case cases[] = {
      {DType::f32, 4, 4, 16, 7, 13, true}, {DType::f16, 8, 2, 40, 5, 17, false},
      {DType::bf16, 6, 1, 1, 9, 9, true},  {DType::f16, 4, 2, 64, 3, 29, true},
      {DType::e4m3, 2, 2, 8, 2, 5, false}, {DType::bf16, 3, 3, 113, 4, 6, true},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " d=" + std::to_string(c.d));
    const HostTensor q = random(c.dtype, {c.qo_len, c.hq, c.d}, seed++);
    const HostTensor k = random(c.dtype, {c.kv_len, c.hkv, c.d}, seed++);
    const HostTensor v = random(c.dtype, {c.kv_len, c.hkv, c.d}, seed++);
    const Result r = single_prefill(q, k, v, KVLayout::NHD, {.causal = c.causal});
    const double scale = resolve_sm_scale(0.0f, c.d);
    const Result want = naive_attention(q.to_doubles(), c.qo_len, c.hq, k.to_doubles(),
                                        v.to_doubles(), c.kv_len, c.hkv, c.d, scale, c.causal);
    EXPECT_LT(rel_err(r.o, want.o), kF32Tol);
    EXPECT_LT(rel_err(r.lse, want.lse), kF32Tol);
    // HND storage of the same KV gives bit-identical results.
    const Result hnd = single_prefill(q, to_hnd(k), to_hnd(v), KVLayout::HND, {.causal = c.causal});
    EXPECT_EQ(hnd.o, r.o);
    EXPECT_EQ(hnd.lse, r.lse);
  }
}

TEST(ReferenceNaive, OutputRoundedOnceToItsDtype) {
  const HostTensor q = random(DType::f16, {3, 2, 32}, 11);
  const HostTensor k = random(DType::f16, {10, 2, 32}, 12);
  const HostTensor v = random(DType::f16, {10, 2, 32}, 13);
  const Result f32 = single_prefill(q, k, v, KVLayout::NHD);
  for (DType dt : {DType::f16, DType::bf16}) {
    const Result low = single_prefill(q, k, v, KVLayout::NHD, {}, dt);
    for (size_t i = 0; i < low.o.size(); ++i) {
      HostTensor one(dt, {1});
      one.set(0, f32.o[i]);
      // Double rounding (double -> f32 -> dt) can differ from one rounding by one ulp at most.
      EXPECT_NEAR(low.o[i], one.get(0), std::abs(one.get(0)) * (dt == DType::f16 ? 1e-3 : 8e-3));
    }
    EXPECT_EQ(low.lse, f32.lse);  // lse is always f32
  }
}

// --- edge rows -----------------------------------------------------------------------------------

TEST(ReferenceEdge, EmptyRequestGivesZerosAndNegInf) {
  const test::PagedCacheHost c = make_paged_cache({5, 0, 3}, 2, 2, 8, KVLayout::NHD, DType::f16, 7);
  const HostTensor q = random(DType::f16, {3, 4, 8}, 8);
  const Result r = batch_decode(q, c);
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(r.lse[1 * 4 + h], kNegInf);
    for (int x = 0; x < 8; ++x) EXPECT_EQ(r.o[(1 * 4 + h) * 8 + x], 0.0);
    EXPECT_TRUE(std::isfinite(r.lse[0 * 4 + h]) && std::isfinite(r.lse[2 * 4 + h]));
  }
  EXPECT_FALSE(test::any_nan(r.o));
}

TEST(ReferenceEdge, FullyMaskedCausalRowsGiveZerosAndNegInf) {
  // qo_len 5 > kv_len 3: row i sees keys j <= 3 - 5 + i, so rows 0 and 1 see nothing and row 2
  // sees key 0 only (out == v[0]).
  const HostTensor q = random(DType::f32, {5, 1, 4}, 21);
  const HostTensor k = random(DType::f32, {3, 1, 4}, 22);
  const HostTensor v = random(DType::f32, {3, 1, 4}, 23);
  const Result r = single_prefill(q, k, v, KVLayout::NHD, {.causal = true});
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(r.lse[i], kNegInf);
    for (int x = 0; x < 4; ++x) EXPECT_EQ(r.o[i * 4 + x], 0.0);
  }
  for (int x = 0; x < 4; ++x) EXPECT_EQ(r.o[2 * 4 + x], v.get(x));
}

// Row i of a [rows, H, D] tensor as an [H, D] view (decode's query shape).
TensorView row_view(const HostTensor& t, int64_t i) {
  const int64_t h = t.shape()[1], d = t.shape()[2];
  auto* base = static_cast<std::byte*>(const_cast<void*>(t.data()));
  return TensorView(base + i * h * d * dtype_size(t.dtype()), t.dtype(), {h, d});
}

// A strided view into t's storage starting `offset` elements in.
TensorView strided(const HostTensor& t, int64_t offset, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> strides) {
  auto* base = static_cast<std::byte*>(const_cast<void*>(t.data()));
  return TensorView(base + offset * dtype_size(t.dtype()), t.dtype(), shape, strides);
}

TEST(ReferenceEdge, CausalAlignsToTheEndOfTheKV) {
  // qo_len 3 < kv_len 8: row i is decode over the first 8 - 3 + i + 1 keys.
  const HostTensor q = random(DType::bf16, {3, 2, 16}, 31);
  const HostTensor k = random(DType::bf16, {8, 2, 16}, 32);
  const HostTensor v = random(DType::bf16, {8, 2, 16}, 33);
  const Result r = single_prefill(q, k, v, KVLayout::NHD, {.causal = true});
  for (int64_t i = 0; i < 3; ++i) {
    HostTensor out(DType::f32, {2, 16}), lse(DType::f32, {2});
    const int64_t visible = 8 - 3 + i + 1;
    reference::single_decode(row_view(q, i), k.view().slice0(0, visible),
                             v.view().slice0(0, visible), out.view(), lse.view(), KVLayout::NHD);
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(r.lse[i * 2 + h], lse.get(h));
      for (int x = 0; x < 16; ++x) EXPECT_EQ(r.o[(i * 2 + h) * 16 + x], out.get(h * 16 + x));
    }
  }
  EXPECT_GT(rel_err(single_prefill(q, k, v, KVLayout::NHD).o, r.o), 1e-3);  // the mask mattered
}

// --- heads and storage ---------------------------------------------------------------------------

TEST(ReferenceLayout, QueryHeadUsesKvHeadHOverGroup) {
  const int hq = 8, d = 8;
  for (int hkv : {1, 2, 8}) {  // MQA, GQA, MHA
    const HostTensor q = random(DType::f16, {4, hq, d}, 41);
    const HostTensor k = random(DType::f16, {6, hkv, d}, 42);
    const HostTensor v = random(DType::f16, {6, hkv, d}, 43);
    const Result r = single_prefill(q, k, v, KVLayout::NHD);
    for (int h = 0; h < hq; ++h) {
      const int g = h / (hq / hkv);
      // Query head h alone over kv head g alone, through strided views of the same storage.
      HostTensor out(DType::f32, {4, 1, d}), lse(DType::f32, {4, 1});
      reference::single_prefill(strided(q, h * d, {4, 1, d}, {hq * d, d, 1}),
                                strided(k, g * d, {6, 1, d}, {hkv * d, d, 1}),
                                strided(v, g * d, {6, 1, d}, {hkv * d, d, 1}), out.view(),
                                lse.view(), KVLayout::NHD);
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(r.lse[i * hq + h], lse.get(i)) << "hkv " << hkv << " head " << h;
        for (int x = 0; x < d; ++x) EXPECT_EQ(r.o[(i * hq + h) * d + x], out.get(i * d + x));
      }
    }
  }
}

TEST(ReferencePaged, LayoutsInterleavingAndPageOrderHoldTheSameCache) {
  const std::vector<int64_t> lens = {9, 3, 16, 0};
  const HostTensor q = random(DType::bf16, {4, 4, 16}, 51);
  const test::PagedCacheHost base =
      make_paged_cache(lens, 4, 2, 16, KVLayout::NHD, DType::bf16, 5, /*shuffle_pages=*/false);
  const Result want = batch_decode(q, base);
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    for (bool interleaved : {false, true}) {
      SCOPED_TRACE(std::string(kv_layout_name(layout)) + (interleaved ? " interleaved" : ""));
      const test::PagedCacheHost c =
          make_paged_cache(lens, 4, 2, 16, layout, DType::bf16, 5, true, interleaved);
      const Result r = batch_decode(q, c);
      EXPECT_EQ(r.o, want.o);
      EXPECT_EQ(r.lse, want.lse);
    }
  }
}

TEST(ReferencePaged, PagedRaggedSingleDecodeAndNaiveAgree) {
  const std::vector<int64_t> kv_lens = {1, 17, 0, 32, 5};
  const std::vector<int64_t> qo_indptr = {0, 1, 5, 8, 15, 20};  // qo_len 3 over kv_len 0: empty
  const int hq = 4, hkv = 2, d = 24;
  for (int page_size : {1, 5, 16}) {
    const test::PagedCacheHost c =
        make_paged_cache(kv_lens, page_size, hkv, d, KVLayout::HND, DType::f16, 60 + page_size);
    const HostTensor q = random(DType::f16, {20, hq, d}, 61);
    const HostTensor qo_ptr = make_i32(qo_indptr);
    for (bool causal : {false, true}) {
      SCOPED_TRACE("page_size " + std::to_string(page_size) + (causal ? " causal" : ""));
      const Result paged = batch_prefill_paged(q, qo_ptr, c, {.causal = causal});
      const Result ragged = batch_prefill_ragged(q, qo_ptr, c, {.causal = causal});
      EXPECT_EQ(paged.o, ragged.o);
      EXPECT_EQ(paged.lse, ragged.lse);
      int64_t kv_begin = 0;
      for (size_t i = 0; i < kv_lens.size(); ++i) {
        const int64_t q0 = qo_indptr[i], qo_len = qo_indptr[i + 1] - q0, kv_len = kv_lens[i];
        Outputs one(qo_len, hq, d);
        reference::single_prefill(
            q.view().slice0(q0, q0 + qo_len), c.k_ragged.view().slice0(kv_begin, kv_begin + kv_len),
            c.v_ragged.view().slice0(kv_begin, kv_begin + kv_len), one.out.view(), one.lse.view(),
            KVLayout::NHD, {.causal = causal});
        const Result r = one.result();
        const std::vector<double> qd = q.to_doubles(), kd = c.k_ragged.to_doubles(),
                                  vd = c.v_ragged.to_doubles();
        const Result want = naive_attention(
            {qd.begin() + q0 * hq * d, qd.begin() + (q0 + qo_len) * hq * d}, qo_len, hq,
            {kd.begin() + kv_begin * hkv * d, kd.begin() + (kv_begin + kv_len) * hkv * d},
            {vd.begin() + kv_begin * hkv * d, vd.begin() + (kv_begin + kv_len) * hkv * d}, kv_len,
            hkv, d, resolve_sm_scale(0.0f, d), causal);
        EXPECT_LT(rel_err(r.o, want.o), kF32Tol);
        EXPECT_LT(rel_err(r.lse, want.lse), kF32Tol);
        for (int64_t j = 0; j < qo_len * hq * d; ++j) {
          ASSERT_EQ(r.o[j], paged.o[q0 * hq * d + j]) << "request " << i;
        }
        for (int64_t j = 0; j < qo_len * hq; ++j) ASSERT_EQ(r.lse[j], paged.lse[q0 * hq + j]);
        kv_begin += kv_len;
      }
    }
    // Decode is prefill with one query row per request.
    const HostTensor qd = random(DType::f16, {5, hq, d}, 62);
    const Result dec = batch_decode(qd, c);
    const Result pre = batch_prefill_paged(qd, make_i32({0, 1, 2, 3, 4, 5}), c, {.causal = true});
    EXPECT_EQ(dec.o, pre.o);
    EXPECT_EQ(dec.lse, pre.lse);
  }
}

// --- merge (⊕) -------------------------------------------------------------------------------

// The state of q over KV rows [begin, end) of k, v.
Outputs attend_part(const HostTensor& q, const HostTensor& k, const HostTensor& v, int64_t begin,
                    int64_t end) {
  Outputs o(q.shape()[0], q.shape()[1], q.shape()[2]);
  reference::single_prefill(q.view(), k.view().slice0(begin, end), v.view().slice0(begin, end),
                            o.out.view(), o.lse.view(), KVLayout::NHD);
  return o;
}

TEST(MergeState, HalvesMergeToTheWhole) {
  const HostTensor q = random(DType::f32, {5, 4, 32}, 71);
  const HostTensor k = random(DType::f16, {20, 2, 32}, 72);
  const HostTensor v = random(DType::f16, {20, 2, 32}, 73);
  const Result whole = attend_part(q, k, v, 0, 20).result();
  for (int64_t split : {0, 7, 20}) {  // 0 and 20 make one side empty: (0, -inf)
    const Outputs a = attend_part(q, k, v, 0, split), b = attend_part(q, k, v, split, 20);
    Outputs ab(5, 4, 32), ba(5, 4, 32);
    reference::merge_state(a.out.view(), a.lse.view(), b.out.view(), b.lse.view(), ab.out.view(),
                           ab.lse.view());
    reference::merge_state(b.out.view(), b.lse.view(), a.out.view(), a.lse.view(), ba.out.view(),
                           ba.lse.view());
    EXPECT_LT(rel_err(ab.out.to_doubles(), whole.o), kF32Tol) << "split " << split;
    EXPECT_LT(rel_err(ab.lse.to_doubles(), whole.lse), kF32Tol) << "split " << split;
    EXPECT_EQ(ab.out.to_doubles(), ba.out.to_doubles());  // ⊕ commutes
    EXPECT_EQ(ab.lse.to_doubles(), ba.lse.to_doubles());
  }
}

TEST(MergeStates, PartsMergeToTheWhole) {
  const int64_t n = 3, h = 2, d = 16;
  const HostTensor q = random(DType::bf16, {n, h, d}, 81);
  const HostTensor k = random(DType::bf16, {20, 1, d}, 82);
  const HostTensor v = random(DType::bf16, {20, 1, d}, 83);
  const Result whole = attend_part(q, k, v, 0, 20).result();
  const std::vector<int64_t> bounds = {0, 3, 3, 11, 20};  // the second part is empty
  const int64_t parts = static_cast<int64_t>(bounds.size()) - 1;
  HostTensor vs(DType::f32, {n, parts, h, d}), ss(DType::f32, {n, parts, h});
  for (int64_t p = 0; p < parts; ++p) {
    const Result r = attend_part(q, k, v, bounds[p], bounds[p + 1]).result();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) {
        ss.set((i * parts + p) * h + j, r.lse[i * h + j]);
        for (int64_t x = 0; x < d; ++x) {
          vs.set(((i * parts + p) * h + j) * d + x, r.o[(i * h + j) * d + x]);
        }
      }
    }
  }
  Outputs m(n, h, d);
  reference::merge_states(vs.view(), ss.view(), m.out.view(), m.lse.view());
  EXPECT_LT(rel_err(m.out.to_doubles(), whole.o), kF32Tol);
  EXPECT_LT(rel_err(m.lse.to_doubles(), whole.lse), kF32Tol);

  // S == 0: nothing to merge gives the identity (0, -inf).
  HostTensor v0(DType::f32, {n, 0, h, d}), s0(DType::f32, {n, 0, h});
  Outputs e(n, h, d);
  reference::merge_states(v0.view(), s0.view(), e.out.view(), e.lse.view());
  EXPECT_EQ(e.out.to_doubles(), std::vector<double>(n * h * d, 0.0));
  EXPECT_EQ(e.lse.to_doubles(), std::vector<double>(n * h, kNegInf));
}

TEST(MergeState, HandCasesAndTheNegInfIdentity) {
  const HostTensor va = make_tensor(DType::f32, {1, 1, 2}, {1, 2});
  const HostTensor vb = make_tensor(DType::f32, {1, 1, 2}, {3, -4});
  HostTensor nan_v(DType::f32, {1, 1, 2});
  nan_v.fill_poison();  // an empty state's o may be garbage: -inf must make it irrelevant
  auto merge = [](const HostTensor& a, double la, const HostTensor& b, double lb) {
    const HostTensor sa = make_tensor(DType::f32, {1, 1}, {la}),
                     sb = make_tensor(DType::f32, {1, 1}, {lb});
    Outputs o(1, 1, 2);
    reference::merge_state(a.view(), sa.view(), b.view(), sb.view(), o.out.view(), o.lse.view());
    return o.result();
  };
  Result r = merge(va, 0.0, vb, 0.0);  // equal weights
  EXPECT_EQ(r.o, (std::vector<double>{2, -1}));
  EXPECT_NEAR(r.lse[0], std::log(2.0), 1e-7);
  r = merge(va, 0.0, vb, std::log(3.0));  // weights 1/4, 3/4
  EXPECT_NEAR(r.o[0], 0.25 * 1 + 0.75 * 3, 1e-6);
  EXPECT_NEAR(r.o[1], 0.25 * 2 - 0.75 * 4, 1e-6);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-6);
  r = merge(va, 0.7, nan_v, kNegInf);
  EXPECT_EQ(r.o, va.to_doubles());
  EXPECT_EQ(r.lse[0], static_cast<double>(0.7f));
  r = merge(nan_v, kNegInf, nan_v, kNegInf);
  EXPECT_EQ(r.o, (std::vector<double>{0, 0}));
  EXPECT_EQ(r.lse[0], kNegInf);
  r = merge(va, 1e4, vb, -1e4);  // far apart: no overflow, b vanishes
  EXPECT_EQ(r.o, va.to_doubles());
  EXPECT_EQ(r.lse[0], 1e4);
}

// --- argument checks -----------------------------------------------------------------------------

TEST(ReferenceArgs, BadInputsNameTheArgument) {
  const HostTensor q = random(DType::f16, {2, 4, 8}, 91), k = random(DType::f16, {5, 2, 8}, 92),
                   v = random(DType::f16, {5, 2, 8}, 93);
  HostTensor out(DType::f32, {2, 4, 8}), lse(DType::f32, {2, 4});
  const TensorView qv = q.view(), kv = k.view(), vv = v.view(), ov = out.view(), lv = lse.view();
  auto prefill = [](TensorView q, TensorView k, TensorView v, TensorView o, TensorView l) {
    reference::single_prefill(q, k, v, o, l, KVLayout::NHD);
  };
  void* qd = q.view().data();
  EXPECT_ERROR_MENTIONS(prefill(TensorView(qd, DType::f16, {2, 32}), kv, vv, ov, lv), "q:");
  EXPECT_ERROR_MENTIONS(prefill(TensorView(qd, DType::i32, {2, 4, 8}), kv, vv, ov, lv), "q:");
  EXPECT_ERROR_MENTIONS(
      prefill(TensorView(qd, DType::f16, {2, 4, 8}, Device::cuda(0)), kv, vv, ov, lv),
      "q: expected device cpu");
  EXPECT_ERROR_MENTIONS(prefill(qv, kv, vv, TensorView(), lv), "out:");
  EXPECT_ERROR_MENTIONS(prefill(qv, kv, vv, TensorView(ov.data(), DType::f32, {2, 4, 4}), lv),
                        "out:");
  EXPECT_ERROR_MENTIONS(prefill(qv, kv, vv, ov, TensorView(lv.data(), DType::f16, {2, 4})), "lse:");
  EXPECT_ERROR_MENTIONS(prefill(qv, kv, vv, ov, TensorView(lv.data(), DType::f32, {2, 3})), "lse:");
  EXPECT_ERROR_MENTIONS(prefill(qv, TensorView(kv.data(), DType::f16, {5, 4, 4}), vv, ov, lv),
                        "k:");
  EXPECT_ERROR_MENTIONS(prefill(qv, kv, TensorView(vv.data(), DType::f16, {4, 2, 8}), ov, lv),
                        "v:");
  EXPECT_ERROR_MENTIONS(prefill(TensorView(qd, DType::f16, {2, 3, 8}), kv, vv,
                                TensorView(ov.data(), DType::f32, {2, 3, 8}),
                                TensorView(lv.data(), DType::f32, {2, 3})),
                        "num_qo_heads = 3");
  EXPECT_ERROR_MENTIONS(reference::single_decode(qv, kv, vv, ov, lv, KVLayout::NHD), "q:");

  test::PagedCacheHost c = make_paged_cache({4, 6}, 4, 2, 8, KVLayout::NHD, DType::f16, 94);
  const HostTensor q2 = random(DType::f16, {2, 4, 8}, 95);
  Outputs o2(2, 4, 8);
  auto decode = [&](const PagedKVCache& cache, const TensorView& q) {
    reference::batch_decode(q, cache, o2.out.view(), o2.lse.view());
  };
  PagedKVCache bad = c.cache;
  bad.k = TensorView(c.cache.k.data(), DType::f16, {2, 4, 2, 8}, Device::cuda(0));
  EXPECT_ERROR_MENTIONS(decode(bad, q2.view()), "paged_kv.k");
  bad = c.cache;
  bad.indices = TensorView(c.cache.indices.data(), DType::i32, {2}, Device::cuda(0));
  EXPECT_ERROR_MENTIONS(decode(bad, q2.view()), "paged_kv.indices");
  const HostTensor bad_indices = make_i32({0, 7, 1});
  bad = c.cache;
  bad.indices = bad_indices.view();
  EXPECT_ERROR_MENTIONS(decode(bad, q2.view()), "paged_kv.indices[1]");
  Outputs o1(1, 4, 8);
  EXPECT_ERROR_MENTIONS(
      reference::batch_decode(q2.view().slice0(0, 1), c.cache, o1.out.view(), o1.lse.view()),
      "q: batch size");
  const HostTensor qo_bad_end = make_i32({0, 1, 3}), qo_bad_size = make_i32({0, 2});
  EXPECT_ERROR_MENTIONS(reference::batch_prefill_paged(q2.view(), qo_bad_end.view(), c.cache,
                                                       o2.out.view(), o2.lse.view()),
                        "qo_indptr");
  EXPECT_ERROR_MENTIONS(reference::batch_prefill_paged(q2.view(), qo_bad_size.view(), c.cache,
                                                       o2.out.view(), o2.lse.view()),
                        "qo_indptr");
  const HostTensor qo_ok = make_i32({0, 1, 2}), kv_bad = make_i32({0, 4, 9});
  EXPECT_ERROR_MENTIONS(
      reference::batch_prefill_ragged(q2.view(), qo_ok.view(), c.k_ragged.view(), c.v_ragged.view(),
                                      kv_bad.view(), o2.out.view(), o2.lse.view()),
      "kv_indptr");

  const HostTensor s16(DType::f16, {2, 4});
  EXPECT_ERROR_MENTIONS(reference::merge_state(ov, s16.view(), ov, lv, ov, lv), "s_a:");
  EXPECT_ERROR_MENTIONS(
      reference::merge_state(ov, lv, TensorView(ov.data(), DType::f32, {2, 4, 4}), lv, ov, lv),
      "v_b:");
  EXPECT_ERROR_MENTIONS(
      reference::merge_state(ov, lv, ov, lv,
                             TensorView(ov.data(), DType::f32, {2, 4, 8}, Device::cuda(0)), lv),
      "v_out:");
  const HostTensor vs(DType::f32, {2, 3, 4, 8}), ss(DType::f32, {2, 2, 4});
  EXPECT_ERROR_MENTIONS(reference::merge_states(vs.view(), ss.view(), ov, lv), "s:");
}

// --- the test helpers themselves ---------------------------------------------------------------

TEST(ReferenceTestUtil, FillRandomIsRoundedNonZeroAndDeterministic) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2}) {
    HostTensor t(dt, {4096});
    t.fill_random(3, -1.0, 1.0);
    HostTensor u(dt, {4096});
    u.fill_random(3, -1.0, 1.0);
    EXPECT_EQ(t.to_doubles(), u.to_doubles());
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = t.get(i);
      ASSERT_NE(x, 0.0);
      ASSERT_LE(std::abs(x), 1.0);
      u.set(i, x);
      ASSERT_EQ(u.get(i), x) << "stored value is not exactly representable in " << dtype_name(dt);
    }
  }
  HostTensor p(DType::bf16, {3});
  EXPECT_TRUE(test::any_nan(p.fill_poison().to_doubles()));
}

TEST(ReferenceTestUtil, PagedCacheShufflesPagesAndMatchesRagged) {
  const test::PagedCacheHost c =
      make_paged_cache({30, 0, 13}, 3, 2, 4, KVLayout::HND, DType::f16, 9);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < c.indices.numel(); ++i) idx.push_back(c.indices.get(i));
  ASSERT_EQ(idx.size(), 15u);
  bool identity = true;
  for (size_t i = 0; i < idx.size(); ++i) identity = identity && idx[i] == static_cast<int64_t>(i);
  EXPECT_FALSE(identity);
  EXPECT_NO_THROW(c.cache.validate());
  EXPECT_EQ(c.cache.kv_len(0), 30);
  EXPECT_EQ(c.cache.kv_len(2), 13);
  // Token 14 of request 0, head 1, dim 2 lives on page indices[14 / 3], slot 2 (HND).
  const int64_t page = idx[4];
  EXPECT_EQ(c.k.get(((page * 2 + 1) * 3 + 2) * 4 + 2), c.k_ragged.get((14 * 2 + 1) * 4 + 2));
}

TEST(ReferenceTestUtil, RelErrAndToleranceRule) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(rel_err({1, kNegInf}, {1, kNegInf}), 0.0);
  EXPECT_EQ(rel_err({1, 0}, {1, kNegInf}), inf);
  EXPECT_EQ(rel_err({std::nan(""), 1}, {1, 1}), inf);
  EXPECT_NEAR(rel_err({3, 5}, {0, 5}), 3.0 / 5.0, 1e-15);

  // The reference written to f16 passes against the f32 reference; a kernel whose error is 3x
  // the f16 rounding error, or that drops one row, does not.
  const HostTensor q = random(DType::f16, {16, 4, 64}, 101);
  const HostTensor k = random(DType::f16, {50, 4, 64}, 102);
  const HostTensor v = random(DType::f16, {50, 4, 64}, 103);
  const Result ref = single_prefill(q, k, v, KVLayout::NHD);
  const Result lowp = single_prefill(q, k, v, KVLayout::NHD, {}, DType::f16);
  EXPECT_TRUE(test::matches_reference(lowp.o, ref.o, lowp.o, DType::f16));
  const test::ToleranceCheck t = test::check_tolerance(lowp.o, ref.o, lowp.o, 0.0);
  EXPECT_GT(t.err_lowp, 1e-4);  // f16 rounding is visible ...
  EXPECT_LT(t.err_lowp, 1e-3);  // ... and about 2^-11
  std::vector<double> off = ref.o;
  for (size_t i = 0; i < off.size(); ++i) off[i] += (i % 2 ? 1 : -1) * 6 * t.err_lowp * ref.o[i];
  EXPECT_FALSE(test::matches_reference(off, ref.o, lowp.o, DType::f16));
  std::vector<double> dropped = lowp.o;
  std::fill(dropped.begin(), dropped.begin() + 64, 0.0);
  EXPECT_FALSE(test::matches_reference(dropped, ref.o, lowp.o, DType::f16));
  // The cap: however large the low-precision error, the bound stays at 1e-2.
  std::vector<double> awful = ref.o;
  for (double& x : awful) x *= 1.5;
  EXPECT_EQ(test::check_tolerance(ref.o, ref.o, awful, 0.0).bound, test::kMaxRelTolerance);
}

// What a correct FA2-style kernel does in low precision: f32 logits and softmax, P rounded to
// the input dtype before the P·V product, f32 accumulation, output rounded once. The tolerance
// rule must admit it, and must reject the same kernel with an off-by-one causal mask.
std::vector<double> simulated_kernel(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                     bool causal, int shift) {
  const int64_t qo_len = q.shape()[0], kv_len = k.shape()[0];
  const int hq = static_cast<int>(q.shape()[1]), hkv = static_cast<int>(k.shape()[1]);
  const int d = static_cast<int>(q.shape()[2]);
  const float scale = resolve_sm_scale(0.0f, d);
  HostTensor p_round(q.dtype(), {1}), out(q.dtype(), {qo_len, hq, d});
  for (int64_t i = 0; i < qo_len; ++i) {
    const int64_t visible = causal ? kv_len - qo_len + i + 1 + shift : kv_len;
    for (int h = 0; h < hq; ++h) {
      const int g = h / (hq / hkv);
      std::vector<float> s(visible);
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      for (int64_t j = 0; j < visible; ++j) {
        float dot = 0.0f;
        for (int x = 0; x < d; ++x) {
          dot += static_cast<float>(q.get((i * hq + h) * d + x) * k.get((j * hkv + g) * d + x));
        }
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      std::vector<float> o(d, 0.0f);
      for (int64_t j = 0; j < visible; ++j) {
        const float p = std::exp(s[j] - m);
        l += p;
        p_round.set(0, p);
        for (int x = 0; x < d; ++x) {
          o[x] += static_cast<float>(p_round.get(0) * v.get((j * hkv + g) * d + x));
        }
      }
      for (int x = 0; x < d; ++x) out.set((i * hq + h) * d + x, o[x] / l);
    }
  }
  return out.to_doubles();
}

TEST(ReferenceTestUtil, ToleranceAdmitsALowPrecisionKernelAndRejectsAMaskBug) {
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int64_t kv_len : {40, 400}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " kv_len " + std::to_string(kv_len));
      const HostTensor q = random(dt, {8, 4, 64}, 111), k = random(dt, {kv_len, 2, 64}, 112),
                       v = random(dt, {kv_len, 2, 64}, 113);
      const AttentionOptions causal{.causal = true};
      const Result ref = single_prefill(q, k, v, KVLayout::NHD, causal);
      const Result lowp = single_prefill(q, k, v, KVLayout::NHD, causal, dt);
      EXPECT_TRUE(test::matches_reference(simulated_kernel(q, k, v, true, 0), ref.o, lowp.o, dt));
      EXPECT_FALSE(test::matches_reference(simulated_kernel(q, k, v, true, -1), ref.o, lowp.o, dt));
    }
  }
}

}  // namespace
}  // namespace flashkv
