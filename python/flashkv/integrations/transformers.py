"""flashkv as the attention backend of Hugging Face transformers.

::

    import flashkv.integrations.transformers as fkv_tf
    fkv_tf.register()                                   # "paged|fkv" and "fkv"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="paged|fkv")
    outputs = model.generate_batch(prompts, generation_config)   # continuous batching

The names are ``fkv``, not ``flashkv``: transformers 5 takes every implementation name that
contains "flash" for FlashAttention and tries to load a flash-attn kernel for it.

``"paged|fkv"`` serves the continuous-batching manager (``generate_batch()``, ``init_continuous_
batching()``, ``transformers serve``): its paged cache, one ``[(num_blocks + 2) * block_size, H_kv,
D]`` tensor per layer, is viewed as flashkv pages of ``block_size`` tokens (NHD), without a copy.
Per step and layer group (full attention, sliding window) the adapter plans once, on the group's
first layer, and reuses the plan for the others (``_step.StepTracker`` says when a call belongs to
the planned step; a wrong reuse is impossible by construction, see there). Steps where every
request has one query token run batch decode (flashkv's tensor-core GQA path with split-KV); steps
with prompt chunks run paged prefill with ragged queries; steps with no cached KV at all (fresh
prompts) run ragged prefill over the step's own K/V. New K/V go into the cache with flashkv's
append (the fp8 option quantizes there; in decode steps fused with the attention into one launch,
``run_step``) where the page table is known, else with the engine's own write (its write index). Sliding-window groups keep the engine's ring buffer: their page table is
the engine's per-token read index (pages of one token); a chunk that would overwrite a slot it
still reads (kv_len > window) is the one case served from the engine's gathered copy.

``"fkv"`` serves ``model.generate()`` / ``model(...)`` over transformers' dynamic and static
caches (``[B, H_kv, S, D]`` per layer: B pages of S tokens, HND), padding masks as flashkv custom
masks.

Variants from the model's attention call: ``scaling``, ``sliding_window`` (``window_left =
sliding_window - 1``), ``softcap`` (Gemma-2), ``s_aux`` (gpt-oss sinks). head_dim 64, 128, 256.
CUDA graphs: transformers captures the whole forward, with the plan inside it, so a replay
would reuse a stale plan: the adapter refuses capture with a clear error (transformers turns its
graphs off for non-flash implementations unless asked). Tested with transformers 5.17.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from . import _step
from ._backends import AttentionBackend

TESTED_VERSIONS = "5.10 <= transformers < 6 (tested: 5.17.0)"
SUPPORTED_HEAD_DIMS = (64, 128, 256)
DEFAULT_WORKSPACE_BYTES = 128 << 20
# Not "flashkv": transformers takes any implementation name containing "flash" for FlashAttention.
DEFAULT_NAME = "fkv"

_FP8_NAMES = {"float8_e4m3fn": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
              "float8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2"}


_TORCH = []


def _torch():
    # Imported at first use (flashkv never imports torch itself), then one list lookup per call.
    if not _TORCH:
        import torch

        _TORCH.append(torch)
    return _TORCH[0]


def check_transformers_version(version: str) -> None:
    """Raise ImportError unless ``version`` is a transformers release this adapter knows."""
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        raise ImportError(f"transformers {version}: cannot read the version; this adapter "
                          f"supports {TESTED_VERSIONS}") from None
    if not (major == 5 and minor >= 10):
        raise ImportError(f"transformers {version} is not supported by "
                          f"flashkv.integrations.transformers: expected {TESTED_VERSIONS} (its "
                          "paged-attention call signature and PagedAttentionCache layout)")


def _check_engine_interfaces():
    """The parts of transformers this adapter relies on, checked at registration."""
    import transformers

    check_transformers_version(transformers.__version__)
    from transformers import AttentionInterface
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    for attr in ("update", "__init__"):
        if not hasattr(PagedAttentionCache, attr):
            raise ImportError(f"transformers {transformers.__version__}: PagedAttentionCache has "
                              f"no {attr!r}; expected {TESTED_VERSIONS}")
    return AttentionInterface, AttentionMaskInterface, flash_attention_mask, PagedAttentionCache


def _check_paged_layout(k_cache, v_cache, block_size, num_kv_heads, head_dim):
    """The engine's per-layer cache must be ``[blocks * block_size, H_kv, D]`` and contiguous to
    be viewed as pages without a copy."""
    for name, t in (("key_cache", k_cache), ("value_cache", v_cache)):
        if (t.dim() != 3 or tuple(t.shape[1:]) != (num_kv_heads, head_dim)
                or t.shape[0] % block_size or not t.is_contiguous()):
            raise ValueError(
                f"{name}: expected a contiguous [blocks * {block_size}, {num_kv_heads}, "
                f"{head_dim}] tensor (the engine's paged layout, viewed as pages without a copy), "
                f"got shape {tuple(t.shape)} strides {tuple(t.stride())}")


@dataclass
class AdapterStats:
    """Host time of the adapter (perf_counter, seconds) and how often it planned."""

    calls: int = 0  # attention calls (layers x steps)
    plans: int = 0  # plans made (steps x layer groups, plus replans)
    plan_s: float = 0.0  # host time inside steps that planned (page tables, D2H of lengths, plan)
    call_s: float = 0.0  # host time of all calls, plans included
    paths: dict = field(default_factory=dict)  # calls per path: decode / prefill / ragged / gather
    groups: set = field(default_factory=set)  # the engine's layer groups planned (paged form)
    # Per path: [calls, plans, host s of all its calls, host s of its planning calls' plans].
    by_path: dict = field(default_factory=dict)

    def per_call_us(self, path=None) -> float:
        """Host microseconds per reused-plan call (the per-layer overhead), of all calls or of
        one path's."""
        if path is None:
            calls, plans, call_s, plan_s = self.calls, self.plans, self.call_s, self.plan_s
        else:
            calls, plans, call_s, plan_s = self.by_path.get(path, (0, 0, 0.0, 0.0))
        reuse = calls - plans
        return 1e6 * (call_s - plan_s) / reuse if reuse > 0 else 0.0

    def plan_us(self, path=None) -> float:
        """Host microseconds per plan (the planning layer's call up to its run), all or one
        path's."""
        plans, plan_s = ((self.plans, self.plan_s) if path is None
                         else self.by_path.get(path, (0, 0, 0.0, 0.0))[1::2])
        return 1e6 * plan_s / plans if plans else 0.0

    def record(self, path, t_call, t_plan=None):
        """One call of `path` that took t_call s, t_plan of them planning (None: reused)."""
        self.calls += 1
        self.call_s += t_call
        self.paths[path] = self.paths.get(path, 0) + 1
        rec = self.by_path.get(path)
        if rec is None:
            rec = self.by_path[path] = [0, 0, 0.0, 0.0]
        rec[0] += 1
        rec[2] += t_call
        if t_plan is not None:
            self.plans += 1
            self.plan_s += t_plan
            rec[1] += 1
            rec[3] += t_plan

    def reset(self):
        self.__init__()


