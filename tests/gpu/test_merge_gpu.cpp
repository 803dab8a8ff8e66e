// merge_state / merge_state_in_place / merge_states on the GPU vs the CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/gpu_util.h"
#include "flashkv/error.h"
#include "flashkv/merge.h"
#include "flashkv/reference.h"

namespace flashkv::test {
namespace {

class MergeGpu : public GpuTest {};

// Random LSEs in [-5, 5], with every 7th row -inf in a (empty part) and every 11th in b.
HostTensor random_lse(std::vector<int64_t> shape, uint64_t seed, int empty_every) {
  HostTensor s(DType::f32, shape);
  s.fill_random(seed, -5.0, 5.0);
  for (int64_t i = 0; i < s.numel(); i += empty_every)
    s.set(i, -std::numeric_limits<double>::infinity());
  return s;
}

void expect_close(const HostTensor& got, const HostTensor& want, DType dt, const char* what) {
  const auto g = got.to_doubles(), w = want.to_doubles();
  EXPECT_FALSE(any_nan(g)) << what;
  // One rounding of a convex combination of dtype values: within a couple of ulps of the dtype.
  const double tol = dt == DType::f32 ? 1e-6 : dt == DType::f16 ? 2e-3 : 1e-2;
  EXPECT_LE(rel_err(g, w), tol) << what << " dtype " << dtype_name(dt);
}

TEST_F(MergeGpu, MergeStateMatchesReference) {
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    for (auto [n, h, d] :
         {std::tuple{1, 1, 64}, {7, 3, 128}, {129, 32, 128}, {33, 8, 256}, {1000, 4, 64}}) {
      HostTensor va(dt, {n, h, d}), vb(dt, {n, h, d});
      va.fill_random(1 + n);
      vb.fill_random(2 + n);
      HostTensor sa = random_lse({n, h}, 3 + n, 7), sb = random_lse({n, h}, 4 + n, 11);
      HostTensor ref_v(dt, {n, h, d}), ref_s(DType::f32, {n, h});
      reference::merge_state(va.view(), sa.view(), vb.view(), sb.view(), ref_v.view(),
                             ref_s.view());
      auto dva = to_device(va), dvb = to_device(vb), dsa = to_device(sa), dsb = to_device(sb);
      auto dvo = poisoned_like(ref_v), dso = poisoned_like(ref_s);
      merge_state(dva.view, dsa.view, dvb.view, dsb.view, dvo.view, dso.view);
      synchronize();
      HostTensor got_v(dt, {n, h, d}), got_s(DType::f32, {n, h});
      to_host(dvo, got_v);
      to_host(dso, got_s);
      expect_close(got_v, ref_v, dt, "merge_state v");
      expect_close(got_s, ref_s, DType::f32, "merge_state s");
      // In place: (va, sa) ⊕= (vb, sb).
      merge_state_in_place(dva.view, dsa.view, dvb.view, dsb.view);
      synchronize();
      to_host(dva, got_v);
      to_host(dsa, got_s);
      expect_close(got_v, ref_v, dt, "merge_state_in_place v");
      expect_close(got_s, ref_s, DType::f32, "merge_state_in_place s");
    }
  }
}

TEST_F(MergeGpu, MergeStatesMatchesReference) {
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    for (auto [n, S, h, d] : {std::tuple{1, 1, 1, 64},
                              {5, 2, 4, 128},
                              {64, 7, 8, 128},
                              {3, 33, 2, 256},
                              {17, 0, 4, 64}}) {
      HostTensor v(dt, {n, S, h, d});
      if (v.numel() > 0) v.fill_random(10 + S);
      HostTensor s = random_lse({n, S, h}, 20 + S, 5);
      HostTensor ref_v(dt, {n, h, d}), ref_s(DType::f32, {n, h});
      reference::merge_states(v.view(), s.view(), ref_v.view(), ref_s.view());
      auto dv = to_device(v), ds = to_device(s);
      auto dvo = poisoned_like(ref_v), dso = poisoned_like(ref_s);
      merge_states(dv.view, ds.view, dvo.view, dso.view);
      synchronize();
      HostTensor got_v(dt, {n, h, d}), got_s(DType::f32, {n, h});
      to_host(dvo, got_v);
      to_host(dso, got_s);
      expect_close(got_v, ref_v, dt, "merge_states v");
      expect_close(got_s, ref_s, DType::f32, "merge_states s");
    }
  }
}

TEST_F(MergeGpu, BadInputsRaise) {
  HostTensor va(DType::f16, {4, 2, 128}), sa(DType::f32, {4, 2}), vb(DType::bf16, {4, 2, 128});
  auto dva = to_device(va), dsa = to_device(sa), dvb = to_device(vb);
  auto out = poisoned_like(va), sout = poisoned_like(sa);
  // v_b's dtype differs from v_a's: the message names v_b and both dtypes.
  const std::string dtype_err =
      error_of([&] { merge_state(dva.view, dsa.view, dvb.view, dsa.view, out.view, sout.view); });
  EXPECT_NE(dtype_err.find("v_b: expected dtype f16, got bf16"), std::string::npos) << dtype_err;
  // Mixed devices: s_a on the host, the rest on the GPU; the message names s_a and v_a's device.
  const std::string device_err =
      error_of([&] { merge_state(dva.view, sa.view(), dva.view, dsa.view, out.view, sout.view); });
  EXPECT_NE(device_err.find("s_a: expected device cuda:0 (the device of v_a), got cpu"),
            std::string::npos)
      << device_err;
}

}  // namespace
}  // namespace flashkv::test
