// TensorView construction, geometry, and the argument checks' error messages.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/test_util.h"
#include "flashkv/error.h"
#include "flashkv/tensor.h"

namespace flashkv {
namespace {

using test::error_of;

TEST(TensorDevice, Str) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda().str(), "cuda:0");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_TRUE(Device::cpu().is_cpu());
  EXPECT_TRUE(Device::cuda(1).is_cuda());
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  EXPECT_EQ(Device::cuda(2), Device::cuda(2));
}

TEST(TensorView, DefaultIsUndefined) {
  TensorView t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.ndim(), 0);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
}

TEST(TensorView, ContiguousStridesAreRowMajor) {
  std::vector<uint16_t> buf(2 * 3 * 4);
  TensorView t(buf.data(), DType::f16, {2, 3, 4}, Device::cuda(0));
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(2), 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.shape_str(), "[2, 3, 4]");
  EXPECT_EQ(t.str(), "f16[2, 3, 4] on cuda:0");
  EXPECT_EQ(t.data_as<uint16_t>(), buf.data());
}

TEST(TensorView, NegativeDims) {
  TensorView t(nullptr, DType::f32, {5, 6, 7});
  EXPECT_EQ(t.size(-1), 7);
  EXPECT_EQ(t.size(-3), 5);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.stride(-2), 7);
  EXPECT_NE(error_of([&] { t.size(3); }).find("dim 3"), std::string::npos);
  EXPECT_NE(error_of([&] { t.size(-4); }).find("dim -4"), std::string::npos);
  EXPECT_THROW(t.stride(3), Error);
  EXPECT_THROW(t.stride(-4), Error);
}

TEST(TensorView, MaxDims) {
  TensorView six(nullptr, DType::f32, {1, 2, 1, 2, 1, 2});
  EXPECT_EQ(six.ndim(), 6);
  EXPECT_EQ(six.numel(), 8);
  EXPECT_THROW(TensorView(nullptr, DType::f32, {1, 1, 1, 1, 1, 1, 1}), Error);
  EXPECT_THROW(TensorView(nullptr, DType::f32, {1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1}),
               Error);
  const int64_t shape[7] = {1, 1, 1, 1, 1, 1, 1};
  EXPECT_THROW(TensorView(nullptr, DType::f32, 7, shape, shape, Device::cpu()), Error);
}

TEST(TensorView, RejectsBadShapes) {
  EXPECT_THROW(TensorView(nullptr, DType::f32, {2, -1}), Error);
  EXPECT_NE(error_of([] {
              TensorView(nullptr, DType::f32, {2, 3}, {3});
            }).find("strides"),
            std::string::npos);
}

TEST(TensorView, ScalarAndEmpty) {
  float x = 1.0f;
  TensorView scalar(&x, DType::f32, {});
  EXPECT_TRUE(scalar.defined());
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.shape_str(), "[]");
  TensorView empty(&x, DType::f32, {0, 4});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.is_contiguous());
}

TEST(TensorView, ExplicitStrides) {
  // A [4, 8] view of the first 8 columns of a [4, 16] buffer.
  TensorView t(nullptr, DType::bf16, {4, 8}, {16, 1});
  EXPECT_EQ(t.stride(0), 16);
  EXPECT_FALSE(t.is_contiguous());
  // Size-1 dims do not affect contiguity, whatever their stride.
  TensorView ones(nullptr, DType::f32, {1, 4, 1}, {99, 1, 7});
  EXPECT_TRUE(ones.is_contiguous());
  // Transposed.
  TensorView tr(nullptr, DType::f32, {3, 2}, {1, 3});
  EXPECT_FALSE(tr.is_contiguous());
}

TEST(TensorView, FromArrays) {
  const int64_t shape[3] = {2, 3, 4};
  const int64_t strides[3] = {24, 8, 1};
  TensorView t(nullptr, DType::e4m3, 3, shape, strides, Device::cuda(1));
  EXPECT_EQ(t.stride(0), 24);
  EXPECT_EQ(t.device(), Device::cuda(1));
  EXPECT_EQ(t.str(), "e4m3[2, 3, 4] on cuda:1");
  TensorView c(nullptr, DType::f32, 3, shape, nullptr, Device::cpu());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.stride(0), 12);
}

