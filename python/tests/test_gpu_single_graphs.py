"""GPU tests: single_decode_with_kv_cache and single_prefill_with_kv_cache inside a CUDA graph
and torch.compile(mode="reduce-overhead") (issue 43; FlashInfer's issue #541). An eager call
makes the plan of a shape (flashkv._single_plans); a captured call only runs it. Each replay
gets fresh random inputs copied into the captured tensors and a poisoned output, and is checked
against torch's float32 SDPA. A capture with a shape never planned eagerly raises RuntimeError
saying so. Skipped unless torch with CUDA and a GPU are present.
"""

import subprocess
import sys
import textwrap

import pytest

import flashkv
from flashkv import _single_plans

from conftest import requires_gpu
from gpu_helpers import DTYPES, check_lse, check_out, gen, rand, sdpa_ref, tdtype

try:
    import torch
except ImportError:  # the module is skipped (requires_gpu) without torch
    torch = None

pytestmark = requires_gpu


def _fill(static, dtype, g):
    static.copy_(rand(tuple(static.shape), dtype, g))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_len", [1, 300, 8192])  # 8192: split-KV
def test_single_decode_in_cuda_graph(dtype, kv_layout, kv_len):
    g = gen(kv_len)
    hq, hk, d = 32, 8, 128
    kv_shape = (kv_len, hk, d) if kv_layout == "NHD" else (hk, kv_len, d)
    q = rand((hq, d), dtype, g)
    k, v = rand(kv_shape, dtype, g), rand(kv_shape, dtype, g)
    out = torch.empty_like(q)
    lse = torch.empty(hq, device="cuda")
    # The eager warm-up (on a side stream, as torch's own graph warm-ups) makes the plan.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashkv.single_decode_with_kv_cache(q, k, v, kv_layout, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashkv.single_decode_with_kv_cache(q, k, v, kv_layout, out=out, lse=lse)
    for _ in range(3):
        for t in (q, k, v):
            _fill(t, dtype, g)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        kn = k if kv_layout == "NHD" else k.transpose(0, 1)
        vn = v if kv_layout == "NHD" else v.transpose(0, 1)
        ref, ref_lse = sdpa_ref(q[None], kn, vn)
        check_out(out, ref[0], dtype)
        check_lse(lse, ref_lse[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qo_len,kv_len", [(1, 77), (37, 500), (512, 2048)])
def test_single_prefill_in_cuda_graph(dtype, causal, qo_len, kv_len):
    g = gen(qo_len + kv_len)
    hq, hk, d = 16, 4, 128
    q = rand((qo_len, hq, d), dtype, g)
    k, v = rand((kv_len, hk, d), dtype, g), rand((kv_len, hk, d), dtype, g)
    out = torch.empty_like(q)
    lse = torch.empty(qo_len, hq, device="cuda")
    flashkv.single_prefill_with_kv_cache(q, k, v, causal=causal, out=out, lse=lse)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashkv.single_prefill_with_kv_cache(q, k, v, causal=causal, out=out, lse=lse)
    for _ in range(2):
        for t in (q, k, v):
            _fill(t, dtype, g)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse = sdpa_ref(q, k, v, causal=causal)
        check_out(out, ref, dtype)
        check_lse(lse, ref_lse)


def test_capture_without_warm_up_names_the_fix():
    _single_plans.clear()
    q = torch.randn(8, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(4099, 8, 128, device="cuda", dtype=torch.float16)  # a kv_len no test used
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="eagerly with the same shapes"):
        with torch.cuda.graph(graph):
            flashkv.single_decode_with_kv_cache(q, k, k)


def test_plans_are_reused_not_remade():
    _single_plans.clear()
    q = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(100, 2, 64, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        flashkv.single_decode_with_kv_cache(q, k, k)
    flashkv.single_decode_with_kv_cache(q, k[:99], k[:99])
    keys = [key for key in _single_plans.cached_keys() if key[0] == "decode"]
    assert len(keys) == 2, keys


_COMPILE_SCRIPT = textwrap.dedent("""\
    import torch
    import flashkv
    from gpu_helpers import check_out, sdpa_ref

    torch.library.define("flashkv_t43::{name}", "(Tensor q, Tensor k, Tensor v) -> Tensor")

    @torch.library.impl("flashkv_t43::{name}", "cuda")
    def _impl(q, k, v):
        return {call}

    @torch.library.register_fake("flashkv_t43::{name}")
    def _fake(q, k, v):
        return torch.empty_like(q)

    fn = torch.compile(lambda q, k, v: torch.ops.flashkv_t43.{name}(q, k, v),
                       mode="reduce-overhead", fullgraph=True)
    for i in range(4):  # warm-up, record, replays
        q = torch.randn({q_shape}, device="cuda", dtype=torch.float16)
        k = torch.randn({kv_shape}, device="cuda", dtype=torch.float16)
        v = torch.randn({kv_shape}, device="cuda", dtype=torch.float16)
        o = fn(q, k, v).clone()
        torch.cuda.synchronize()
        ref, _ = sdpa_ref({ref_q}, k, v, causal={causal})
        check_out(o, ref{ref_idx}, "float16")
    print("PASS")
""")


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_single_torch_compile_reduce_overhead(op, tmp_path):
    """FlashInfer's test_single_*_torch_compile_cuda_graph: the op inside a torch custom op under
    torch.compile(mode="reduce-overhead", fullgraph=True), in a subprocess (torch.library
    definitions belong at module level)."""
    if op == "decode":
        args = dict(name="dec", call="flashkv.single_decode_with_kv_cache(q, k, v)",
                    q_shape="8, 128", kv_shape="256, 8, 128", ref_q="q[None]", causal=False,
                    ref_idx="[0]")
    else:
        args = dict(name="pre", call="flashkv.single_prefill_with_kv_cache(q, k, v, causal=True)",
                    q_shape="64, 8, 128", kv_shape="256, 8, 128", ref_q="q", causal=True,
                    ref_idx="")
    script = tmp_path / "compile_single.py"
    script.write_text(_COMPILE_SCRIPT.format(**args))
    import os

    env = dict(os.environ, USER=os.environ.get("USER", "ci"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0 and "PASS" in r.stdout, (r.stdout[-2000:], r.stderr[-3000:])
