"""The serving benchmark's host side (flashkv.bench.serve): request generation is seeded and the
same for every implementation, the ShareGPT-like table is well formed, the report renders, and a
machine without a GPU gets a clear message instead of a crash."""

import json
import math

import pytest

from flashkv.bench import serve


def test_requests_are_seeded_and_shaped():
    a = serve.make_requests("variable", 10, 4.0, 0, 1000, variable_output=64, max_output=256)
    b = serve.make_requests("variable", 10, 4.0, 0, 1000, variable_output=64, max_output=256)
    assert a == b
    assert all(512 <= len(p) <= 2048 and o == 64 for _, p, o in a)
    times = [t for t, _, _ in a]
    assert times == sorted(times) and times[0] > 0
    burst = serve.make_requests("sharegpt", 8, math.inf, 1, 1000, variable_output=64,
                                max_output=32)
    assert all(t == 0.0 for t, _, _ in burst)
    assert all(1 <= o <= 32 for _, _, o in burst)
    with pytest.raises(ValueError, match="workload"):
        serve.make_requests("alpaca", 1, 1.0, 0, 10, variable_output=1, max_output=1)


def test_sharegpt_table_cites_its_source():
    t = json.loads(serve.LENGTHS_FILE.read_text())
    assert "Kwon et al." in t["source"]
    assert len(t["pairs"]) >= 100
    assert all(4 <= p <= 2048 and 4 <= o <= 1024 for p, o in t["pairs"])
    mp = sum(p for p, _ in t["pairs"]) / len(t["pairs"])
    assert abs(mp - t["mean_prompt"]) < 1


def test_percentile_and_markdown():
    assert serve.percentile([3, 1, 2], 50) == 2
    assert serve.percentile([1, 2], 100) == 2
    assert math.isnan(serve.percentile([], 50))
    rows = [dict(impl="paged|fkv", workload="variable", rate=2.0, completed=3, requests=3,
                 ttft_p50_ms=10, ttft_p99_ms=20, itl_p50_ms=1.5, itl_p99_ms=3.0,
                 output_tok_per_s=100, adapter_plans=2, adapter_calls=64,
                 adapter_plan_us_per_step=300, adapter_call_us_per_layer=40),
            dict(impl="paged|eager", workload="variable", rate=2.0, error="OutOfMemoryError"),
            dict(impl="paged|fkv", workload="variable", rate="profile", attention_share=0.2,
                 kv_cache_share=0.01, kernel_ms=5)]
    md = serve.markdown(rows)
    assert "| variable | 2.0 | paged|fkv | 10 / 20 | 1.5 / 3.0 | 100 | 3/3 | 300, 40 |" in md
    assert "20.0 %" in md and "OutOfMemoryError" in md


def test_kernel_categories():
    assert serve.ATTENTION_KERNELS.search("batch_decode_tc_kernel")
    assert serve.ATTENTION_KERNELS.search("pytorch_flash::flash_fwd_kernel")
    assert serve.KV_KERNELS.search("append_quantize_kernel")
    assert not serve.ATTENTION_KERNELS.search("ampere_bf16_s16816gemm")


def test_without_a_gpu_it_says_so(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert serve.main(["--requests", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
