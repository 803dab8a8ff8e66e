// Tests of RoPE on the CPU reference: a hand-computed case per pairing, and properties that do
// not share code with the reference: each pair keeps its norm, position 0 is the identity, the
// interleaved and NeoX pairings are permutations of each other, rope_scale is a position scale,
// Llama 3.1 keeps high-frequency bands and scales low-frequency ones by 1/factor, and a vLLM-style
// cos/sin cache built from the same theta gives the same result. Plus the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "common/cuda_view.h"
#include "common/test_util.h"
#include "flashkv/error.h"
#include "flashkv/rope.h"
#include "flashkv/runtime.h"

namespace flashkv {
namespace {

using test::error_of;
using test::make_i32;
using test::make_tensor;
using test::rel_err;

constexpr double kF32Tol = 1e-6;

// q [nnz, hq, d] and k [nnz, hk, d] with random values and poisoned outputs of the same shapes.
struct QK {
  HostTensor q, k, q_rope, k_rope;
  QK(int64_t nnz, int64_t hq, int64_t hk, int64_t d, DType dtype = DType::f32, uint64_t seed = 1)
      : q(dtype, {nnz, hq, d}),
        k(dtype, {nnz, hk, d}),
        q_rope(dtype, {nnz, hq, d}),
        k_rope(dtype, {nnz, hk, d}) {
    q.fill_random(seed);
    k.fill_random(seed + 1);
    q_rope.fill_poison();
    k_rope.fill_poison();
  }
  void pos_ids(const std::vector<int64_t>& pos, const RopeOptions& opts = {}) {
    apply_rope_pos_ids(q.view(), k.view(), q_rope.view(), k_rope.view(), make_i32(pos).view(),
                       opts);
  }
};

TEST(Rope, HandComputedNeoxAndInterleaved) {
  // head_dim 6, rotary_dim 4, theta 100: freq = {1, 0.1}; position 2: angles {2, 0.2}.
  const std::vector<double> x = {1, 2, 3, 4, 5, 6};
  const HostTensor q = make_tensor(DType::f32, {1, 1, 6}, x);
  const HostTensor k = make_tensor(DType::f32, {1, 1, 6}, x);
  const double c0 = std::cos(2.0), s0 = std::sin(2.0), c1 = std::cos(0.2), s1 = std::sin(0.2);
  // NeoX pairs (x0, x2) at angle 2 and (x1, x3) at angle 0.2; x4, x5 unchanged.
  const std::vector<double> neox = {
      1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1, 5, 6};
  // Interleaved pairs (x0, x1) at angle 2 and (x2, x3) at angle 0.2.
  const std::vector<double> inter = {
      1 * c0 - 2 * s0, 2 * c0 + 1 * s0, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1, 5, 6};
  for (bool interleave : {false, true}) {
    HostTensor qr(DType::f32, {1, 1, 6}), kr(DType::f32, {1, 1, 6});
    apply_rope_pos_ids(q.view(), k.view(), qr.view(), kr.view(), make_i32({2}).view(),
                       {.rotary_dim = 4, .interleave = interleave, .rope_theta = 100});
    const std::vector<double>& want = interleave ? inter : neox;
    EXPECT_LT(rel_err(qr.to_doubles(), want), kF32Tol) << "interleave " << interleave;
    EXPECT_LT(rel_err(kr.to_doubles(), want), kF32Tol) << "interleave " << interleave;
  }
}

TEST(Rope, EachPairKeepsItsNormAndPositionZeroIsTheIdentity) {
  const int64_t nnz = 5, d = 64, rot = 48;
  for (bool interleave : {false, true}) {
    QK t(nnz, 4, 2, d);
    t.pos_ids({0, 1, 17, 1000, 0}, {.rotary_dim = rot, .interleave = interleave});
    const std::vector<double> in = t.q.to_doubles(), out = t.q_rope.to_doubles();
    for (int64_t row = 0; row < nnz * 4; ++row) {
      const double* x = &in[row * d];
      const double* y = &out[row * d];
      for (int i = 0; i < rot / 2; ++i) {
        const int a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + rot / 2;
        const double n_in = x[a] * x[a] + x[b] * x[b], n_out = y[a] * y[a] + y[b] * y[b];
        EXPECT_NEAR(n_out, n_in, 4 * kF32Tol * n_in) << "row " << row << " pair " << i;
      }
      for (int j = rot; j < d; ++j) EXPECT_EQ(y[j], x[j]) << "pass-through dim " << j;
    }
    // Tokens 0 and 4 are at position 0: unchanged, bit for bit.
    for (int64_t token : {0, 4}) {
      for (int64_t e = token * 4 * d; e < (token + 1) * 4 * d; ++e) ASSERT_EQ(out[e], in[e]);
    }
  }
}

TEST(Rope, InterleavedAndNeoxArePermutationsOfEachOther) {
  const int64_t nnz = 3, d = 16, rot = 12, half = rot / 2;
  QK neox(nnz, 2, 1, d);
  // x_inter[2i] = x_neox[i], x_inter[2i+1] = x_neox[i + half]; dims >= rot stay in place.
  auto perm = [&](int j) { return j >= rot ? j : (j % 2 == 0 ? j / 2 : j / 2 + half); };
  QK inter(nnz, 2, 1, d);
  for (HostTensor* pair : {&inter.q, &inter.k}) {
    const HostTensor& src = pair == &inter.q ? neox.q : neox.k;
    for (int64_t row = 0; row < src.numel() / d; ++row)
      for (int j = 0; j < d; ++j) pair->set(row * d + j, src.get(row * d + perm(j)));
  }
  neox.pos_ids({3, 50, 7}, {.rotary_dim = rot, .interleave = false});
  inter.pos_ids({3, 50, 7}, {.rotary_dim = rot, .interleave = true});
  for (auto [a, b] : {std::pair{&inter.q_rope, &neox.q_rope}, {&inter.k_rope, &neox.k_rope}}) {
    for (int64_t row = 0; row < a->numel() / d; ++row)
      for (int j = 0; j < d; ++j) ASSERT_EQ(a->get(row * d + j), b->get(row * d + perm(j)));
  }
}

TEST(Rope, RopeScaleDividesThePosition) {
  QK scaled(2, 2, 2, 32), plain(2, 2, 2, 32);
  scaled.pos_ids({8, 40}, {.rope_scale = 4});
  plain.pos_ids({2, 10});
  EXPECT_LT(rel_err(scaled.q_rope.to_doubles(), plain.q_rope.to_doubles()), kF32Tol);
  EXPECT_LT(rel_err(scaled.k_rope.to_doubles(), plain.k_rope.to_doubles()), kF32Tol);
}

TEST(Rope, IndptrOffsetsMatchPosIdsAndInPlaceMatchesOutOfPlace) {
  // Requests of 2, 0 and 3 tokens at offsets 5, 9, 0: positions 5 6 | - | 0 1 2.
  const HostTensor indptr = make_i32({0, 2, 2, 5}), offsets = make_i32({5, 9, 0});
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    QK by_offsets(5, 4, 2, 32, dtype), by_ids(5, 4, 2, 32, dtype), in_place(5, 4, 2, 32, dtype);
    const RopeOptions opts{.rotary_dim = 16, .interleave = true, .rope_theta = 5e5};
    apply_rope(by_offsets.q.view(), by_offsets.k.view(), by_offsets.q_rope.view(),
               by_offsets.k_rope.view(), indptr.view(), offsets.view(), opts);
    by_ids.pos_ids({5, 6, 0, 1, 2}, opts);
    apply_rope_inplace(in_place.q.view(), in_place.k.view(), indptr.view(), offsets.view(), opts);
    EXPECT_EQ(by_offsets.q_rope.to_doubles(), by_ids.q_rope.to_doubles());
    EXPECT_EQ(by_offsets.k_rope.to_doubles(), by_ids.k_rope.to_doubles());
    EXPECT_EQ(in_place.q.to_doubles(), by_ids.q_rope.to_doubles());
    EXPECT_EQ(in_place.k.to_doubles(), by_ids.k_rope.to_doubles());
  }
}

TEST(Rope, LowPrecisionOutputIsTheRoundedF32Result) {
  QK low(4, 2, 2, 64, DType::bf16), f32(4, 2, 2, 64, DType::f32);
  for (int64_t i = 0; i < low.q.numel(); ++i) f32.q.set(i, low.q.get(i));
  for (int64_t i = 0; i < low.k.numel(); ++i) f32.k.set(i, low.k.get(i));
  low.pos_ids({1, 100, 4000, 7});
  f32.pos_ids({1, 100, 4000, 7});
  EXPECT_LT(rel_err(low.q_rope.to_doubles(), f32.q_rope.to_doubles()), 0x1.0p-8);
  EXPECT_LT(rel_err(low.k_rope.to_doubles(), f32.k_rope.to_doubles()), 0x1.0p-8);
}

TEST(Llama31Rope, KeepsHighFrequencyBandsAndScalesLowOnesByTheFactor) {
  const Llama31RopeOptions opts;  // factor 8, theta 5e5, low 1, high 4, old context 8192
  const int rot = 128;
  const std::vector<double> f = rope_frequencies(rot, opts);
  int high = 0, low = 0, mid = 0;
  for (int i = 0; i < rot / 2; ++i) {
    const double base = std::pow(5e5, -2.0 * i / rot);
    const double wavelen = 2 * std::numbers::pi / base;
    if (wavelen < 8192.0 / 4) {
      EXPECT_DOUBLE_EQ(f[i], base) << "band " << i;
      ++high;
    } else if (wavelen > 8192.0 / 1) {
      EXPECT_DOUBLE_EQ(f[i], base / 8) << "band " << i;
      ++low;
    } else {
      EXPECT_GE(f[i], base / 8) << "band " << i;
      EXPECT_LE(f[i], base) << "band " << i;
      ++mid;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);

  // The op: at position 8m, a high-frequency pair turns as plain RoPE at 8m, a low-frequency
  // pair as plain RoPE at m. NeoX pair i is (i, i + 64).
  const std::vector<int64_t> pos = {8, 800, 8000};
  QK l31(3, 2, 1, rot), plain_same(3, 2, 1, rot), plain_div(3, 2, 1, rot);
  apply_llama31_rope_pos_ids(l31.q.view(), l31.k.view(), l31.q_rope.view(), l31.k_rope.view(),
                             make_i32(pos).view(), opts);
  plain_same.pos_ids(pos, {.rope_theta = 5e5});
  plain_div.pos_ids({1, 100, 1000}, {.rope_theta = 5e5});
  for (int64_t row = 0; row < 3 * 2; ++row) {
    for (int i : {0, 1, 2, 63}) {  // bands 0-2 are high frequency, 63 low
      const std::vector<double> base = {std::pow(5e5, -2.0 * i / rot)};
      const HostTensor& want =
          2 * std::numbers::pi / base[0] < 2048 ? plain_same.q_rope : plain_div.q_rope;
      for (int j : {i, i + rot / 2}) {
        const int64_t e = row * rot + j;
        EXPECT_NEAR(l31.q_rope.get(e), want.get(e), 1e-5) << "row " << row << " dim " << j;
      }
    }
  }
}

TEST(CosSinCache, MatchesPosIdsForACacheFromTheSameTheta) {
  const int64_t max_pos = 64, d = 32, rot = 24;
  const RopeOptions base{.rotary_dim = rot, .rope_theta = 1e4};
  const std::vector<double> f = rope_frequencies(rot, base);
  HostTensor cache(DType::f32, {max_pos, rot});
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int i = 0; i < rot / 2; ++i) {
      cache.set(p * rot + i, std::cos(p * f[i]));
      cache.set(p * rot + rot / 2 + i, std::sin(p * f[i]));
    }
  }
  const std::vector<int64_t> pos = {0, 63, 5, 17};
  for (bool is_neox : {true, false}) {
    QK with_cache(4, 4, 2, d), with_ids(4, 4, 2, d);
    apply_rope_with_cos_sin_cache(with_cache.q.view(), with_cache.k.view(),
                                  with_cache.q_rope.view(), with_cache.k_rope.view(),
                                  make_i32(pos).view(), cache.view(), is_neox);
    RopeOptions opts = base;
    opts.interleave = !is_neox;
    with_ids.pos_ids(pos, opts);
    EXPECT_LT(rel_err(with_cache.q_rope.to_doubles(), with_ids.q_rope.to_doubles()), kF32Tol);
    EXPECT_LT(rel_err(with_cache.k_rope.to_doubles(), with_ids.k_rope.to_doubles()), kF32Tol);
  }
  QK t(1, 1, 1, d);
  const std::string msg = error_of([&] {
    apply_rope_with_cos_sin_cache(t.q.view(), t.k.view(), t.q_rope.view(), t.k_rope.view(),
                                  make_i32({64}).view(), cache.view());
  });
  EXPECT_NE(msg.find("positions[0] = 64 is out of range"), std::string::npos) << msg;
  const HostTensor f16_cache(DType::f16, {max_pos, rot});
  EXPECT_NE(error_of([&] {
              apply_rope_with_cos_sin_cache(t.q.view(), t.k.view(), t.q_rope.view(),
                                            t.k_rope.view(), make_i32({0}).view(),
                                            f16_cache.view());
            }).find("cos_sin_cache: expected dtype f32"),
            std::string::npos);
}

