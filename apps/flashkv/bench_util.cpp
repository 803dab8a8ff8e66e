#include "bench_util.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/reference.h"
#include "ops/jit/jit_util.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"

namespace flashkv::cli {
using runtime::check_cu;
using runtime::driver;

void device_fill_uniform(void* ptr, DType dtype, size_t n, uint64_t seed, float lo, float hi,
                         Stream stream) {
  if (n == 0) return;
  const std::string tn = ops::device_type_name(dtype, "fill");
  const std::string id = std::string("fill<") + dtype_name(dtype) + ">";
  const std::string expr = "flashkv::fill_uniform_kernel<" + tn + ">";
  const auto& mod = runtime::KernelCache::instance().module(
      id, 0, [&] { return ops::make_request(id, "bench/fill.cuh", {expr}); });
  unsigned long long nn = n, sd = seed;
  void* args[] = {&ptr, &nn, &sd, &lo, &hi};
  runtime::launch(mod.function(expr), {132 * 16, 1, 1, 256, 1, 1, 0}, stream, args, id);
}

namespace {
// Keeps the GPU busy for `us` microseconds (kernels/bench/spin.cuh).
void gpu_spin(Stream s, double us) {
  const auto& mod = runtime::KernelCache::instance().module("spin", 0, [] {
    return ops::make_request("spin", "bench/spin.cuh", {"flashkv::spin_kernel"});
  });
  unsigned long long ns = static_cast<unsigned long long>(us * 1000.0);
  void* args[] = {&ns};
  runtime::launch(mod.function("flashkv::spin_kernel"), {1, 1, 1, 32, 1, 1, 0}, s, args, "spin");
}
}  // namespace

Timing time_on_stream(Stream s, const std::function<void(int)>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn(i);
  synchronize(s);
  std::vector<double> us, host_us;
  EventTimer t;
  for (int i = 0; i < reps; ++i) {
    // The spin outlasts the host's part of fn (a few to tens of microseconds), so the GPU
    // reaches the start event only once fn's work is queued behind it: the events time the GPU.
    gpu_spin(s, 200.0);
    const auto h0 = std::chrono::steady_clock::now();
    t.start(s);
    fn(warmup + i);
    t.stop(s);
    host_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
    us.push_back(t.elapsed_ms() * 1000.0);
  }
  std::sort(us.begin(), us.end());
  std::sort(host_us.begin(), host_us.end());
  return {us[us.size() / 2], us.front(), reps, host_us[host_us.size() / 2]};
}

nlohmann::json Ceilings::to_json() const {
  return {{"read_tbps", read_tbps},
          {"copy_tbps", copy_tbps},
          {"gemm_f16_tflops", gemm_f16_tflops},
          {"gemm_bf16_tflops", gemm_bf16_tflops}};
}

namespace {

// cuBLAS through dlopen: only the GEMM ceiling needs it, and the CLI must start without it.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // Spelled out: cublasGemmEx is overloaded in C++, so decltype cannot name it.
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm = nullptr;
  bool load() {
    void* lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    create = reinterpret_cast<decltype(create)>(dlsym(lib, "cublasCreate_v2"));
    destroy = reinterpret_cast<decltype(destroy)>(dlsym(lib, "cublasDestroy_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    gemm = reinterpret_cast<decltype(gemm)>(dlsym(lib, "cublasGemmEx"));
    return create && destroy && set_stream && gemm;
  }
};

double gemm_tflops(Stream s, DType dt) {
  static Cublas cb;
  static const bool ok = cb.load();
  if (!ok) {
    std::fprintf(stderr, "flashkv bench: libcublas not found; GEMM ceiling skipped\n");
    return 0;
  }
  constexpr int n = 8192;
  const size_t bytes = size_t(n) * n * 2;
  DeviceBuffer a(bytes), b(bytes), c(bytes);
  device_fill_uniform(a.data(), dt, size_t(n) * n, 1, -1, 1, s);
  device_fill_uniform(b.data(), dt, size_t(n) * n, 2, -1, 1, s);
  cublasHandle_t h;
  check(cb.create(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
  cb.set_stream(h, reinterpret_cast<cudaStream_t>(s));
  const float alpha = 1, beta = 0;
  const cudaDataType t = dt == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  auto run = [&](int) {
    cb.gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.data(), t, n, b.data(), t, n, &beta,
            c.data(), t, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  const Timing tm = time_on_stream(s, run, 3, 20);
  cb.destroy(h);
  return 2.0 * n * n * double(n) / (tm.median_us * 1e-6) / 1e12;
}

}  // namespace

Ceilings measure_ceilings(Stream s) {
  Ceilings c;
  const size_t bytes = size_t(4) << 30;  // 4 GiB: far beyond L2
  DeviceBuffer buf(bytes), dst(bytes / 2);
  device_fill_uniform(buf.data(), DType::f32, bytes / 4, 7, -1, 1, s);
  DeviceBuffer sink(132 * 8 * 4);
  const auto& mod = runtime::KernelCache::instance().module("read_sum", 0, [] {
    return ops::make_request("read_sum", "bench/read_sum.cuh", {"flashkv::read_sum_kernel"});
  });
  const DeviceInfo info = device_info(0);
  void* p = buf.data();
  unsigned long long nv = bytes / 16;
  void* out = sink.data();
  void* args[] = {&p, &nv, &out};
  const unsigned grid = static_cast<unsigned>(info.sm_count * 8);
  const Timing rt = time_on_stream(
      s,
      [&](int) {
        runtime::launch(mod.function("flashkv::read_sum_kernel"), {grid, 1, 1, 256, 1, 1, 0}, s,
                        args, "read_sum");
      },
      3, 20);
  c.read_tbps = bytes / (rt.median_us * 1e-6) / 1e12;
  const size_t copy_bytes = bytes / 2;
  const Timing ct = time_on_stream(
      s,
      [&](int) {
        check_cu(
            driver().cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst.data()),
                                       reinterpret_cast<CUdeviceptr>(buf.data()), copy_bytes, s),
            "copy");
      },
      3, 20);
  c.copy_tbps = 2.0 * copy_bytes / (ct.median_us * 1e-6) / 1e12;
  c.gemm_f16_tflops = gemm_tflops(s, DType::f16);
  c.gemm_bf16_tflops = gemm_tflops(s, DType::bf16);
  return c;
}

int rotation_copies(size_t bytes_per_copy) {
  constexpr size_t kL2RotateBytes = size_t(200) << 20;  // 4x the 50 MB L2
  const size_t b = std::max<size_t>(bytes_per_copy, 1);
  return static_cast<int>(std::clamp<size_t>((kL2RotateBytes + b - 1) / b, 1, 8));
}

size_t BenchPagedKV::kv_bytes() const {
  const int64_t tokens = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  return size_t(tokens) * num_kv_heads * head_dim * 2 * dtype_size(dtype);
}

void BenchPagedKV::build(int num_copies, uint64_t seed, Stream s) {
  indptr = {0};
  last.clear();
  indices.clear();
  for (int64_t l : lens) {
    const int64_t p = (l + page_size - 1) / page_size;
    indptr.push_back(static_cast<int32_t>(indptr.back() + p));
    last.push_back(static_cast<int32_t>(p ? l - (p - 1) * page_size : 0));
  }
  pages_per_copy = indptr.back();
  copies = num_copies;
  const size_t page_elems = size_t(page_size) * num_kv_heads * head_dim;
  const size_t total_pages = size_t(pages_per_copy) * copies;
  k = DeviceBuffer(std::max<size_t>(total_pages * page_elems * dtype_size(dtype), 16));
  v = DeviceBuffer(std::max<size_t>(total_pages * page_elems * dtype_size(dtype), 16));
  device_fill_uniform(k.data(), dtype, total_pages * page_elems, seed, -1, 1, s);
  device_fill_uniform(v.data(), dtype, total_pages * page_elems, seed + 1, -1, 1, s);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  idx = DeviceBuffer(std::max<size_t>(total_pages * 4, 16));
  for (int c = 0; c < copies; ++c) {
    std::vector<int32_t> perm(pages_per_copy);
    std::iota(perm.begin(), perm.end(), static_cast<int32_t>(c * pages_per_copy));
    std::shuffle(perm.begin(), perm.end(), rng);
    idx.copy_from_host(perm.data(), perm.size() * 4, size_t(c) * pages_per_copy * 4);
    indices.push_back(std::move(perm));
  }
}

PagedKVCache BenchPagedKV::device_view(int c) const {
  const int64_t total_pages = std::max<int64_t>(pages_per_copy * copies, 1);
  const int64_t B = static_cast<int64_t>(lens.size());
  const Device g = Device::cuda(0);
  PagedKVCache kv;
  kv.layout = layout;
  const int64_t d1 = layout == KVLayout::NHD ? page_size : num_kv_heads;
  const int64_t d2 = layout == KVLayout::NHD ? num_kv_heads : page_size;
  kv.k = TensorView(k.data(), dtype, {total_pages, d1, d2, head_dim}, g);
  kv.v = TensorView(v.data(), dtype, {total_pages, d1, d2, head_dim}, g);
  kv.indices = TensorView(static_cast<int32_t*>(idx.data()) + c * pages_per_copy, DType::i32,
                          {std::max<int64_t>(pages_per_copy, 1)}, g);
  kv.indptr = TensorView(idx.data(), DType::i32, {B + 1}, g);
  kv.last_page_len = TensorView(idx.data(), DType::i32, {B}, g);
  return kv;
}

void BenchPagedKV::pages_to_host(int r, void* k_dst, void* v_dst) const {
  const size_t page_bytes = size_t(page_size) * num_kv_heads * head_dim * dtype_size(dtype);
  for (int p = 0; p < indptr[r + 1] - indptr[r]; ++p) {
    const size_t src = size_t(indices[0][indptr[r] + p]) * page_bytes;
    k.copy_to_host(static_cast<char*>(k_dst) + p * page_bytes, page_bytes, src);
    v.copy_to_host(static_cast<char*>(v_dst) + p * page_bytes, page_bytes, src);
  }
}

HostTensor reference_decode_request(const HostTensor& k, const HostTensor& v, int last_page_len,
                                    const HostTensor& q, float sm_scale, KVLayout layout) {
  const int32_t np = static_cast<int32_t>(k.shape()[0]);
  // last_page_len 0: an empty request (k then holds one unused page).
  std::vector<int32_t> ind(np), iptr = {0, last_page_len > 0 ? np : 0}, last = {last_page_len};
  std::iota(ind.begin(), ind.end(), 0);
  PagedKVCache c;
  c.layout = layout;
  c.k = k.view();
  c.v = v.view();
  c.indptr = TensorView(iptr.data(), DType::i32, {2});
  c.indices = TensorView(ind.data(), DType::i32, {np});
  c.last_page_len = TensorView(last.data(), DType::i32, {1});
  HostTensor ref(DType::f32, q.shape());
  AttentionOptions ao;
  ao.sm_scale = sm_scale;
  reference::batch_decode(q.view(), c, ref.view(), TensorView(), ao);
  return ref;
}

RefCheck check_reference(const std::vector<double>& out, const std::vector<double>& ref, DType dt) {
  HostTensor lowp(dt, {static_cast<int64_t>(ref.size())});
  for (size_t i = 0; i < ref.size(); ++i) lowp.set(static_cast<int64_t>(i), ref[i]);
  const double u = dt == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  RefCheck c;
  c.err = relative_error(out, ref);
  c.err_lowp = relative_error(lowp.to_doubles(), ref);
  c.bound = std::min(2 * c.err_lowp + u, 1e-2);
  c.pass = c.err <= c.bound;  // false for NaN
  return c;
}

}  // namespace flashkv::cli
