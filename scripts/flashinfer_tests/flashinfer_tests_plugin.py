"""pytest plugin: runs FlashInfer's own attention tests against flashkv.compat.flashinfer
(issue 43), loaded by scripts/flashinfer-tests.sh with ``-p flashinfer_tests_plugin``.

- Before collection: ``flashkv.compat.install_as_flashinfer()`` (``import flashinfer`` is the
  namespace) and a stand-in for FlashInfer's ``tests.test_helpers.jit_utils``, whose module
  generators feed FlashInfer's JIT warm-up fixtures (flashkv compiles its own kernels: none to
  warm up). FlashInfer's conftest files are not used (the script does not copy them).
- At most FLASHKV_FI_MAX_PER_FUNCTION (default 25) parametrizations per test function, evenly
  spaced over the function's list (deterministic), the rest deselected and counted.
- Each test's outcome: passed; unsupported (it raised NotImplementedError: a feature flashkv or
  the namespace does not implement; the message names it); skipped (FlashInfer's own skip
  conditions); failed (anything else, setup errors included). A file that fails to import
  counts as one collection error.
- FLASHKV_FI_RESULTS: the JSON written at the end: per file the counts, the unsupported
  features with their counts and every failure's first line; ``totals``; FLASHKV_FI_TAG (the
  FlashInfer tag the tests come from) and the device.
"""

import collections
import json
import os
import sys
import types

_results = collections.defaultdict(lambda: collections.Counter())
_unsupported = collections.defaultdict(collections.Counter)
_skips = collections.defaultdict(collections.Counter)
_failures = collections.defaultdict(list)
_collection_errors = {}
_deselected = collections.Counter()
_seen = set()


def _install():
    import flashkv.compat

    flashkv.compat.install_as_flashinfer()
    stub = types.ModuleType("tests.test_helpers.jit_utils")

    def no_modules(*args, **kwargs):
        return []

    for name in ("gen_decode_attention_modules", "gen_prefill_attention_modules",
                 "gen_persistent_batch_attention_modules"):
        setattr(stub, name, no_modules)
    sys.modules["tests.test_helpers.jit_utils"] = stub


def pytest_configure(config):
    _install()


def _file_of(nodeid):
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items):
    cap = int(os.environ.get("FLASHKV_FI_MAX_PER_FUNCTION", "25"))
    groups = collections.OrderedDict()
    for item in items:
        key = (_file_of(item.nodeid), getattr(item, "originalname", item.name))
        groups.setdefault(key, []).append(item)
    keep, drop = [], []
    for (path, _), group in groups.items():
        if cap <= 0 or len(group) <= cap:
            keep += group
            continue
        step = len(group) / cap
        chosen = {int(i * step) for i in range(cap)}
        for i, item in enumerate(group):
            (keep if i in chosen else drop).append(item)
            if i not in chosen:
                _deselected[path] += 1
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def _first_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0][:300] if text.strip() else "?"


def _is_not_implemented(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.lstrip().startswith("NotImplementedError")


_reports = [0]


def pytest_runtest_logreport(report):
    if report.nodeid in _seen:
        return
    _reports[0] += 1
    if _reports[0] % 100 == 0:  # a run stopped by its time limit still leaves its counts
        _write(exitstatus=-1)
    path = _file_of(report.nodeid)
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _seen.add(report.nodeid)
        if report.passed:
            _results[path]["passed"] += 1
        elif report.skipped:
            _results[path]["skipped"] += 1
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else "?"
            _skips[path][str(reason)[:200]] += 1
        elif _is_not_implemented(report):
            _results[path]["unsupported"] += 1
            _unsupported[path][_first_line(report)] += 1
        else:
            _results[path]["failed"] += 1
            _failures[path].append({"test": report.nodeid.split("::", 1)[-1],
                                    "reason": _first_line(report)})


def pytest_collectreport(report):
    if report.failed:
        _collection_errors[_file_of(report.nodeid)] = _first_line(report)


def _device():
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        pass
    return "no GPU"


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
        return
    _write(exitstatus)


def _write(exitstatus):
    """The results JSON (pytest_exit_status -1: written mid-run, the run was not finished)."""
    out = os.environ.get("FLASHKV_FI_RESULTS")
    if not out:
        return
    files = {}
    keys = ("passed", "failed", "unsupported", "skipped")
    for path in sorted(set(_results) | set(_collection_errors) | set(_deselected)):
        entry = {k: _results[path][k] for k in keys}
        entry["deselected"] = _deselected[path]
        if path in _collection_errors:
            entry["collection_error"] = _collection_errors[path]
        if _unsupported[path]:
            entry["unsupported_features"] = dict(_unsupported[path].most_common())
        if _skips[path]:
            entry["skip_reasons"] = dict(_skips[path].most_common(10))
        if _failures[path]:
            entry["failures"] = _failures[path]
        files[path] = entry
    totals = {k: sum(f[k] for f in files.values()) for k in keys + ("deselected",)}
    totals["collection_errors"] = len(_collection_errors)
    doc = {"flashinfer_tag": os.environ.get("FLASHKV_FI_TAG", "?"),
           "flashkv_commit": os.environ.get("FLASHKV_COMMIT", "?"),
           "device": _device(),
           "max_per_function": int(os.environ.get("FLASHKV_FI_MAX_PER_FUNCTION", "25")),
           "pytest_exit_status": int(exitstatus),
           "totals": totals, "files": files}
    with open(out + ".tmp", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(out + ".tmp", out)


# --- FLASHKV_FI_DEVICE=cpu: a smoke mode for machines without a GPU -------------------------
# FlashInfer's tests make their tensors on "cuda"; this maps every such tensor to the host, so
# the namespace's wrappers run flashkv's CPU reference and the tests' own comparisons run: it
# finds API mismatches (arguments, shapes, dtypes, return values) where no GPU is at hand. Its
# counts test the namespace's mapping and the CPU reference, never a GPU kernel: results are the
# GPU run's.


def _cpu_shim():
    import torch

    def host(d):
        if isinstance(d, int) and not isinstance(d, bool):  # a CUDA device index
            return "cpu"
        return "cpu" if d is not None and "cuda" in str(d) else d

    def fix(kwargs):
        if "device" in kwargs:
            kwargs["device"] = host(kwargs["device"])

    for name in ("empty", "zeros", "ones", "randn", "rand", "randint", "arange", "full", "tensor",
                 "empty_like", "zeros_like", "ones_like", "randn_like", "rand_like", "full_like",
                 "as_tensor", "randperm", "linspace", "eye", "empty_strided", "normal"):
        real = getattr(torch, name)

        def wrapped(*args, _real=real, **kwargs):
            fix(kwargs)
            return _real(*args, **kwargs)

        setattr(torch, name, wrapped)
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        fix(kwargs)
        args = tuple(host(a) if isinstance(a, (str, int, torch.device)) else a for a in args)
        return real_to(self, *args, **kwargs)

    torch.Tensor.to = to
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.empty_cache = lambda: None
    real_gen = torch.Generator

    class Generator(real_gen):
        def __new__(cls, device="cpu"):
            return real_gen(device=host(device))

    torch.Generator = Generator


if os.environ.get("FLASHKV_FI_DEVICE") == "cpu":
    _cpu_shim()
