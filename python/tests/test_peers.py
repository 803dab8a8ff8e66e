"""flashkv.bench.peers without a GPU: peers chosen by name (bad names refused clearly), the rows
they write in the result schema, the timing method (on a stand-in for torch's CUDA events), the
rows checked per request, the merge of result files, and bench/run_peers.py running from the
sources alone. On a GPU machine with PyTorch a short peer run is checked too."""

import json
import os
import subprocess
import sys

import pytest

from flashkv.bench import workloads as W
from flashkv.bench.peers import batch, merge, registry, runner, timing

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RUN_PEERS = os.path.join(ROOT, "bench", "run_peers.py")
SCHEMA_ROW_KEYS = {"workload", "shape", "dtype", "system", "time_us", "tbps", "tflops", "rel_err"}
WL = {w.id: w for w in runner.ALL_WORKLOADS}

try:
    import torch

    GPU = torch.cuda.is_available()
except ImportError:
    GPU = False


def names(peers):
    return [p.name for p in peers]


# --- selection by name ---


def test_groups_select_their_peers_in_registry_order():
    assert names(registry.select("torch")) == ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient",
                                               "sdpa-lower-right", "fa2-varlen", "flex"]
    assert names(registry.select("flashinfer")) == [
        "flashinfer-decode", "flashinfer-decode-tc", "flashinfer-prefill-fa2",
        "flashinfer-prefill-fa3"]
    assert names(registry.select("torch,flashinfer")) == names(registry.select("all"))
    assert len(registry.select("all")) == len(registry.PEERS)


def test_names_and_groups_mix_each_peer_once():
    assert names(registry.select(" flex , fa2-varlen,flex ")) == ["fa2-varlen", "flex"]
    assert names(registry.select("flashinfer-decode-tc,torch"))[-1] == "flashinfer-decode-tc"


@pytest.mark.parametrize("spec, message", [
    ("torch,nope", "unknown peer 'nope'; expected some of torch, flashinfer, all, sdpa-flash"),
    ("", "expected a comma-separated list of"),
    ("torch,,flex", "empty entry in 'torch,,flex'"),
    ("../x/bench/peers_torch.py", "looks like a script path; --peers now takes peer names"),
])
def test_bad_selections_name_the_argument_and_what_it_takes(spec, message):
    with pytest.raises(ValueError) as e:
        registry.select(spec)
    assert str(e.value).startswith("--peers: ") and message in str(e.value)


def test_each_peer_runs_the_workloads_it_can():
    by = registry.BY_NAME
    assert [w for w in WL if by["flex"].runs_on(WL[w])] == ["P1", "P2", "P3", "P4", "P5"]
    assert [w for w in WL if by["sdpa-lower-right"].runs_on(WL[w])] == ["A1", "S1"]
    assert [w for w in WL if by["flashinfer-decode"].runs_on(WL[w])] == [
        "D1", "D2", "D3", "D4", "D5", "D6"]
    assert all(by["fa2-varlen"].runs_on(w) for w in runner.ALL_WORKLOADS)


def test_system_names_are_those_of_earlier_runs():
    # Old and new rows of a peer compare only under the same name.
    sdpa = registry.BY_NAME["sdpa-cudnn"]
    assert sdpa.system(WL["D2"]) == "torch-sdpa-cudnn-padded" == sdpa.system(WL["P2"])
    assert sdpa.system(WL["A1"]) == "torch-sdpa-cudnn-boolmask"
    assert registry.BY_NAME["fa2-varlen"].system(WL["S1"]) == "torch-fa2-varlen"
    assert registry.BY_NAME["flex"].system(WL["P5"]) == "torch-flex-attention"
    fa3 = registry.BY_NAME["flashinfer-prefill-fa3"]
    assert fa3.system(WL["P4"]) == "flashinfer-0.7 prefill-fa3"
    assert fa3.system(WL["P4"], "e4m3") == "flashinfer-0.7-e4m3 prefill-fa3"
    assert sdpa.system(WL["D1"], "e4m3") == "torch-sdpa-cudnn-padded"


# --- rows ---


def test_decode_row_counts_bytes_of_real_tokens():
    t = dict(time_us=20.0, p10_us=19.0, p90_us=21.0, reps=60, rel_err=1e-3, notes="n")
    row = runner.make_row(WL["D2"], "gqa-32-8", "torch-fa2-varlen", t, peer_name="fa2-varlen")
    assert SCHEMA_ROW_KEYS <= set(row)
    kv = sum(W.uniform_lens()) * 8 * 128 * 2 * 2  # K and V, f16, real tokens only
    assert row["bytes"] == 2 * 16 * 32 * 128 * 2 + kv  # + q and o
    assert row["tbps"] == pytest.approx(row["bytes"] / 20e-6 / 1e12)
    assert row["tflops"] is None and "flops" not in row
    assert (row["kind"], row["dtype"], row["peer"], row["reps"]) == ("decode", "f16",
                                                                     "fa2-varlen", 60)
    fp8 = runner.make_row(WL["D2"], "gqa-32-8", "x", t, kv_dtype="e4m3")
    assert fp8["bytes"] == row["bytes"] - kv // 2 and fp8["kv_dtype"] == "e4m3"


