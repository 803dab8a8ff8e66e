"""python -m flashkv.bench on any machine: the CPU mode runs through the wrappers and writes
the JSON of docs/benchmarks.md, the plots draw from a result document, the workloads are those of
the C++ CLI. On a GPU machine (torch with CUDA) a short GPU run is checked too."""

import json
import os
import subprocess
import sys

import pytest

import flashkv
from flashkv.bench import cli, plot, report
from flashkv.bench import workloads as W

SCHEMA_ROW_KEYS = {"workload", "shape", "dtype", "system", "time_us", "tbps", "tflops", "rel_err"}
CEILING_KEYS = {"read_tbps", "copy_tbps", "gemm_f16_tflops", "gemm_bf16_tflops"}

try:
    import torch

    GPU = torch.cuda.is_available() and flashkv.cuda_available()
except ImportError:
    GPU = False


def strict_load(path):
    """json.load that rejects NaN / Infinity (not JSON)."""
    def bad(x):
        raise ValueError(f"{path}: non-standard JSON constant {x}")
    with open(path) as f:
        return json.load(f, parse_constant=bad)


def run_main(argv):
    lines = []
    rc = cli.main(argv, log=lines.append)
    return rc, "\n".join(lines)


def test_cpu_mode_writes_the_schema(tmp_path):
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    rc, text = run_main(["--cpu", "--cpu-reps", "1", "--json", str(out), "--md", str(md)])
    assert rc == 0, text
    assert "No GPU benchmark here: --cpu given" in text and "CPU reference" in text
    doc = strict_load(out)
    assert {"gpu", "commit", "date", "ceilings", "results"} <= set(doc)
    assert doc["gpu"] is None and doc["mode"] == "cpu-reference"
    assert set(doc["ceilings"]) >= CEILING_KEYS
    assert doc["date"].endswith("Z") and doc["commit"]
    kinds = {r["kind"] for r in doc["results"]}
    assert kinds == {"decode", "prefill"}
    for r in doc["results"]:
        assert SCHEMA_ROW_KEYS <= set(r), r
        assert r["system"] == "flashkv-cpu-reference" and r["ref_ok"] is True
        assert r["rel_err"] <= r["rel_err_bound"] and r["time_us"] > 0
        assert (r["tbps"] is not None) == (r["kind"] == "decode")
        assert (r["tflops"] is not None) == (r["kind"] == "prefill")
    table = md.read_text()
    assert "| workload | shape |" in table and "D-cpu256" in table and "P-cpu" in table


def test_cpu_mode_without_a_gpu_says_so(tmp_path):
    if GPU:
        pytest.skip("a GPU is present (the GPU mode runs)")
    rc, text = run_main(["--kinds", "decode", "--cpu-reps", "1", "--peers", "torch"])
    assert rc == 0
    assert "No GPU benchmark here:" in text and "peers need a GPU; skipped" in text


def test_cpu_mode_plots(tmp_path):
    pytest.importorskip("matplotlib")
    rc, text = run_main(["--cpu", "--kinds", "decode", "--cpu-reps", "1",
                         "--plots", str(tmp_path / "plots")])
    assert rc == 0, text
    assert os.listdir(tmp_path / "plots") == ["decode.png"]  # no prefill rows, no prefill plot


