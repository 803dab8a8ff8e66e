"""Host time of the transformers adapter (flashkv.integrations.transformers) per layer call and
per step, without the attention, on the CPU: a 32-layer random Llama (GQA 4, d128) generates
through transformers' continuous batching and the adapter's stats give the host µs per
reused-plan layer call and per plan, by path (decode / prefill = a step with prompt chunks /
ragged = fresh prompts only).

Two depths of stubbing (--mode):
  adapter  the wrappers' run / run_step and the append are stubs, plan() is the real CPU
           reference path: the adapter's own share.
  python   flashkv's GPU-path Python runs too (run / run_step / append with their checks, scale
           arguments, output allocation and DLPack conversions), only the C++ ops (plan, run,
           run_step, append) are stubs: what the adapter plus flashkv's Python cost per layer
           before the launch. Host tensors stand in for CUDA ones, so the current-stream lookup
           and the CUDA allocator are not in it (each ~1 µs).

--replay N (default 100) then replays the first whole step of each path N times and reports the
medians (per reused-plan call, and the planning call): the same code with warm caches, far less
noisy than the generation's means, in which the model's CPU matmuls between the layer calls
evict the caches (on a GPU host they are launches). Host time is this thread's CPU time
(--clock thread, the default: other processes on a shared machine do not count; --clock wall:
perf_counter, as the serving benchmark reads it). Caches (--cache): the model dtype (bfloat16)
or e4m3 (register(kv_cache_dtype="e4m3")). Context (--prompt):
each request's prompt tokens; the per-layer numbers should not move with it (issue 38), the
plan's do (its page table grows with the context). Default: mode python, both caches, prompts
of 40 and 1000 tokens, one line each (one mode per process: run it again with --mode adapter).

    PYTHONPATH=python:build/python python bench/tf_adapter_overhead.py [--mode python]
        [--cache e4m3] [--prompt 1000] [--json out.json]

Needs torch, transformers and psutil; no GPU (NOTES "transformers integration")."""
import argparse
import json
import statistics
import time
import types

import torch

import flashkv
import flashkv._common as fkv_common
import flashkv._eager as fkv_eager
import flashkv.integrations.transformers as fkv_tf
from flashkv.integrations import model_families as mf


class _NoKernel:
    """A planned wrapper whose run() returns q: the adapter's own cost remains."""

    def __init__(self, wrapper):
        self.wrapper = wrapper

    def plan(self, *a, **k):
        return self.wrapper.plan(*a, **k)

    def run(self, q, *a, **k):
        return q

    def run_step(self, q, *a, **k):
        return q


class _NoOp:
    """The C++ op of a GPU plan, stubbed: every call returns at once."""

    def plan(self, *a, **k):
        return None

    run = run_step = plan


class _NoSlot:
    op = _NoOp()

    def acquire(self, need, what):
        return self.op


