"""scripts/ab_summary.py, the summary of scripts/gpu-ab.sh: rows are told apart by workload,
variant and head_dim as well as shape and dtype, each side's time is the median of its runs, and a
file without GPU results is refused with a message."""

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "ab_summary.py")


def doc(times):
    """A bench JSON whose rows are PV with two variants and P4 at head_dim 128, times in order."""
    keys = [dict(workload="PV", variant="alibi"), dict(workload="PV", variant="soft_cap"),
            dict(workload="P4", head_dim=128)]
    rows = [dict(k, kind="prefill", shape="gqa-32-8", dtype="f16", system="flashkv",
                 time_us=t, ref_ok=True) for k, t in zip(keys, times)]
    rows.append(dict(rows[0], system="torch-sdpa", time_us=1.0))  # peers are left out
    return {"gpu": "NVIDIA H200", "commit": "abc1234", "results": rows}


def run(tmp_path, a_docs, b_docs):
    paths = {}
    for side, docs in (("a", a_docs), ("b", b_docs)):
        paths[side] = []
        for i, d in enumerate(docs):
            p = tmp_path / f"{side}-{i}.json"
            p.write_text(json.dumps(d))
            paths[side].append(str(p))
    return subprocess.run([sys.executable, SCRIPT, "--a", *paths["a"], "--b", *paths["b"]],
                          capture_output=True, text=True)


def test_rows_by_variant_and_head_dim_with_medians(tmp_path):
    r = run(tmp_path, [doc([100, 200, 1000]), doc([102, 210, 1010]), doc([101, 205, 990])],
            [doc([80, 150, 1000]), doc([82, 140, 1020]), doc([81, 145, 1000])])
    assert r.returncode == 0, r.stderr
    lines = {l.split("|")[1].strip(): l for l in r.stdout.splitlines() if l.startswith("| P")}
    assert set(lines) == {"PV alibi", "PV soft_cap", "P4 d128"}
    cells = lambda name: [c.strip() for c in lines[name].split("|")[4:8]]
    assert cells("PV alibi") == ["101.0", "81.0", "0.802", "3+3"]
    assert cells("PV soft_cap") == ["205.0", "145.0", "0.707", "3+3"]
    assert cells("P4 d128") == ["1000.0", "1000.0", "1.000", "3+3"]
    assert "3 rows" in r.stdout


def test_a_file_without_gpu_results_is_refused(tmp_path):
    cpu_doc = {"gpu": None, "commit": "abc1234", "cpu_reference": []}
    r = run(tmp_path, [cpu_doc], [doc([1, 2, 3])])
    assert r.returncode != 0
    assert "has no GPU results" in r.stderr