def test_module_entry_point(tmp_path):
    out = tmp_path / "b.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-m", "flashkv.bench", "--cpu", "--kinds", "decode",
                        "--cpu-reps", "1", "--json", str(out)], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert len(strict_load(out)["results"]) == 2
    r = subprocess.run([sys.executable, "-m", "flashkv.bench", "--workloads", "D9"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown id 'D9'" in r.stderr


def synthetic_doc():
    """A GPU-like result: flashkv and two peers on D1-D6 (both shapes) and P1-P5, one failed
    flashkv check, a bf16 row."""
    rows = []
    for shape in ("gqa-32-8", "mha-32-32"):
        for system, base in (("flashkv", 35), ("torch-sdpa-cudnn-padded", 60),
                             ("torch-fa2-varlen", 45)):
            for i in range(6):
                rows.append(dict(workload=f"D{i + 1}", kind="decode", shape=shape, dtype="f16",
                                 system=system, time_us=20.0 + i, tbps=4.5 * (base + 9 * i) / 100,
                                 tflops=None, rel_err=1e-3,
                                 ref_ok=True if system == "flashkv" else None))
    for system, base in (("flashkv", 27), ("torch-flex-attention", 35)):
        for i in range(5):
            rows.append(dict(workload=f"P{i + 1}", kind="prefill", shape="gqa-32-8", dtype="f16",
                             system=system, time_us=900.0, tbps=None,
                             tflops=756 * (base + 5 * i) / 100, rel_err=2e-3,
                             ref_ok=(i != 2) if system == "flashkv" else None))
    rows.append(dict(workload="P1", kind="prefill", shape="gqa-32-8", dtype="bf16",
                     system="flashkv", time_us=1e3, tbps=None, tflops=190.0, rel_err=4e-3,
                     ref_ok=True))
    doc = dict(gpu="NVIDIA H200", commit="abc1234", date="2026-11-30T10:00:00Z",
               ceilings=dict(read_tbps=4.5, copy_tbps=4.3, gemm_f16_tflops=756.0,
                             gemm_bf16_tflops=802.0), results=rows,
               failures=[dict(workload="P5", shape="gqa-32-8", dtype="bf16", system="flashkv",
                              error="ValueError: synthetic")])
    return report.fill_pct(doc)


def test_plots_from_a_result_document(tmp_path):
    pytest.importorskip("matplotlib")
    doc = synthetic_doc()
    path = tmp_path / "synthetic.json"
    report.write_json(doc, path)
    paths = plot.plot_results(strict_load(path), str(tmp_path / "png"))
    assert [os.path.basename(p) for p in paths] == ["decode.png", "prefill.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(p) > 10_000


def test_report_percentages_failures_and_markdown():
    doc = synthetic_doc()
    d1 = next(r for r in doc["results"] if r["workload"] == "D1" and r["system"] == "flashkv")
    assert d1["pct_of_ceiling"] == pytest.approx(35.0)
    p2 = next(r for r in doc["results"] if r["workload"] == "P2" and r["system"] == "flashkv")
    assert p2["pct_of_ceiling"] == pytest.approx(32.0)
    assert report.flashkv_failures(doc) == 2  # P3's check and P5 bf16's exception
    md = report.markdown(doc)
    assert md.count("\n| D1 |") == 6 and "FAIL |" in md
    lines = []
    report.print_table(doc, lines.append)
    assert any("FAILED: ValueError: synthetic" in line for line in lines)
    assert report.clean({"a": [float("nan"), 1.0]}) == {"a": [None, 1.0]}


def test_workloads_are_the_standard_ones():
    wl = {w.id: w for w in W.standard_workloads()}
    assert list(wl) == ["D1", "D2", "D3", "D4", "D5", "D6", "P1", "P2", "P3", "P4", "P5"]
    # apps/flashkv/workloads.cpp's copy of random.Random(2025)'s draws
    uniform = [596, 1001, 689, 512, 892, 896, 749, 579, 903, 922, 612, 556, 633, 728, 896, 613]
    assert wl["D2"].kv_lens == uniform == wl["P2"].kv_lens
    assert wl["D3"].kv_lens[0] == 5409 and wl["D3"].kv_lens[-1] == 256
    q_o = 2 * 16 * 32 * 128 * 2  # q and o
    assert W.decode_bytes(wl["D1"], 32, 8, 128, "f16") == q_o + 16384 * 8 * 128 * 2 * 2
    assert W.prefill_flops(wl["P4"], 32, 128) == 4.0 * 128 * 32 * 8192 * 8193 // 2
    assert W.causal_pairs(4, 4096) == 4093 + 4094 + 4095 + 4096 and W.causal_pairs(3, 2) == 3
    assert W.page_table([16, 17, 0], 16) == ([0, 1, 3, 3], [16, 1, 0])
    assert W.rotation_copies(1) == 8 and W.rotation_copies(1 << 30) == 1
    assert W.rotation_copies(60 << 20) == 4


def test_bad_peer_names_are_refused_at_parse_time(capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--peers", "torch,nope"])
    assert e.value.code == 2
    assert "--peers: unknown peer 'nope'" in capsys.readouterr().err
    assert [p.name for p in cli.parse_args(["--peers", "fa2-varlen"]).selected_peers] == [
        "fa2-varlen"]


@pytest.mark.skipif(not GPU, reason="needs PyTorch with CUDA and a CUDA GPU")
def test_gpu_run(tmp_path):
    """A short GPU run (D1 both shapes, P4, f16 and bf16, with two peers): ceilings measured,
    every flashkv row checked and passing, the peers' rows written, plots drawn."""
    out = tmp_path / "gpu.json"
    argv = ["--workloads", "D1", "P4", "--dtypes", "f16", "bf16", "--reps", "10", "--json",
            str(out), "--plots", str(tmp_path / "png")]
    argv += ["--peers", "sdpa-flash,fa2-varlen"]
    rc, text = run_main(argv)
    assert rc == 0, text
    doc = strict_load(out)
    assert doc["gpu"] and all(doc["ceilings"][k] > 0 for k in CEILING_KEYS)
    own = [r for r in doc["results"] if r["system"] == "flashkv"]
    assert sorted((r["workload"], r["shape"], r["dtype"]) for r in own) == sorted(
        [("D1", s, d) for s in W.SHAPES for d in ("f16", "bf16")]
        + [("P4", "gqa-32-8", d) for d in ("f16", "bf16")])
    for r in own:
        assert r["ref_ok"] and 0 < r["pct_of_ceiling"] < 150, r
    peers = {(r["system"], r["workload"]) for r in doc["results"] if r["system"] != "flashkv"}
    assert {("torch-fa2-varlen", "D1"), ("torch-fa2-varlen", "P4"),
            ("torch-sdpa-flash-padded", "D1")} <= peers


@pytest.mark.skipif(not GPU, reason="needs PyTorch with CUDA and a CUDA GPU")
def test_gpu_run_fp8_kv(tmp_path):
    """--kv-dtype e4m3: D1 and P4 over an fp8 cache, every row checked against the reference
    and marked as fp8 (the % of the read ceiling counts the fp8 bytes)."""
    out = tmp_path / "fp8.json"
    rc, text = run_main(["--workloads", "D1", "P4", "--dtypes", "f16", "--kv-dtype", "e4m3",
                         "--reps", "5", "--json", str(out)])
    assert rc == 0, text
    doc = strict_load(out)
    own = [r for r in doc["results"] if r["system"] == "flashkv"]
    assert sorted((r["workload"], r["shape"]) for r in own) == sorted(
        [("D1", s) for s in W.SHAPES] + [("P4", "gqa-32-8")])
    for r in own:
        assert r["ref_ok"] and 0 < r["pct_of_ceiling"] < 150, r
        assert "e4m3" in json.dumps(r), r


def test_sparse_patterns_are_the_cli_ones():
    """B1 / B2 draw the bits `flashkv bench sparse` draws (tests/cpu/test_sparse_workloads.cpp
    pins the same numbers): stored blocks, a position-weighted checksum, the visible pairs; the
    density is of the causal triangle."""
    from flashkv.bench import sparse_workloads as SW

    for w, blocks, checksum, pairs in ((SW.B1, 3296, 1188712, 51920896),
                                       (SW.B2, 1287, 716784, 4239360)):
        indptr, ind = SW.bsr_pattern(w)
        assert len(ind) == blocks
        assert sum(x * (i % 7 + 1) for i, x in enumerate(ind)) == checksum
        assert SW.causal_pairs(w, indptr, ind) == pairs
        assert abs(len(ind) / SW.causal_blocks(w.blocks_per_side) - w.density) < 0.1 * w.density
        for i in range(w.blocks_per_side):
            row = ind[indptr[i]:indptr[i + 1]]
            assert row[0] == 0 and row[-1] == i and row == sorted(set(row))


def test_cpu_mode_sparse(tmp_path):
    """--kinds sparse without a GPU: B1's construction at 1k through the wrapper on host
    arrays, checked on every row."""
    out = tmp_path / "sparse.json"
    rc, text = run_main(["--kinds", "sparse", "--cpu", "--cpu-reps", "1", "--json", str(out)])
    assert rc == 0, text
    (r,) = strict_load(out)["results"]
    assert r["workload"] == "B-cpu" and r["kind"] == "sparse" and r["ref_ok"] is True


@pytest.mark.skipif(not GPU, reason="needs PyTorch with CUDA and a CUDA GPU")
def test_gpu_run_sparse_b3(tmp_path):
    """--kinds sparse --workloads B3 (without peers' compile: --no-flex): flashkv's row checked
    against the reference, the dense comparators beside it."""
    out = tmp_path / "b3.json"
    rc, text = run_main(["--kinds", "sparse", "--workloads", "B3", "--reps", "5", "--no-flex",
                         "--json", str(out)])
    assert rc == 0, text
    rows = {r["system"]: r for r in strict_load(out)["results"]}
    assert rows["flashkv"]["ref_ok"] and 0 < rows["flashkv"]["pct_of_ceiling"] < 150
    assert {"flashkv-dense-selected-len", "flashkv-dense", "torch-sdpa-dense-mask"} <= set(rows)
