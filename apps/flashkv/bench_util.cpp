#include "bench_util.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>

#include "flashkv/error.h"
#include "ops/jit_util.h"
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

Timing time_on_stream(Stream s, const std::function<void(int)>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn(i);
  synchronize(s);
  std::vector<double> us;
  EventTimer t;
  for (int i = 0; i < reps; ++i) {
    t.start(s);
    fn(warmup + i);
    t.stop(s);
    us.push_back(t.elapsed_ms() * 1000.0);
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), reps};
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

}  // namespace flashkv::cli
