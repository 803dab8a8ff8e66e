// What a pure read of a decode workload's KV bytes costs by the benchmarks' method (a 200 us GPU
// spin, the start event, one kernel, the end event; median of 50, rotating over 3 copies so L2
// does not flatter it). No attention: every thread XORs what it loads. It answers two questions
// the decode kernel cannot answer by itself:
//  - the floor: how close to the read ceiling can a 67 MB (D1) or 134 MB (D4) read get at all,
//    once the launch and the first DRAM bytes are paid;
//  - the access pattern: one CTA per (request, KV head) reading its head's 256-byte slices of
//    16-token NHD pages (2 KB apart, as flashkv's decode kernel does), the same from HND pages
//    (4 KB contiguous per head and page), or whole contiguous per-head spans (as a dense
//    [B, H, S, D] layout, which cuDNN reads); and NHD with the pages in order, which tells the
//    cost of scattered pages (DRAM rows, address translation) from the cost of the slices.
// Standalone:
//   nvcc -O3 -arch=sm_90 -o read_floor bench/launch/read_floor.cu && ./read_floor
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#define CK(x)                                                                \
  do {                                                                       \
    cudaError_t e_ = (x);                                                    \
    if (e_ != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

__global__ void spin(long long ns) {
  long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  while (t - t0 < ns);
}

enum Pattern { kNHD = 0, kHND = 1, kDense = 2, kNHDInOrder = 3 };  // in order: page ids ascending

struct Job {
  const uint4* k;
  const uint4* v;
  const int* pages;  // page ids of all requests, request-major
  int pages_per_req;
  int heads;   // KV heads
  int chunks;  // CTAs per (request, head): the request's tokens split evenly
  int tokens;  // tokens per request
  Pattern pattern;
  unsigned* sink;
};

// One CTA of 256 threads per (request, head, chunk). 16 threads cover one token's 256-byte head
// row (16 x 16 B); a step covers 16 tokens; kUnroll steps of K and V are in flight per thread
// (kUnroll * 8 KB per CTA).
template <int kUnroll>
__global__ void __launch_bounds__(256) paged_read(Job j) {
  const int chunk = blockIdx.x % j.chunks;
  const int head = (blockIdx.x / j.chunks) % j.heads;
  const int req = blockIdx.x / (j.chunks * j.heads);
  const int per_chunk = j.tokens / j.chunks;
  const int t_begin = chunk * per_chunk, t_end = t_begin + per_chunk;
  const int lane16 = threadIdx.x & 15, row = threadIdx.x >> 4;
  const long long page_vecs = 16LL * j.heads * 16;  // 16 tokens x heads x 16 vecs
  unsigned acc = 0;
  for (int t0 = t_begin; t0 < t_end; t0 += 16 * kUnroll) {
    uint4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = min(t0 + u * 16 + row, t_end - 1);  // the tail re-reads one row (an L1/L2 hit)
      long long off;
      if (j.pattern == kDense) {
        off = ((long long)(req * j.heads + head) * j.tokens + t) * 16 + lane16;
      } else {
        const long long page = j.pages[req * j.pages_per_req + t / 16];
        const int slot = t % 16;
        off = page * page_vecs +
              (j.pattern != kHND ? (slot * j.heads + head) * 16 : (head * 16 + slot) * 16) + lane16;
      }
      a[u] = __ldcs(j.k + off);
      b[u] = __ldcs(j.v + off);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w ^ b[u].x ^ b[u].y ^ b[u].z ^ b[u].w;
  }
  if (acc == 0x9e3779b9u) j.sink[blockIdx.x] = acc;
}

// The decode kernel's load path without its math: a CTA of 256 threads streams its (request,
// head, chunk) through a shared-memory pipeline of kStages stages of kTile tokens (K and V, NHD
// pages), the page ids of the next tile read a tile ahead; each thread reads one 16-byte word of
// the landed stage (the "compute"), and the stage is refilled after a barrier.
//  - kBulk false: cp.async 16 B per thread (as flashkv's decode kernel loads);
//  - kBulk true: one cp.async.bulk per 256-byte row (the TMA engine), issued by warp 0 and
//    counted on an mbarrier per stage.
// kComputeCycles: a stand-in for the attention math, spun after each tile lands (0: none).
template <int kTile, int kStages, bool kBulk, int kComputeCycles = 0>
__global__ void __launch_bounds__(256) pipe_read(Job j) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kStageBytes = kTile * 256;  // of K (and again of V)
  __shared__ __align__(8) unsigned long long bars[kStages];
  const int chunk = blockIdx.x % j.chunks;
  const int head = (blockIdx.x / j.chunks) % j.heads;
  const int req = blockIdx.x / (j.chunks * j.heads);
  const int per_chunk = j.tokens / j.chunks;
  const int t_begin = chunk * per_chunk;
  const int tiles = per_chunk / kTile;
  const long long page_vecs = 16LL * j.heads * 16;
  const int* pages = j.pages + req * j.pages_per_req;
  // Rows this thread copies: cp.async, 16 rows x 16 chunks per 256 threads per step; bulk, warp 0's
  // lanes take rows lane, lane + 32, ...
  constexpr int kRows = kBulk ? kTile / 32 : kTile * 16 / 256;
  auto row_of = [&](int i) {
    return kBulk ? (int)threadIdx.x + 32 * i : ((int)threadIdx.x + 256 * i) / 16;
  };
  auto src_of = [&](const uint4* base, int page, int t) {
    return base + page * page_vecs + ((t % 16) * j.heads + head) * 16 +
           (kBulk ? 0 : threadIdx.x % 16);
  };
  if (kBulk && threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
          (unsigned)__cvta_generic_to_shared(&bars[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  int next_pages[kRows];
  auto read_pages = [&](int tile) {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      next_pages[i] = tile < tiles ? pages[(t_begin + tile * kTile + row_of(i)) / 16] : 0;
  };
  auto issue = [&](int tile) {
    const int s = tile % kStages;
    unsigned char* k_st = smem + s * 2 * kStageBytes;
    unsigned char* v_st = k_st + kStageBytes;
    if (kBulk) {
      if (threadIdx.x >= 32) return;
      const unsigned bar = (unsigned)__cvta_generic_to_shared(&bars[s]);
      if (threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                     "r"(2 * kStageBytes)
                     : "memory");
      __syncwarp();
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int row = row_of(i), t = t_begin + tile * kTile + row;
        for (int kv = 0; kv < 2; ++kv) {
          const uint4* src = src_of(kv ? j.v : j.k, next_pages[i], t);
          const unsigned dst = (unsigned)__cvta_generic_to_shared((kv ? v_st : k_st) + row * 256);
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 256, "
              "[%2];" ::"r"(dst),
              "l"(src), "r"(bar)
              : "memory");
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int row = row_of(i), t = t_begin + tile * kTile + row;
        const unsigned off = row * 256 + (threadIdx.x % 16) * 16;
        for (int kv = 0; kv < 2; ++kv) {
          const uint4* src = src_of(kv ? j.v : j.k, next_pages[i], t);
          const unsigned dst = (unsigned)__cvta_generic_to_shared((kv ? v_st : k_st) + off);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
        }
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  };
  read_pages(0);
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles)
      issue(t);
    else if (!kBulk)
      asm volatile("cp.async.commit_group;" ::: "memory");
    read_pages(t + 1);
  }
  unsigned acc = 0;
  for (int tile = 0; tile < tiles; ++tile) {
    const int next = tile + kStages - 1;
    if (next < tiles)
      issue(next);
    else if (!kBulk)
      asm volatile("cp.async.commit_group;" ::: "memory");
    read_pages(next + 1);
    const int s = tile % kStages;
    if (kBulk) {
      const unsigned bar = (unsigned)__cvta_generic_to_shared(&bars[s]);
      const unsigned parity = (tile / kStages) & 1;
      asm volatile(
          "{\n.reg .pred d;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 d, [%0], %1;\n@!d bra "
          "W_%=;\n}" ::"r"(bar),
          "r"(parity)
          : "memory");
    } else {
      asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
      __syncthreads();
    }
    const uint4 a = reinterpret_cast<const uint4*>(smem + s * 2 * kStageBytes)[threadIdx.x];
    const uint4 b =
        reinterpret_cast<const uint4*>(smem + s * 2 * kStageBytes + kStageBytes)[threadIdx.x];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    if (kComputeCycles > 0) {
      const long long c0 = clock64();
      while (clock64() - c0 < kComputeCycles) {
      }
    }
    __syncthreads();  // the stage is refilled by a later iteration
  }
  if (acc == 0x9e3779b9u) j.sink[blockIdx.x] = acc;
}

// The ceiling kernel's shape (grid-stride, 4 loads in flight per thread) over exactly `vecs`.
__global__ void stream_read(const uint4* __restrict__ d, long long vecs, unsigned* sink) {
  unsigned acc = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < vecs; i += 4 * stride) {
    const uint4 a = __ldcs(d + i), b = __ldcs(d + i + stride), c = __ldcs(d + i + 2 * stride),
                e = __ldcs(d + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ e.x ^ e.y ^ e.z ^
           e.w;
  }
  for (; i < vecs; i += stride) {
    const uint4 a = __ldcs(d + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

template <class F>
float median_event_us(F&& launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int r = 0; r < 60; ++r) {
    spin<<<1, 32>>>(200000);
    CK(cudaEventRecord(a));
    launch(r);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 10) ts.push_back(ms * 1000.f);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main() {
  constexpr int kCopies = 3, kHeads = 8;
  unsigned* sink;
  CK(cudaMalloc(&sink, 1 << 20));
  // Read ceiling, as `flashkv bench ceilings` measures it: 4 GiB.
  {
    const long long bytes = 4LL << 30;
    uint4* d;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemset(d, 1, bytes));
    const float us =
        median_event_us([&](int) { stream_read<<<132 * 8, 256>>>(d, bytes / 16, sink); });
    std::printf("ceiling: 4 GiB in %.1f us = %.3f TB/s\n", us, bytes / (us * 1e-6) / 1e12);
    CK(cudaFree(d));
  }
  struct W {
    const char* name;
    int reqs, tokens, chunks;
  };
  for (const W& w : {W{"D1", 16, 1024, 1}, W{"D4", 1, 32768, 16}, W{"D2-size", 16, 768, 1}}) {
    const int pages_per_req = w.tokens / 16;
    const long long pages = (long long)w.reqs * pages_per_req;
    const long long page_vecs = 16LL * kHeads * 16;
    const long long copy_vecs = pages * page_vecs;  // K (and again V) of one copy
    const double bytes = 2.0 * copy_vecs * 16;
    uint4* kv;  // all copies' K, then all copies' V
    int *ids, *ids_in_order;
    CK(cudaMalloc(&kv, 2 * copy_vecs * 16 * kCopies));
    CK(cudaMemset(kv, 1, 2 * copy_vecs * 16 * kCopies));
    uint4 *k = kv, *v = kv + copy_vecs * kCopies;
    CK(cudaMalloc(&ids, pages * kCopies * 4));
    std::mt19937 rng(7);
    std::vector<int> perm(pages * kCopies);
    for (int c = 0; c < kCopies; ++c) {
      std::iota(perm.begin() + c * pages, perm.begin() + (c + 1) * pages, int(c * pages));
      std::shuffle(perm.begin() + c * pages, perm.begin() + (c + 1) * pages, rng);
    }
    CK(cudaMemcpy(ids, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
    std::iota(perm.begin(), perm.end(), 0);
    CK(cudaMalloc(&ids_in_order, pages * kCopies * 4));
    CK(cudaMemcpy(ids_in_order, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
    std::printf("%s: %d x %d tokens, %d KV heads, %.1f MB of K+V (%.2f us at 4.64 TB/s)\n", w.name,
                w.reqs, w.tokens, kHeads, bytes / 1e6, bytes / 4.64e12 * 1e6);
    auto report = [&](const char* what, float us) {
      std::printf("  %-44s %7.2f us  %5.2f TB/s\n", what, us, bytes / (us * 1e-6) / 1e12);
    };
    report("contiguous stream (ceiling kernel, 132x8 CTAs)", median_event_us([&](int r) {
             // The same byte count, one contiguous span (copy c's slot of 2 x copy_vecs).
             stream_read<<<132 * 8, 256>>>(kv + (r % kCopies) * 2 * copy_vecs, 2 * copy_vecs, sink);
           }));
    for (int pat : {kNHD, kNHDInOrder, kHND, kDense}) {
      for (int mult : {1, 2}) {
        Job j{nullptr,         nullptr,  nullptr,      pages_per_req, kHeads,
              w.chunks * mult, w.tokens, Pattern(pat), sink};
        const int grid = w.reqs * kHeads * j.chunks;
        auto run = [&](auto kernel, const char* label) {
          char name[96];
          const char* names[] = {"NHD", "HND", "dense", "NHD in order"};
          std::snprintf(name, sizeof name, "%s %d CTAs, %s", names[pat], grid, label);
          report(name, median_event_us([&](int r) {
                   const int c = r % kCopies;
                   Job jc = j;
                   // Page ids index all copies' pages; a dense copy is addressed from its base.
                   const long long base = pat == kDense ? c * copy_vecs : 0;
                   jc.k = k + base;
                   jc.v = v + base;
                   jc.pages = (pat == kNHDInOrder ? ids_in_order : ids) + c * pages;
                   kernel<<<grid, 256>>>(jc);
                 }));
        };
        run(paged_read<4>, "32 KB in flight");
        run(paged_read<8>, "64 KB in flight");
        run(paged_read<16>, "128 KB in flight");
      }
    }
    // The decode kernel's load path (pipe_read): cp.async vs bulk copies, by tile and stages.
    auto run_pipe = [&](auto kernel, int tile, int stages, int ctas_per_pair, const char* label) {
      Job j{nullptr,  nullptr, nullptr, pages_per_req, kHeads, w.chunks * ctas_per_pair,
            w.tokens, kNHD,    sink};
      const int grid = w.reqs * kHeads * j.chunks;
      const int smem = stages * tile * 512;
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      char name[96];
      std::snprintf(name, sizeof name, "pipe NHD %d CTAs, %s", grid, label);
      report(name, median_event_us([&](int r) {
               const int c = r % kCopies;
               Job jc = j;
               jc.k = k;
               jc.v = v;
               jc.pages = ids + c * pages;
               kernel<<<grid, 256, smem>>>(jc);
             }));
    };
    run_pipe(pipe_read<128, 2, false>, 128, 2, 1, "cp.async 128-token tiles x 2 (flashkv's)");
    run_pipe(pipe_read<128, 2, true>, 128, 2, 1, "bulk 128-token tiles x 2");
    run_pipe(pipe_read<128, 3, false>, 128, 3, 1, "cp.async 128-token tiles x 3");
    run_pipe(pipe_read<128, 3, true>, 128, 3, 1, "bulk 128-token tiles x 3");
    run_pipe(pipe_read<64, 2, false>, 64, 2, 2, "cp.async 64-token tiles x 2, 2/SM");
    run_pipe(pipe_read<64, 2, true>, 64, 2, 2, "bulk 64-token tiles x 2, 2/SM");
    run_pipe(pipe_read<64, 3, true>, 64, 3, 2, "bulk 64-token tiles x 3, 2/SM");
    // The math's share of each tile (~1.98 GHz: 500 cycles ~ 0.25 us), not overlapped with the
    // next tile's issue at 2 stages, overlapped at 3.
    run_pipe(pipe_read<128, 2, false, 500>, 128, 2, 1, "cp.async 128 x 2, 500 cycles per tile");
    run_pipe(pipe_read<128, 2, false, 1000>, 128, 2, 1, "cp.async 128 x 2, 1000 cycles per tile");
    run_pipe(pipe_read<128, 3, false, 500>, 128, 3, 1, "cp.async 128 x 3, 500 cycles per tile");
    run_pipe(pipe_read<128, 3, false, 1000>, 128, 3, 1, "cp.async 128 x 3, 1000 cycles per tile");
    run_pipe(pipe_read<64, 2, false, 500>, 64, 2, 2, "cp.async 64 x 2, 2/SM, 500 cycles per tile");
    CK(cudaFree(kv));
    CK(cudaFree(ids));
    CK(cudaFree(ids_in_order));
  }
  return 0;
}