class _GroupStep:
    """One layer group's plan for the current step."""

    def __init__(self):
        self.tracker = _step.StepTracker()
        self.wrappers = {}  # kind -> planned wrapper (workspace owned here)
        self.path = None
        self.table = None
        self.dev = {}  # device arrays of the step: kv_indices, kv_indptr, last, batch_idx, pos
        self.sinks = None  # float32 [H] scratch the plan points at; each layer copies its own
        self.checked_layouts = set()  # data_ptr of the layers' key caches checked viewable
        self.pages = {}  # data_ptr of a layer's key cache -> its (k, v) page views


class FlashkvTransformersAttention:
    """The attention functions registered with transformers, and their per-cache state."""

    def __init__(self, backend="flashkv", kv_cache_dtype=None, k_scale=1.0, v_scale=1.0,
                 workspace_bytes=DEFAULT_WORKSPACE_BYTES):
        self.backend = AttentionBackend(backend)
        if kv_cache_dtype is not None and kv_cache_dtype not in _FP8_NAMES:
            raise ValueError(f"kv_cache_dtype: expected None (the model's dtype) or one of "
                             f"{sorted(_FP8_NAMES)}, got {kv_cache_dtype!r}")
        if kv_cache_dtype is not None and backend != "flashkv":
            raise NotImplementedError("kv_cache_dtype: an fp8 cache is implemented for "
                                      "backend='flashkv' only")
        self.kv_cache_dtype = None if kv_cache_dtype is None else _FP8_NAMES[kv_cache_dtype]
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        if self.kv_cache_dtype is None and (self.k_scale != 1.0 or self.v_scale != 1.0):
            raise ValueError("k_scale / v_scale: only an fp8 cache (kv_cache_dtype) takes scales")
        self.workspace_bytes = int(workspace_bytes)
        # run() / append keywords: an fp8 cache's scales, nothing for a 16-bit one.
        self._scales = ({} if self.kv_cache_dtype is None else
                        dict(k_scale=self.k_scale, v_scale=self.v_scale))
        self.stats = AdapterStats()
        # Per engine cache: {layer group: _GroupStep}. Weak: a stopped manager's cache (GBs) and
        # the plans over it go when the engine drops it.
        self._per_cache = weakref.WeakKeyDictionary()
        # The last cache seen and its groups (one weak dictionary lookup per step, not per
        # layer); cleared when that cache goes, so it keeps nothing alive.
        self._last = ()
        self._plain = {}  # variant key -> _GroupStep for the plain (non-paged) form

    # ------------------------------------------------------------------ shared checks
    def _check_module(self, module, query, key):
        torch = _torch()
        # query.is_cuda first: torch.cuda.is_available() reads the environment on every call.
        if query.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "flashkv attention inside a CUDA graph capture: transformers captures the whole "
                "forward, plan included, so replays would reuse a stale plan. Turn the engine's "
                "graphs off (ContinuousBatchingConfig(use_cuda_graph=False), the default for "
                "non-flash implementations)")
        head_dim = int(query.shape[-1])
        if head_dim not in SUPPORTED_HEAD_DIMS or int(key.shape[-1]) != head_dim:
            raise ValueError(f"head_dim: flashkv serves {SUPPORTED_HEAD_DIMS} with equal query "
                             f"and value dims, got q {head_dim}, k/v {int(key.shape[-1])} (layer "
                             f"{getattr(module, 'layer_idx', '?')})")
        if query.dtype not in (torch.float16, torch.bfloat16) and query.is_cuda:
            raise TypeError(f"query dtype: expected torch.float16 or torch.bfloat16 on the GPU, "
                            f"got {query.dtype}")

    def _variant(self, module, scaling, sliding_window, softcap, s_aux, num_qo_heads):
        scale = scaling if scaling is not None else getattr(module, "scaling", None)
        scale = None if scale is None else float(scale)
        window_left = -1 if not sliding_window else int(sliding_window) - 1
        cap = float(softcap) if softcap else None
        sinks = None
        if s_aux is not None:
            if int(s_aux.numel()) != num_qo_heads:
                raise ValueError(f"s_aux: expected {num_qo_heads} sinks (one per query head), got "
                                 f"{int(s_aux.numel())}")
            self.backend.variant_kwargs(s_aux)  # refuses backends without sinks
            sinks = s_aux
        return scale, window_left, cap, sinks

    def _wrapper(self, gs, kind, device, layout="NHD"):
        """The group's wrapper of ``kind`` (decode / paged / ragged), made at first use over a
        workspace of its own (plans of one step live side by side)."""
        w = gs.wrappers.get(kind)
        if w is None:
            torch = _torch()
            if device.type == "cuda":
                ws = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
            else:  # the CPU reference backend (tests): a host buffer
                if self.backend.name != "flashkv":
                    raise RuntimeError(f"backend {self.backend.name!r}: CUDA tensors only")
                ws = torch.empty(1 << 20, dtype=torch.uint8)
            make = {"decode": self.backend.decode, "paged": self.backend.prefill_paged,
                    "ragged": self.backend.prefill_ragged}[kind]
            w = gs.wrappers[kind] = make(ws, layout)
        return w

    def _sinks_buffer(self, gs, sinks, device):
        torch = _torch()
        if sinks is None:
            return None
        if gs.sinks is None or gs.sinks.numel() != sinks.numel() or gs.sinks.device != device:
            gs.sinks = torch.empty(sinks.numel(), dtype=torch.float32, device=device)
        return gs.sinks

    # ------------------------------------------------------------------ paged (continuous batching)
    def _groups_of(self, cache):
        """The cache's layer-group plans; at first sight its tensors become fp8 when asked."""
        groups = self._per_cache.get(cache)
        if groups is None:
            if self.kv_cache_dtype is not None:
                self._make_fp8(cache, getattr(_torch(), self.kv_cache_dtype))
            groups = self._per_cache[cache] = {}
        return groups

    def _groups_fast(self, cache):
        last = self._last
        if last and last[0]() is cache:
            return last[1]
        groups = self._groups_of(cache)
        self._last = (weakref.ref(cache, self._drop_last), groups)
        return groups

    def _drop_last(self, ref):
        if self._last and self._last[0] is ref:
            self._last = ()

    def layer_groups(self, cache):
        """The layer groups planned so far over ``cache`` (tests, diagnostics)."""
        return sorted(self._per_cache.get(cache, {}))

    def _make_fp8(self, cache, dtype):
        if getattr(cache, "num_sliding_attention_groups", 0):
            raise NotImplementedError(
                "kv_cache_dtype: an fp8 cache is implemented for models with full attention in "
                "every layer (the sliding-window ring buffer is written by the engine in its own "
                "dtype)")
        torch = _torch()
        for lst in (cache.key_cache, cache.value_cache):
            for i, t in enumerate(lst):
                # The engine's read-trash block is zeros; fp8 zeros are zero bytes.
                lst[i] = torch.zeros(t.shape, dtype=dtype, device=t.device)
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    def paged_forward(self, module, query, key, value, attention_mask, scaling=None,
                      dropout=0.0, sliding_window=None, softcap=None, s_aux=None, cache=None,
                      cu_seq_lens_q=None, cu_seq_lens_k=None, read_index=None, write_index=None,
                      block_table=None, **kwargs):
        t0 = time.perf_counter()
        if cache is None or read_index is None or write_index is None or cu_seq_lens_q is None:
            raise ValueError(
                "paged|fkv was called without transformers' paged-attention arguments (cache, "
                "cu_seq_lens_q/k, read_index, write_index): it serves the continuous-batching "
                "manager; use attn_implementation='fkv' for model.generate()")
        if block_table is not None:
            raise NotImplementedError("block_table (transformers' flash decode fast path): "
                                      "paged|fkv plans from read_index; leave "
                                      "max_blocks_per_request at 0")
        self._check_module(module, query, key)
        if dropout:
            raise NotImplementedError("dropout: flashkv serves inference (dropout 0)")
        torch = _torch()
        layer = int(module.layer_idx)
        group, layer_in_group = cache.layer_index_to_group_indices[layer]
        window = int(cache.sliding_windows[layer])
        sliding = window != 1
        layer_type = "sliding_attention" if sliding else "full_attention"
        if isinstance(cu_seq_lens_k, dict):
            cu_seq_lens_k = cu_seq_lens_k[layer_type]
        num_qo_heads, num_kv_heads, head_dim = (int(query.shape[1]), int(key.shape[1]),
                                                int(query.shape[-1]))
        scale, window_left, cap, sinks = self._variant(
            module, scaling, sliding_window if sliding else None, softcap, s_aux, num_qo_heads)
        if sliding and window_left != window - 1:
            raise ValueError(f"sliding_window: the layer says {window_left + 1}, the cache "
                             f"{window} (layer {layer})")
        groups = self._groups_fast(cache)
        gs = groups.get(group)
        if gs is None:
            gs = groups[group] = _GroupStep()
        k_cache, v_cache = cache.key_cache[layer_in_group], cache.value_cache[layer_in_group]
        k_ptr = k_cache.data_ptr()
        if k_ptr not in gs.checked_layouts:  # once per layer's cache tensors
            _check_paged_layout(k_cache, v_cache, int(cache.block_size), num_kv_heads, head_dim)
            gs.checked_layouts.add(k_ptr)
        rindex, windex = read_index[group], write_index[group]
        signature = (num_qo_heads, num_kv_heads, head_dim, query.dtype, scale, window_left, cap,
                     sinks is not None)
        objects = (cu_seq_lens_q, cu_seq_lens_k, rindex, windex, read_index, write_index)
        planned = gs.tracker.is_same_step(layer, objects, signature)
        t_plan = None
        if not planned:
            self._plan_paged(gs, query, k_cache, cache, cu_seq_lens_q, cu_seq_lens_k, rindex,
                             windex, window if sliding else 0, num_qo_heads, num_kv_heads,
                             head_dim, scale, window_left, cap, sinks)
            gs.tracker.new_step(layer, objects, signature)
            self.stats.groups.add(group)
            t_plan = time.perf_counter() - t0
        out = self._run_paged(gs, query, key, value, k_cache, v_cache, k_ptr, cache, windex,
                              sinks, module, read_index, write_index)
        self.stats.record(gs.path, time.perf_counter() - t0, t_plan)
        return out, None

    def _plan_paged(self, gs, query, k_cache, cache, cu_q, cu_k, rindex, windex, window,
                    num_qo_heads, num_kv_heads, head_dim, scale, window_left, cap, sinks):
        torch = _torch()
        device = query.device
        # One D2H copy of the step's lengths (the engine keeps them on the device only): both
        # arrays in one transfer (each copy waits for the device).
        n_q = int(cu_q.numel())
        both = torch.cat((cu_q.reshape(-1), cu_k.reshape(-1))).to("cpu", torch.int64).numpy()
        cu_q_h, cu_k_h = both[:n_q], both[n_q:]
        n_reads = int(rindex.numel())
        sinks_buf = self._sinks_buffer(gs, sinks, device)
        extra = self.backend.variant_kwargs(sinks_buf)
        common = dict(sm_scale=scale, window_left=window_left, logits_soft_cap=cap,
                      q_data_type=query.dtype, kv_data_type=k_cache.dtype, **extra)
        i32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
        gs.dev = {}
        if n_reads == 0:
            # Fresh prompts only: attention over the step's own K/V, which the engine's write
            # index puts into the cache.
            table = _step.step_page_table(cu_q_h, cu_q_h, 1)
            gs.path, gs.table = "ragged", table
            w = self._wrapper(gs, "ragged", device)
            w.plan(i32(table.qo_indptr), i32(table.qo_indptr), num_qo_heads, num_kv_heads,
                   head_dim, causal=True, **{**common, "kv_data_type": query.dtype})
            return
        if window and not _step.sliding_reads_survive_writes(cu_q_h, cu_k_h, window):
            # A chunk longer than the ring's free slots: the engine's gather (its read, then its
            # write) is the only order that keeps the old keys; ragged prefill over that copy.
            gs.path = "gather"
            gs.table = _step.step_page_table(cu_q_h, cu_k_h, 1)
            w = self._wrapper(gs, "ragged", device)
            w.plan(i32(gs.table.qo_indptr), i32(cu_k_h), num_qo_heads, num_kv_heads, head_dim,
                   causal=True, **common)
            return
        page_size = 1 if window else int(cache.block_size)
        table = _step.step_page_table(cu_q_h, cu_k_h, page_size)
        gs.table = table
        if window:
            # The ring's read index with the new tokens' slots (the sentinels) filled in from the
            # write index: the engine writes first (safe: checked above), then flashkv reads.
            idx = rindex.clone()
            idx.masked_scatter_(rindex == int(cache.sentinel_index),
                                windex[: table.num_q_tokens])
            kv_indices = idx.to(torch.int32)
        else:
            # The page starts and, where the step appends with flashkv's append (not decode
            # steps on flashkv: run_step appends), the append's arrays: one H2D copy of them
            # all (int32), viewed per array on the device.
            parts = [table.page_starts.astype(np.int32)]
            appends = page_size > 1 and not (table.decode_only and self.backend.name == "flashkv")
            if appends:
                qo_lens = table.qo_lens
                bi = np.repeat(np.arange(table.batch, dtype=np.int32), qo_lens)
                pos = (np.arange(table.num_q_tokens)
                       - np.repeat(table.qo_indptr[:-1], qo_lens)
                       + np.repeat(table.kv_lens - qo_lens, qo_lens))
                parts += [bi, pos, table.kv_indptr, table.last_page_len]
            host = np.concatenate(parts).astype(np.int32, copy=False)
            dev = torch.from_numpy(host).to(device, non_blocking=True)
            gs.dev["host"] = host  # alive until the next plan (the copy reads it)
            views, at = [], 0
            for a in parts:
                views.append(dev[at:at + a.shape[0]])
                at += a.shape[0]
            kv_indices = (rindex.index_select(0, views[0]) // page_size).to(torch.int32)
            if appends:
                gs.dev.update(batch_idx=views[1], positions=views[2], kv_indptr=views[3],
                              last=views[4])
        gs.dev["kv_indices"] = kv_indices
        if table.decode_only:
            gs.path = "decode"
            w = self._wrapper(gs, "decode", device)
            w.plan(i32(table.kv_indptr), kv_indices, i32(table.last_page_len), num_qo_heads,
                   num_kv_heads, head_dim, page_size, **common)
        else:
            gs.path = "prefill"
            w = self._wrapper(gs, "paged", device)
            w.plan(i32(table.qo_indptr), i32(table.kv_indptr), kv_indices,
                   i32(table.last_page_len), num_qo_heads, num_kv_heads, head_dim, page_size,
                   causal=True, **common)

    def _run_paged(self, gs, query, key, value, k_cache, v_cache, k_ptr, cache, windex, sinks,
                   module, read_index, write_index):
        torch = _torch()
        table = gs.table
        n = table.num_q_tokens
        # [T, H, D] views of the engine's [1, H, T, D] transposes of its projections (select:
        # what [0] does, without the indexing parser)
        q = query.select(0, 0).transpose(0, 1)
        k_all, v_all = key.select(0, 0).transpose(0, 1), value.select(0, 0).transpose(0, 1)
        if gs.sinks is not None:
            gs.sinks.copy_(sinks.reshape(-1))  # this layer's sinks, read when the kernel runs
        if not q.is_contiguous():
            q = q.contiguous()
        padded = n != q.shape[0]  # static shapes pad the query rows; else no slicing (views cost)
        q_all = q
        k_new, v_new = k_all, v_all
        if padded:
            q, k_new, v_new = q[:n], k_all[:n], v_all[:n]
        path = gs.path
        if path == "gather":
            kg, vg = cache.update(key, value, module.layer_idx, read_index, write_index)
            out = gs.wrappers["ragged"].run(q, kg, vg)
        elif path == "ragged":
            # The engine's write takes every row (its write index has trash slots for padding).
            self._write_kv_engine(k_cache, v_cache, windex, k_all, v_all)
            out = gs.wrappers["ragged"].run(q, k_new.contiguous(), v_new.contiguous())
        else:
            ps = table.page_size
            pages = gs.pages.get(k_ptr)
            if pages is None or pages[0].shape[1] != ps:  # the layer's cache as pages: views, once
                hkv, d = k_cache.shape[-2], k_cache.shape[-1]
                pages = (k_cache.view(-1, ps, hkv, d), v_cache.view(-1, ps, hkv, d))
                gs.pages[k_ptr] = pages
            kind = "decode" if path == "decode" else "paged"
            w = gs.wrappers[kind]
            scales = self._scales
            if ps > 1 and kind == "decode" and self.backend.name == "flashkv":
                # flashkv's fused decode step: the append of every request's new token and the
                # attention over the updated pages in one launch.
                out = w.run_step(q, k_new, v_new, pages, **scales)
            else:
                if ps == 1:
                    self._write_kv_engine(k_cache, v_cache, windex, k_all, v_all)
                else:
                    dv = gs.dev
                    self.backend.append(k_new, v_new, dv["batch_idx"], dv["positions"], pages,
                                        dv["kv_indices"], dv["kv_indptr"], dv["last"], **scales)
                out = w.run(q, pages, **scales)
        if padded:  # padded query rows: zeros, ignored by the engine
            full = torch.zeros_like(q_all)
            full[:n] = out
            out = full
        return out

    def _write_kv_engine(self, k_cache, v_cache, windex, k_new, v_new):
        """The engine's own write (its write index, trash slots for padding included); into an
        fp8 cache quantized first, and copied as bytes (torch has no fp8 index_copy_)."""
        torch = _torch()
        for dst, src, scale in ((k_cache, k_new, self.k_scale), (v_cache, v_new, self.v_scale)):
            if dst.dtype != src.dtype:
                # float(x) / scale rounded to the fp8 type; at scale 1 the cast alone (torch
                # converts 16-bit floats to fp8 through float32: the same bits, one kernel)
                src = (src.float() / scale).to(dst.dtype) if scale != 1.0 else src.to(dst.dtype)
                dst, src = dst.view(torch.uint8), src.view(torch.uint8)
            dst.index_copy_(0, windex, src)

    # ------------------------------------------------------------------ plain (generate())
    def plain_forward(self, module, query, key, value, attention_mask, scaling=None,
                      dropout=0.0, sliding_window=None, softcap=None, s_aux=None, **kwargs):
        t0 = time.perf_counter()
        if kwargs.get("cache") is not None:
            raise ValueError("attn_implementation='fkv' got a paged cache: use "
                             "'paged|fkv' with continuous batching")
        if dropout:
            raise NotImplementedError("dropout: flashkv serves inference (dropout 0)")
        self._check_module(module, query, key)
        torch = _torch()
        b, h, sq, d = (int(x) for x in query.shape)
        hkv, skv = int(key.shape[1]), int(key.shape[2])
        if key.stride() != (hkv * skv * d, skv * d, d, 1) or value.stride() != key.stride():
            raise ValueError(
                f"key/value: expected contiguous [batch, kv_heads, seq, head_dim] caches (viewed as "
                f"{b} pages of {skv} tokens without a copy), got strides {tuple(key.stride())} / "
                f"{tuple(value.stride())}")
        scale, window_left, cap, sinks = self._variant(module, scaling, sliding_window, softcap,
                                                       s_aux, h)
        mask = attention_mask
        if mask is not None and mask.dim() != 2:
            raise ValueError(f"attention_mask: expected None or the 2D padding mask transformers "
                             f"builds for 'fkv' (registered mask function), got "
                             f"{mask.dim()}D")
        vkey = (window_left, cap, sinks is not None)
        gs = self._plain.get(vkey)
        if gs is None:
            gs = self._plain[vkey] = _GroupStep()
        signature = (b, h, hkv, sq, skv, d, query.dtype, key.dtype, scale) + vkey
        objects = (mask,) if mask is not None else ()
        layer = int(getattr(module, "layer_idx", 0))
        t_plan = None
        if not gs.tracker.is_same_step(layer, objects, signature):
            self._plan_plain(gs, query, key, mask, b, h, hkv, sq, skv, d, scale, window_left,
                             cap, sinks)
            gs.tracker.new_step(layer, objects, signature)
            t_plan = time.perf_counter() - t0
        if gs.sinks is not None:
            gs.sinks.copy_(sinks.reshape(-1))
        q = query.transpose(1, 2).reshape(b * sq, h, d)  # a view where the projection allows
        pages = (key, value)  # HND pages [B, H_kv, S, D]: page b is batch row b
        out = gs.wrappers[gs.path].run(q, pages)
        self.stats.record(gs.path, time.perf_counter() - t0, t_plan)
        return out.view(b, sq, h, d), None

    def _plan_plain(self, gs, query, key, mask, b, h, hkv, sq, skv, d, scale, window_left, cap,
                    sinks):
        torch = _torch()
        device = query.device
        sinks_buf = self._sinks_buffer(gs, sinks, device)
        common = dict(sm_scale=scale, window_left=window_left, logits_soft_cap=cap,
                      q_data_type=query.dtype, kv_data_type=key.dtype,
                      **self.backend.variant_kwargs(sinks_buf))
        kv_indptr = torch.arange(b + 1, dtype=torch.int32)
        indices = torch.arange(b, dtype=torch.int32, device=device)
        last = torch.full((b,), skv, dtype=torch.int32)
        # The decode wrapper is FlashInfer's paged layout; plain caches are HND.
        if mask is None and sq == 1:
            gs.path = "decode"
            w = self._wrapper(gs, "decode", device, "HND")
            w.plan(kv_indptr, indices, last, h, hkv, d, skv, **common)
            return
        gs.path = "paged"
        w = self._wrapper(gs, "paged", device, "HND")
        qo_indptr = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32)
        if mask is None:
            w.plan(qo_indptr, kv_indptr, indices, last, h, hkv, d, skv, causal=True, **common)
            return
        if int(mask.shape[1]) != skv:
            raise ValueError(f"attention_mask: expected {skv} key positions, got "
                             f"{int(mask.shape[1])}")
        # Causal (aligned to the end of the KV) and the padding mask, per request, flattened.
        i = torch.arange(sq, device=mask.device)[:, None]
        j = torch.arange(skv, device=mask.device)[None, :]
        causal = j <= i + (skv - sq)
        custom = (causal[None] & mask.bool()[:, None, :]).reshape(-1)
        w.plan(qo_indptr, kv_indptr, indices, last, h, hkv, d, skv, custom_mask=custom,
               **common)


