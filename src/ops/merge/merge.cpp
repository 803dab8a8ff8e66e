// Host side of the merge ops: validation, then the CPU reference or the JIT kernel.
#include "flashkv/merge.h"

#include "flashkv/error.h"
#include "flashkv/reference.h"
#include "ops/jit/jit_util.h"
#include "ops/jit/kernel_specs.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"

namespace flashkv {
namespace {

constexpr unsigned kThreads = 256;

void check_state(const TensorView& v, const char* vn, const TensorView& s, const char* sn) {
  check_defined(v, vn);
  check_defined(s, sn);
  check_ndim(v, vn, 3);
  check_dtype_in(v, vn, {DType::f16, DType::bf16, DType::f32});
  check_dtype(s, sn, DType::f32);
  check_shape(s, sn, {v.size(0), v.size(1)});
}

// The GPU kernels index LSEs flat: they must be contiguous.
void check_gpu_lse(const TensorView& s, const char* name) {
  check_contiguous(s, name);
  check_aligned(s, name, 4);
}

void check_gpu_layout(const TensorView& t, const char* name, int head_dim) {
  check_contiguous(t, name);
  check_aligned(t, name, 16);
  check(head_dim * dtype_size(t.dtype()) % 16 == 0, name, ": the GPU merge needs head_dim * ",
        dtype_size(t.dtype()), " bytes to be a multiple of 16, got head_dim ", head_dim);
}

const runtime::LoadedModule& merge_module(DType t, int device) {
  const ops::KernelSpec spec = ops::merge_kernel_spec(t);
  return runtime::KernelCache::instance().module(spec.id, device, spec.make);
}

unsigned blocks_for(int64_t threads) {
  return static_cast<unsigned>((threads + kThreads - 1) / kThreads);
}

void gpu_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                     const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                     bool in_place, Stream stream) {
  const int device = v_a.device().index;
  const int head_dim = static_cast<int>(v_a.size(2));
  for (auto [t, n] : {std::pair{&v_a, "v_a"}, {&v_b, "v_b"}, {&v_out, "v_out"}})
    check_gpu_layout(*t, n, head_dim);
  for (auto [t, n] : {std::pair{&s_a, "s_a"}, {&s_b, "s_b"}, {&s_out, "s_out"}})
    check_gpu_lse(*t, n);
  const int64_t rows = v_a.size(0) * v_a.size(1);
  if (rows == 0) return;
  const auto& mod = merge_module(v_a.dtype(), device);
  runtime::ensure_context(device);  // a cached module may have been loaded by another thread
  const std::string tn = ops::device_type_name(v_a.dtype(), "v_a");
  const void* pa = v_a.data();
  const void* psa = s_a.data();
  const void* pb = v_b.data();
  const void* psb = s_b.data();
  void* po = v_out.data();
  void* pso = in_place ? nullptr : s_out.data();
  int64_t r = rows;
  int d = head_dim;
  void* args[] = {&pa, &psa, &pb, &psb, &po, &pso, &r, &d};
  const int64_t vec_threads = rows * head_dim / (16 / static_cast<int>(dtype_size(v_a.dtype())));
  runtime::launch(mod.function("flashkv::merge_state_kernel<" + tn + ">"),
                  {blocks_for(vec_threads), 1, 1, kThreads, 1, 1, 0}, stream, args, "merge_state");
  if (in_place) {
    void* sa = s_out.data();
    void* lse_args[] = {&sa, &psb, &r};
    runtime::launch(mod.function("flashkv::merge_lse_kernel"),
                    {blocks_for(rows), 1, 1, kThreads, 1, 1, 0}, stream, lse_args,
                    "merge_state_in_place (lse)");
  }
}

}  // namespace

