"""The GPU's ceilings, measured in the same run as the peers (docs/benchmarks.md, "Ceilings").

  read: the fastest of three torch reductions (amax over int32, sum over float32, sum of float16
        accumulated in float32) streaming 4 GiB and writing one value: bytes read over time;
  copy: dst.copy_(src) of 4 GiB, bytes read + written over time;
  GEMM: torch.mm 8192 x 8192 x 8192 on randn inputs, fp16 and bf16, 2 n^3 FLOPs over time.
Medians of 20 (bandwidths) and 30 (GEMMs) repetitions, without the L2 flush (the buffers are far
larger than the L2). Returned in the result schema's keys.
"""

GIB4 = 4 << 30
GEMM_N = 8192


def _median_us(timer, fn, reps, warmup):
    us = sorted(timer.samples_us(fn, reps, warmup=warmup, flush=False))
    return us[len(us) // 2]


def measure(torch, timer):
    """dict(read_tbps, copy_tbps, gemm_f16_tflops, gemm_bf16_tflops, source)."""
    src = torch.randint(0, 255, (GIB4,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * GIB4 / (_median_us(timer, lambda: dst.copy_(src), 20, 3) * 1e-6) / 1e12
    del dst
    reductions = (lambda: torch.amax(src.view(torch.int32)),
                  lambda: torch.sum(src.view(torch.float32)),
                  lambda: torch.sum(src.view(torch.float16), dtype=torch.float32))
    read = max(GIB4 / (_median_us(timer, fn, 20, 3) * 1e-6) / 1e12 for fn in reductions)
    del src
    gemm = {}
    for name, dtype in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        a = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=dtype)
        b = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=dtype)
        c = torch.empty(GEMM_N, GEMM_N, device="cuda", dtype=dtype)
        us = _median_us(timer, lambda: torch.mm(a, b, out=c), 30, 5)
        gemm[name] = 2 * GEMM_N ** 3 / (us * 1e-6) / 1e12
        del a, b, c
    torch.cuda.empty_cache()
    return dict(read_tbps=read, copy_tbps=copy, gemm_f16_tflops=gemm["f16"],
                gemm_bf16_tflops=gemm["bf16"],
                source="flashkv.bench.peers.ceilings: fastest of torch amax/sum reductions over "
                       "4 GiB (bytes read); copy_ of 4 GiB (read + written); torch.mm 8192^3")
