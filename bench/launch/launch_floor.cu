// Launch latency vs kernel parameter size, timed as the benchmarks time run(): a 200 us GPU spin,
// the start event, an empty kernel, the end event (median of 50). Standalone:
//   nvcc -O2 -arch=sm_90 -o launch_floor bench/launch/launch_floor.cu && ./launch_floor
// Result on the H200: bench/results/launch-floor-2026-11-29.log.
#include <algorithm>
#include <cstdio>
#include <vector>
template <int N>
struct P {
  unsigned char b[N];
};
__global__ void spin(long long ns) {
  long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  long long t;
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
template <int N>
__global__ void k(const __grid_constant__ P<N> p, int* out) {
  if (threadIdx.x == 0 && p.b[0] == 123) out[blockIdx.x] = p.b[N - 1];
}
template <int N>
float bench(int grid, int* out) {
  P<N> p{};
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < 60; ++r) {
    spin<<<1, 1>>>(200000);
    cudaEventRecord(a);
    k<N><<<grid, 128>>>(p, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (r >= 10) ts.push_back(ms * 1000);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
int main() {
  int* out;
  cudaMalloc(&out, 4096 * 4);
  for (int grid : {132, 264, 528}) {
    printf("grid %d: 16 B %.2f us, 256 B %.2f us, 2304 B %.2f us, 4096 B %.2f us\n", grid,
           bench<16>(grid, out), bench<256>(grid, out), bench<2304>(grid, out),
           bench<4096>(grid, out));
  }
  return 0;
}