namespace ops {
KernelSpec merge_kernel_spec(DType t) {
  const std::string tn = device_type_name(t, "v");
  const std::string id = std::string("merge<") + dtype_name(t) + ">";
  return {id, [id, tn] {
            return make_request(
                id, "attention/merge/merge.cuh",
                {"flashkv::merge_state_kernel<" + tn + ">",
                 "flashkv::merge_states_kernel<" + tn + ">", "flashkv::merge_lse_kernel"});
          }};
}
}  // namespace ops

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 Stream stream) {
  check_state(v_a, "v_a", s_a, "s_a");
  check_state(v_b, "v_b", s_b, "s_b");
  check_state(v_out, "v_out", s_out, "s_out");
  check_shape(v_b, "v_b", {v_a.size(0), v_a.size(1), v_a.size(2)});
  check_shape(v_out, "v_out", {v_a.size(0), v_a.size(1), v_a.size(2)});
  check_dtype(v_b, "v_b", v_a.dtype());
  check_dtype(v_out, "v_out", v_a.dtype());
  const Device dev = ops::common_device({{"v_a", &v_a},
                                         {"s_a", &s_a},
                                         {"v_b", &v_b},
                                         {"s_b", &s_b},
                                         {"v_out", &v_out},
                                         {"s_out", &s_out}});
  if (dev.is_cpu()) return reference::merge_state(v_a, s_a, v_b, s_b, v_out, s_out);
  check(v_out.data() != v_a.data() && v_out.data() != v_b.data() && s_out.data() != s_a.data() &&
            s_out.data() != s_b.data(),
        "merge_state: outputs alias inputs; use merge_state_in_place");
  gpu_merge_state(v_a, s_a, v_b, s_b, v_out, s_out, false, stream);
}

void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, Stream stream) {
  check_state(v, "v", s, "s");
  check_state(v_other, "v_other", s_other, "s_other");
  check_shape(v_other, "v_other", {v.size(0), v.size(1), v.size(2)});
  check_dtype(v_other, "v_other", v.dtype());
  const Device dev =
      ops::common_device({{"v", &v}, {"s", &s}, {"v_other", &v_other}, {"s_other", &s_other}});
  if (dev.is_cpu()) return reference::merge_state(v, s, v_other, s_other, v, s);
  gpu_merge_state(v, s, v_other, s_other, v, s, true, stream);
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, Stream stream) {
  check_defined(v, "v");
  check_ndim(v, "v", 4);
  check_dtype_in(v, "v", {DType::f16, DType::bf16, DType::f32});
  check_dtype(s, "s", DType::f32);
  check_shape(s, "s", {v.size(0), v.size(1), v.size(2)});
  check_dtype(v_out, "v_out", v.dtype());
  check_shape(v_out, "v_out", {v.size(0), v.size(2), v.size(3)});
  check_dtype(s_out, "s_out", DType::f32);
  check_shape(s_out, "s_out", {v.size(0), v.size(2)});
  const Device dev =
      ops::common_device({{"v", &v}, {"s", &s}, {"v_out", &v_out}, {"s_out", &s_out}});
  if (dev.is_cpu()) return reference::merge_states(v, s, v_out, s_out);
  const int head_dim = static_cast<int>(v.size(3));
  check_gpu_layout(v, "v", head_dim);
  check_gpu_layout(v_out, "v_out", head_dim);
  check_contiguous(s, "s");
  check_contiguous(s_out, "s_out");
  const int64_t rows = v.size(0) * v.size(2);
  if (rows == 0) return;
  const auto& mod = merge_module(v.dtype(), v.device().index);
  runtime::ensure_context(v.device().index);
  const std::string tn = ops::device_type_name(v.dtype(), "v");
  const void* pv = v.data();
  const void* ps = s.data();
  void* po = v_out.data();
  void* pso = s_out.data();
  int64_t n = v.size(0);
  int S = static_cast<int>(v.size(1)), H = static_cast<int>(v.size(2)), D = head_dim;
  void* args[] = {&pv, &ps, &po, &pso, &n, &S, &H, &D};
  const int64_t vec_threads = rows * head_dim / (16 / static_cast<int>(dtype_size(v.dtype())));
  runtime::launch(mod.function("flashkv::merge_states_kernel<" + tn + ">"),
                  {blocks_for(vec_threads), 1, 1, kThreads, 1, 1, 0}, stream, args, "merge_states");
}

}  // namespace flashkv