_REGISTERED = {}


def register(name: str = DEFAULT_NAME, *, backend: str = "flashkv", kv_cache_dtype=None,
             k_scale: float = 1.0, v_scale: float = 1.0,
             workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> FlashkvTransformersAttention:
    """Register ``"paged|<name>"`` (continuous batching) and ``"<name>"`` (generate() over
    transformers' own caches) with transformers' ``AttentionInterface``, and ``"<name>"``'s mask
    function (the 2D padding mask, as FlashAttention's) with ``AttentionMaskInterface``.

    Parameters
    ----------
    name : str
        The implementation name models are loaded with (``attn_implementation="paged|fkv"``);
        it may not contain "flash" (see the module docstring).
    backend : str
        ``"flashkv"``, or ``"flashinfer"`` (the same adapter over FlashInfer's wrappers: the
        engine-on-FlashInfer comparison of the paper).
    kv_cache_dtype : str, optional
        ``"float8_e4m3fn"`` / ``"float8_e5m2"``: the adapter owns the paged cache's dtype and
        swaps each layer's cache tensors to fp8 at first use (models with full attention in every
        layer). None keeps the engine's dtype.
    k_scale, v_scale : float
        The fp8 cache's dequantization scales (stored = real / scale).
    workspace_bytes : int
        Device workspace per (layer group, wrapper kind).

    Returns
    -------
    FlashkvTransformersAttention
        The registered functions' state: ``.stats`` holds host timings and plan counts.

    Raises ImportError for a transformers version outside ``TESTED_VERSIONS``.
    """
    attention_interface, mask_interface, flash_mask, _ = _check_engine_interfaces()
    if "|" in name or not name:
        raise ValueError(f"name: expected a plain implementation name, got {name!r}")
    if "flash" in name:
        raise ValueError(
            f"name: {name!r} contains 'flash', and transformers treats every implementation whose "
            "name contains 'flash' as FlashAttention (utils.generic.is_flash_attention_requested) "
            "and tries to load a flash-attn kernel for it; pick another name (default 'fkv')")
    impl = FlashkvTransformersAttention(backend=backend, kv_cache_dtype=kv_cache_dtype,
                                        k_scale=k_scale, v_scale=v_scale,
                                        workspace_bytes=workspace_bytes)
    # Outside torch.compile's graphs: plan() reads host arrays (as transformers' own flash
    # decode path, which it also keeps out of the graph).
    disable = _torch().compiler.disable
    attention_interface.register(f"paged|{name}", disable(impl.paged_forward))
    attention_interface.register(name, disable(impl.plain_forward))
    mask_interface.register(name, flash_mask)
    _REGISTERED[name] = impl
    return impl


def registered(name: str = DEFAULT_NAME) -> FlashkvTransformersAttention:
    """The state registered under ``name`` (KeyError if register() was not called)."""
    return _REGISTERED[name]