def test_prefill_rows_count_unmasked_pairs():
    t = dict(time_us=1000.0, rel_err=2e-3)
    p4 = runner.make_row(WL["P4"], "mha-32-32", "torch-flex-attention", t)
    assert p4["flops"] == 4.0 * 128 * 32 * (8192 * 8193 // 2) and p4["tbps"] is None
    assert p4["tflops"] == pytest.approx(p4["flops"] / 1e-3 / 1e12)
    s1 = runner.make_row(WL["S1"], "gqa-32-8", "torch-fa2-varlen", t)
    assert s1["flops"] == 4.0 * 128 * 32 * 64 * (4093 + 4094 + 4095 + 4096)
    assert s1["sum_qo"] == 256 and s1["sum_kv"] == 64 * 4096


def test_failures_carry_the_keys_summaries_read():
    f = runner.failure(WL["P1"], "mha-32-32", "torch-sdpa-flash-padded", "boom")
    assert f == dict(workload="P1", shape="mha-32-32", dtype="f16",
                     system="torch-sdpa-flash-padded", heads="MHA", error="boom")


def test_seeds_differ_per_workload_and_shape():
    seeds = {runner.seed_of(w, s) for w in WL for s in W.SHAPES}
    assert len(seeds) == len(WL) * len(W.SHAPES)


def test_append_workloads_are_the_cli_ones():
    a1, s1 = W.append_workloads()
    assert (a1.id, a1.batch, a1.qo()[0], a1.kv_lens[0]) == ("A1", 16, 512, 4608)
    assert (s1.id, s1.batch, s1.qo()[0], s1.kv_lens[0]) == ("S1", 64, 4, 4096)


# --- the check's sampled rows ---


def test_sampled_rows_first_last_and_random():
    rows = batch.sampled_rows([1, 1024, 8, 2], seed=7)
    assert rows[0] == [0]
    assert len(rows[1]) == batch.SAMPLED_ROWS and rows[1][:2] == [0, 1023]
    assert all(0 <= r < 1024 for r in rows[1])
    assert len(rows[2]) == 8 and rows[2][:2] == [0, 7]
    assert rows[3] == [0, 1]
    assert batch.sampled_rows([1, 1024, 8, 2], seed=7) == rows  # seeded
    assert batch.offsets([3, 0, 2]) == [0, 3, 3, 5]


# --- the timing method, on a stand-in for torch's CUDA calls ---


class FakeTorch:
    """Records the calls Timer makes; each timed call takes `us` microseconds."""

    def __init__(self, us):
        self.calls, self.us = [], us
        fake = self

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing
                self.t = None

            def record(self):
                fake.calls.append("record")
                self.t = len(fake.calls)

            def elapsed_time(self, end):
                return fake.us / 1e3  # milliseconds

        class Cuda:
            @staticmethod
            def synchronize():
                pass

            @staticmethod
            def _sleep(cycles):
                fake.calls.append(("sleep", cycles))

        Cuda.Event = Event
        self.cuda = Cuda
        self.int32 = "int32"

    def ones(self, n, dtype, device):
        assert (n * 4, dtype, device) == (timing.FLUSH_BYTES, "int32", "cuda")
        fake = self

        class Buffer:
            def sum(self):
                fake.calls.append("flush")

        return Buffer()


@pytest.mark.parametrize("us, reps", [(50.0, 60), (2000.0, 40), (9000.0, 30)])
def test_timer_flushes_spins_then_times_each_rep(us, reps):
    fake = FakeTorch(us)
    t = timing.Timer(fake)
    calls = []
    result = t.measure(lambda: calls.append(1))
    assert result == dict(time_us=us, p10_us=us, p90_us=us, reps=reps)
    assert len(calls) == 2 + 3 + 5 + reps  # estimate: 2 warm-ups + 3; then 5 warm-ups + reps
    # every timed call: L2 flush, spin, start event, (the call), end event
    per_rep = ["flush", ("sleep", timing.SPIN_CYCLES), "record", "record"]
    assert fake.calls[-4 * reps:] == per_rep * reps


def test_median_and_quantiles():
    assert timing.median([1, 2, 3]) == 2 and timing.median([1, 2, 3, 10]) == 2.5
    xs = list(range(61))
    assert timing.quantile(xs, 0.1) == 6 and timing.quantile(xs, 0.9) == 54


# --- merge ---


def test_merge_takes_the_best_ceiling_and_every_row():
    own = dict(gpu="NVIDIA H100", commit="abc", date="d", ceilings=dict(
        read_tbps=3.0, copy_tbps=2.9, gemm_f16_tflops=700.0, gemm_bf16_tflops=720.0),
        results=[dict(workload="D1", shape="gqa-32-8", dtype="f16", system="flashkv",
                      time_us=21.0, tbps=3.0, tflops=None, rel_err=1e-4)])
    peers = dict(gpu="NVIDIA H100", ceilings=dict(read_tbps=3.1, copy_tbps=2.8,
                                                  gemm_f16_tflops=None),
                 results=[runner.make_row(WL["D1"], "gqa-32-8", "torch-fa2-varlen",
                                          dict(time_us=40.0, rel_err=1e-3))],
                 failures=[runner.failure(WL["P1"], "gqa-32-8", "torch-flex-attention", "x")])
    doc = merge.merge_docs([own, peers], ["own.json", "peers.json"])
    assert doc["ceilings"] == dict(read_tbps=3.1, copy_tbps=2.9, gemm_f16_tflops=700.0,
                                   gemm_bf16_tflops=720.0)
    assert [r["system"] for r in doc["results"]] == ["flashkv", "torch-fa2-varlen"]
    assert doc["results"][0]["pct_of_ceiling"] == pytest.approx(100 * 3.0 / 3.1)
    assert len(doc["failures"]) == 1 and doc["commit"] == "abc"
    assert doc["merged_from"] == ["own.json", "peers.json"]


def test_merge_refuses_rows_outside_the_schema():
    raw = dict(results=[dict(workload="D1", heads="GQA", system="torch_fa2_varlen",
                             time_us=1.0)])
    with pytest.raises(ValueError, match="old.json: a row lacks shape, dtype"):
        merge.merge_docs([raw], ["old.json"])


# --- the standalone launcher ---


def run_peers(*args):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the sources alone
    return subprocess.run([sys.executable, RUN_PEERS, *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_run_peers_needs_no_build(tmp_path):
    out = tmp_path / "workloads.txt"
    r = run_peers("--emit-workloads", str(out))
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert lines[0].startswith("#") and len(lines) == 12
    d2 = lines[2].split()
    assert d2[:3] == ["D2", "decode", "16"] and list(map(int, d2[3:])) == W.uniform_lens()


def test_run_peers_refuses_bad_options():
    r = run_peers("--peers", "torch,sdpa-fast", "--out", "x.json")
    assert r.returncode == 2 and "--peers: unknown peer 'sdpa-fast'" in r.stderr
    r = run_peers("--peers", "torch", "--workloads", "D9", "--out", "x.json")
    assert r.returncode == 2 and "--workloads: unknown id 'D9'" in r.stderr
    r = run_peers("--peers", "torch")
    assert r.returncode == 2 and "--out FILE is required" in r.stderr
    r = run_peers("--merge", "a.json")
    assert r.returncode == 2 and "give --json, --md or --plots" in r.stderr


def test_run_peers_merges_files(tmp_path):
    a = tmp_path / "a.json"
    row = runner.make_row(WL["D1"], "gqa-32-8", "torch-fa2-varlen", dict(time_us=40.0))
    a.write_text(json.dumps(dict(gpu="g", ceilings=dict(read_tbps=3.0), results=[row])))
    r = run_peers("--merge", str(a), "--json", str(tmp_path / "m.json"), "--md",
                  str(tmp_path / "m.md"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["results"][0]["pct_of_ceiling"] == pytest.approx(100 * row["tbps"] / 3.0)
    assert row["tbps"] == pytest.approx(67371008 / 40e-6 / 1e12)
    assert "| D1 | gqa-32-8 | f16 | torch-fa2-varlen |" in (tmp_path / "m.md").read_text()


@pytest.mark.skipif(GPU, reason="a GPU is present (the peers run)")
def test_without_a_gpu_the_run_says_why(tmp_path):
    r = run_peers("--peers", "torch", "--out", str(tmp_path / "p.json"))
    assert r.returncode == 2
    assert ("PyTorch is not installed" in r.stdout or "the peers need a GPU" in r.stdout), r.stdout


@pytest.mark.skipif(not GPU, reason="needs PyTorch with CUDA and a CUDA GPU")
def test_gpu_peer_run(tmp_path):
    """D1 and P4 on GQA with three torch peers: every row written, checked and plausible."""
    out = tmp_path / "p.json"
    r = run_peers("--peers", "sdpa-cudnn,fa2-varlen,sdpa-flash", "--workloads", "D1", "P4",
                  "--shapes", "gqa-32-8", "--prefill-shapes", "gqa-32-8", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert all(doc["ceilings"][k] > 0 for k in ("read_tbps", "copy_tbps", "gemm_f16_tflops"))
    got = {(x["workload"], x["system"]): x for x in doc["results"]}
    assert {("D1", "torch-fa2-varlen"), ("P4", "torch-fa2-varlen"),
            ("D1", "torch-sdpa-cudnn-padded")} <= set(got)
    for row in doc["results"]:
        assert SCHEMA_ROW_KEYS <= set(row) and row["reps"] >= 30
        assert row["rel_err"] < 1e-2 and 0 < row["pct_of_ceiling"] < 150, row
