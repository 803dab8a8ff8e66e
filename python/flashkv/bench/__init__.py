"""``python -m flashkv.bench``: flashkv's standard workloads through its Python API.

Decode D1-D6 (GQA 32/8 and MHA 32/32) and causal prefill P1-P5 (GQA 32/8), f16 by default,
head_dim 128, page size 16 (docs/benchmarks.md; the workloads of `flashkv bench`, the C++
reference implementation of this benchmark), run through the FlashInfer-shaped wrappers on torch
CUDA tensors: plan once, time run() with CUDA events (median of --reps, inputs rotated so the L2
does not flatter), check every configuration against a float32 torch reference on sampled
requests. The ceilings (read bandwidth, copy, torch.mm GEMM rates) are measured in the same
process (as the peers measure them when --peers names some), and --peers torch,flashinfer runs
flashkv's peers (flashkv.bench.peers) on the same workloads. Writes the JSON of
docs/benchmarks.md (--json), a Markdown table (--md) and
one PNG per kind (--plots DIR: decode as % of the read ceiling, prefill as % of the fp16 GEMM
rate). Without a GPU (or with --cpu) it says so and runs the CPU reference at a small size.
Exits 1 when a flashkv configuration fails its check or does not run. On a GPU machine::

    python -m flashkv.bench --peers torch \\
        --json bench-python.json --md bench-python.md --plots plots/

Modules: workloads (definitions, counting), gpu (timing, ceilings, flashkv runs and checks),
peers (the peers, a package of their own), cpu (the CPU mode), report (JSON / text), plot (PNG).
"""

from .cli import main

__all__ = ["main"]