TEST(TensorView, Slice0) {
  std::vector<float> buf(5 * 4);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  TensorView t(buf.data(), DType::f32, {5, 4});
  TensorView s = t.slice0(2, 4);
  EXPECT_EQ(s.size(0), 2);
  EXPECT_EQ(s.size(1), 4);
  EXPECT_EQ(s.stride(0), 4);
  EXPECT_EQ(s.data_as<float>()[0], 8.0f);
  EXPECT_EQ(t.slice0(5, 5).numel(), 0);
  EXPECT_THROW(t.slice0(3, 2), Error);
  EXPECT_THROW(t.slice0(-1, 2), Error);
  EXPECT_THROW(t.slice0(0, 6), Error);
  // Strided views keep their strides; the offset is in elements of the dtype.
  std::vector<uint16_t> h(8 * 16);
  TensorView hs(h.data(), DType::f16, {8, 8}, {16, 1});
  EXPECT_EQ(hs.slice0(3, 8).data_as<uint16_t>(), h.data() + 48);
  EXPECT_EQ(hs.slice0(3, 8).stride(0), 16);
}

TEST(TensorChecks, DtypeMessages) {
  TensorView q(nullptr, DType::bf16, {2, 8, 128});
  EXPECT_NO_THROW(check_dtype(q, "q", DType::bf16));
  EXPECT_EQ(error_of([&] { check_dtype(q, "q", DType::f16); }), "q: expected dtype f16, got bf16");
  EXPECT_NO_THROW(check_dtype_in(q, "q", {DType::f16, DType::bf16}));
  EXPECT_EQ(error_of([&] {
              check_dtype_in(q, "q", {DType::f16, DType::f32});
            }),
            "q: expected dtype f16 or f32, got bf16");
}

TEST(TensorChecks, ShapeMessages) {
  TensorView k(nullptr, DType::f16, {4, 16, 8, 64});
  EXPECT_NO_THROW(check_shape(k, "paged_kv.k", {-1, 16, 8, 64}));
  EXPECT_EQ(error_of([&] {
              check_shape(k, "paged_kv.k", {-1, 16, 8, 128});
            }),
            "paged_kv.k: expected shape [*, 16, 8, 128], got [4, 16, 8, 64]");
  // A rank mismatch is a shape mismatch too.
  EXPECT_EQ(error_of([&] {
              check_shape(k, "paged_kv.k", {-1, 16, 8});
            }),
            "paged_kv.k: expected shape [*, 16, 8], got [4, 16, 8, 64]");
  EXPECT_NO_THROW(check_ndim(k, "paged_kv.k", 4));
  std::string msg = error_of([&] { check_ndim(k, "paged_kv.k", 3); });
  EXPECT_NE(msg.find("paged_kv.k: expected 3-d"), std::string::npos) << msg;
}

TEST(TensorChecks, DeviceMessages) {
  TensorView q(nullptr, DType::f16, {2});
  EXPECT_NO_THROW(check_device(q, "q", Device::cpu()));
  EXPECT_EQ(error_of([&] { check_device(q, "q", Device::cuda(0)); }),
            "q: expected device cuda:0, got cpu");
  TensorView g(nullptr, DType::f16, {2}, Device::cuda(1));
  EXPECT_EQ(error_of([&] { check_device(g, "out", Device::cuda(0)); }),
            "out: expected device cuda:0, got cuda:1");
}

TEST(TensorChecks, Defined) {
  float x = 0;
  EXPECT_NO_THROW(check_defined(TensorView(&x, DType::f32, {1}), "lse"));
  std::string msg = error_of([] { check_defined(TensorView(), "lse"); });
  EXPECT_EQ(msg.rfind("lse: ", 0), 0u) << msg;
}

TEST(TensorChecks, Contiguity) {
  TensorView strided(nullptr, DType::f16, {4, 8}, {16, 1});
  EXPECT_NO_THROW(check_last_dim_contiguous(strided, "q"));
  std::string msg = error_of([&] { check_contiguous(strided, "q"); });
  EXPECT_NE(msg.find("q: expected a contiguous tensor"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[16, 1]"), std::string::npos) << msg;
  TensorView tr(nullptr, DType::f16, {4, 8}, {1, 4});
  msg = error_of([&] { check_last_dim_contiguous(tr, "v"); });
  EXPECT_NE(msg.find("v: expected the last dimension to have stride 1, got stride 4"),
            std::string::npos)
      << msg;
  EXPECT_NO_THROW(check_contiguous(TensorView(nullptr, DType::f16, {4, 8}), "q"));
}

TEST(TensorChecks, Alignment) {
  alignas(16) uint8_t buf[64] = {};
  EXPECT_NO_THROW(check_aligned(TensorView(buf, DType::e4m3, {16}), "k", 16));
  EXPECT_NO_THROW(check_aligned(TensorView(buf + 4, DType::e4m3, {16}), "k", 4));
  std::string msg =
      error_of([&] { check_aligned(TensorView(buf + 4, DType::e4m3, {16}), "k", 16); });
  EXPECT_NE(msg.find("k: expected data pointer aligned to 16 bytes"), std::string::npos) << msg;
}

}  // namespace
}  // namespace flashkv