class _CNoAppend:
    """flashkv._C with the append kernel stubbed (the eager append's only C++ call)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    @staticmethod
    def append_paged_kv_cache(*a, **k):
        return None


_HOOKS = {}
_PAGED_FORWARD = []  # the adapter's own paged_forward, once _install wrapped it
# The adapter's stats clock: this thread's CPU time by default, so that other processes on a
# shared machine do not count (--clock wall: time.perf_counter, as in a serving run).
_CLOCK = [types.SimpleNamespace(perf_counter=time.thread_time)]


def _install(mode):
    """Patch flashkv for `mode` (once per process: the modes' patches are exclusive)."""
    if _HOOKS.get("mode") == mode:
        return
    if _HOOKS:
        raise RuntimeError("one --mode per process")
    _HOOKS["mode"] = mode
    # register() binds impl.paged_forward: the class's, routed to a capture when one is set
    cls = fkv_tf.FlashkvTransformersAttention
    _PAGED_FORWARD.append(cls.paged_forward)

    def paged_forward(self, *a, **k):
        cap = self.__dict__.get("_bench_capture")
        return cap(*a, **k) if cap is not None else _PAGED_FORWARD[0](self, *a, **k)

    cls.paged_forward = paged_forward
    if mode == "python":
        real_side = fkv_common.check_same_side

        def same_side(on_gpu, device, x, name):  # host tensors stand in for CUDA ones
            return real_side(False, device, x, name)

        fkv_common.check_same_side = same_side
        fkv_eager._C = _CNoAppend(fkv_eager._C)


def _stub(impl, mode):
    make = impl._wrapper

    def stub_wrapper(gs, kind, device, layout="NHD"):
        fresh = kind not in gs.wrappers
        w = make(gs, kind, device, layout)
        if fresh and mode == "adapter":
            w = gs.wrappers[kind] = _NoKernel(w)
        elif fresh:  # flashkv's GPU path over a stubbed C++ op
            w._on_gpu, w._slot = True, _NoSlot()
        return w

    impl._wrapper = stub_wrapper
    if mode == "adapter":
        impl.backend.append = lambda *a, **k: None


class _StepCapture:
    """Keeps, per path, the layer calls of the first whole step of that path, with the step's
    metadata (cu_seq_lens, read / write indices) cloned at the time (the engine refills its
    buffers in place), shared by the step's layers as the engine shares them."""

    def __init__(self, impl, layers):
        self.impl, self.layers, self.steps, self._cur, self._map = impl, layers, {}, [], {}
        self.forward = _PAGED_FORWARD[0].__get__(impl)

    def _clone(self, x):
        key = id(x)
        if key not in self._map:
            if isinstance(x, torch.Tensor):
                c = x.clone()
            elif isinstance(x, list):
                c = [self._clone(t) for t in x]
            elif isinstance(x, dict):
                c = {k: self._clone(t) for k, t in x.items()}
            else:
                c = x
            self._map[key] = (x, c)
        return self._map[key][1]

    def __call__(self, module, *a, **k):
        before = dict(self.impl.stats.paths)
        out = self.forward(module, *a, **k)
        if module.layer_idx == 0:
            self._cur, self._map = [], {}
        meta = ("cu_seq_lens_q", "cu_seq_lens_k", "read_index", "write_index")
        self._cur.append((module, a, {n: (self._clone(v) if n in meta else v)
                                      for n, v in k.items()}))
        path = next(p for p, n in self.impl.stats.paths.items() if n != before.get(p, 0))
        if module.layer_idx == self.layers - 1 and path not in self.steps:
            self.steps[path] = self._cur
        return out


def replay(impl, steps, iters):
    """Each captured step `iters` times (its first layer replans: a layer asking twice is a new
    step): median host µs of a reused-plan call and of the planning call, per path, with warm
    caches (no model work between the calls)."""
    clock = _CLOCK[0].perf_counter
    fwd = _PAGED_FORWARD[0].__get__(impl)
    res = {}
    for path, calls in steps.items():
        reuse, plans = [], []
        for _ in range(iters):
            for i, (m, a, k) in enumerate(calls):
                t0 = clock()
                fwd(m, *a, **k)
                (plans if i == 0 else reuse).append(clock() - t0)
        res[path] = (1e6 * statistics.median(reuse), 1e6 * statistics.median(plans))
    return res


def measure(mode, cache, prompt, requests, new_tokens, layers=32, dtype=torch.bfloat16,
            replays=0):
    _install(mode)
    fkv_tf.time = _CLOCK[0]
    name = f"fkvo{len(fkv_tf._REGISTERED)}"
    impl = fkv_tf.register(name, kv_cache_dtype=None if cache == "model" else cache)
    _stub(impl, mode)
    capture = None
    if replays:
        capture = impl._bench_capture = _StepCapture(impl, layers)
    model = mf.build_model("llama", f"paged|{name}", dtype, "cpu", layers=layers)
    block = 16
    blocks = requests * ((prompt + new_tokens) // block + 2) + 16
    t0 = time.perf_counter()
    mf.generate_cb(model, mf.prompts_for(256, [prompt] * requests, seed=1), new_tokens,
                   block_size=block, num_blocks=blocks, max_batch_tokens=256)
    st = impl.stats
    row = dict(mode=mode, cache=cache, prompt=prompt, requests=requests, new_tokens=new_tokens,
               calls=st.calls, plans=st.plans, reused_call_us=round(st.per_call_us(), 1),
               plan_us=round(1e6 * st.plan_s / max(st.plans, 1), 1),
               wall_s=round(time.perf_counter() - t0, 1))
    for path in sorted(st.paths):
        row[f"{path}_call_us"] = round(st.per_call_us(path), 1)
        row[f"{path}_plan_us"] = round(st.plan_us(path), 1)
        row[f"{path}_calls"] = st.paths[path]
    if capture is not None:
        del impl._bench_capture
        for path, (call_us, plan_us) in replay(impl, capture.steps, replays).items():
            row[f"{path}_replay_call_us"] = round(call_us, 1)
            row[f"{path}_replay_plan_us"] = round(plan_us, 1)
    return row


def fmt(r):
    def one(p):
        rep = ("" if p + "_replay_call_us" not in r else
               f" (replayed: {r[p + '_replay_call_us']:.0f} / {r[p + '_replay_plan_us']:.0f})")
        return f"{p}: call {r[p + '_call_us']:.0f} / plan {r[p + '_plan_us']:.0f}{rep}"

    paths = " ".join(one(p) for p in ("decode", "prefill", "ragged") if p + "_calls" in r)
    return (f"{r['mode']:7s} {r['cache']:5s} prompt {r['prompt']:5d}: {r['calls']} layer calls, "
            f"{r['plans']} plans: {r['reused_call_us']:.0f} µs per reused-plan call, "
            f"{r['plan_us']:.0f} µs per plan | {paths}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("adapter", "python"), nargs="*")
    p.add_argument("--cache", choices=("model", "e4m3"), nargs="*")
    p.add_argument("--prompt", type=int, nargs="*")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=30)
    p.add_argument("--replay", type=int, default=100, metavar="N",
                   help="replay one step of each path N times (0: no replay)")
    p.add_argument("--clock", choices=("thread", "wall"), default="thread")
    p.add_argument("--json")
    args = p.parse_args()
    if args.clock == "wall":
        _CLOCK[0] = time
    rows = []
    modes = args.mode or ["python"]
    if len(modes) > 1:
        raise SystemExit("one --mode per process (the patches are exclusive)")
    for cache in args.cache or ["model", "e4m3"]:
        for prompt in args.prompt or [40, 1000]:
            r = measure(modes[0], cache, prompt, args.requests, args.new_tokens,
                        replays=args.replay)
            print(fmt(r), flush=True)
            rows.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(flashkv=flashkv.__version__, torch=torch.__version__, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
