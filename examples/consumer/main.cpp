// Uses the installed library: decode attention of one query over 3 keys with the CPU reference,
// and ⊕ of two states through the public merge op (host tensors route to the reference).
#include <flashkv/flashkv.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace flashkv;
  const int H = 2, D = 64, L = 3;
  std::vector<float> q(H * D, 0.1f), k(L * H * D, 0.2f), v(L * H * D, 0.5f), out(H * D), lse(H);
  reference::single_decode(
      TensorView(q.data(), DType::f32, {H, D}), TensorView(k.data(), DType::f32, {L, H, D}),
      TensorView(v.data(), DType::f32, {L, H, D}), TensorView(out.data(), DType::f32, {H, D}),
      TensorView(lse.data(), DType::f32, {H}), KVLayout::NHD);
  // All keys equal: the output is v and the LSE is log(L) + scale * q.k.
  const double want_lse = std::log(3.0) + (0.1 * 0.2 * D) / std::sqrt(double(D));
  const bool ok = std::fabs(out[0] - 0.5f) < 1e-6 && std::fabs(lse[0] - want_lse) < 1e-5;
  std::vector<float> va(H * D, 1.f), vb(H * D, 3.f), sa(H, 0.f), sb(H, 0.f), vo(H * D), so(H);
  merge_state(
      TensorView(va.data(), DType::f32, {1, H, D}), TensorView(sa.data(), DType::f32, {1, H}),
      TensorView(vb.data(), DType::f32, {1, H, D}), TensorView(sb.data(), DType::f32, {1, H}),
      TensorView(vo.data(), DType::f32, {1, H, D}), TensorView(so.data(), DType::f32, {1, H}));
  const bool ok2 = std::fabs(vo[0] - 2.f) < 1e-6 && std::fabs(so[0] - std::log(2.0)) < 1e-6;
  std::printf("flashkv consumer: decode %s, merge %s, GPU %s\n", ok ? "ok" : "WRONG",
              ok2 ? "ok" : "WRONG", cuda_available() ? "present" : "absent");
  return ok && ok2 ? 0 : 1;
}