// The message of the flashkv::Error that apply_rope_pos_ids throws on `t` with these options.
std::string pos_ids_error(QK& t, const std::vector<int64_t>& pos, const RopeOptions& opts = {}) {
  return error_of([&] { t.pos_ids(pos, opts); });
}

TEST(RopeErrors, NameTheBadArgument) {
  QK t(2, 2, 1, 16);
  EXPECT_NE(pos_ids_error(t, {0, 1}, {.rotary_dim = 7}).find("rotary_dim = 7 must be even"),
            std::string::npos);
  EXPECT_NE(pos_ids_error(t, {0, 1}, {.rotary_dim = 18}).find("rotary_dim = 18 is out of range"),
            std::string::npos);
  EXPECT_NE(pos_ids_error(t, {0, -3}).find("pos_ids[1] = -3"), std::string::npos);
  EXPECT_NE(pos_ids_error(t, {0}).find("pos_ids: expected shape [2]"), std::string::npos);
  EXPECT_NE(pos_ids_error(t, {0, 1}, {.rope_theta = 0}).find("rope_theta"), std::string::npos);
  QK wrong_dim(2, 2, 1, 16);
  wrong_dim.k = HostTensor(DType::f32, {2, 1, 8});
  EXPECT_NE(pos_ids_error(wrong_dim, {0, 1}).find("k: expected shape [2, *, 16]"),
            std::string::npos)
      << pos_ids_error(wrong_dim, {0, 1});
  QK wrong_dtype(2, 2, 1, 16);
  wrong_dtype.k_rope = HostTensor(DType::f16, {2, 1, 16});
  EXPECT_NE(pos_ids_error(wrong_dtype, {0, 1}).find("k_rope: expected dtype f32"),
            std::string::npos);
  const std::string bad_indptr = error_of([&] {
    apply_rope(t.q.view(), t.k.view(), t.q_rope.view(), t.k_rope.view(), make_i32({0, 1}).view(),
               make_i32({0}).view());
  });
  EXPECT_NE(bad_indptr.find("indptr[batch] = 1 must equal nnz"), std::string::npos) << bad_indptr;
  const std::string bad_factors = error_of([&] {
    apply_llama31_rope_pos_ids(t.q.view(), t.k.view(), t.q_rope.view(), t.k_rope.view(),
                               make_i32({0, 1}).view(),
                               {.low_freq_factor = 4, .high_freq_factor = 4});
  });
  EXPECT_NE(bad_factors.find("high_freq_factor = 4"), std::string::npos) << bad_factors;
}

// CUDA views of host memory: the device routing and its errors, without dereferencing anything
// (with a GPU only the mixed-device check runs; the GPU path is tested in tests/gpu/).
TEST(RopeErrors, CudaTensorsWithoutAGpuRaiseNamingTheOp) {
  QK t(2, 2, 1, 16);
  using test::as_cuda_view;
  const HostTensor pos = make_i32({0, 1});
  if (!cuda_available()) {
    const std::string msg = error_of([&] {
      apply_rope_pos_ids(as_cuda_view(t.q.view()), as_cuda_view(t.k.view()),
                         as_cuda_view(t.q_rope.view()), as_cuda_view(t.k_rope.view()),
                         as_cuda_view(pos.view()));
    });
    EXPECT_NE(msg.find("apply_rope_pos_ids: tensors on cuda:0 but no usable GPU"),
              std::string::npos)
        << msg;
  }
  const std::string mixed = error_of([&] {
    apply_rope_pos_ids(as_cuda_view(t.q.view()), t.k.view(), t.q_rope.view(), t.k_rope.view(),
                       pos.view());
  });
  EXPECT_NE(mixed.find("k: expected device cuda:0"), std::string::npos) << mixed;
}

}  // namespace
}  // namespace flashkv
