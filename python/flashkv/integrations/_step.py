"""Engine-independent pieces of the serving adapters: when a step starts, and the host page table
of one step.

A serving engine calls attention once per layer with the same sequence metadata; the adapter
plans on the first layer of a step and reuses that plan for the others. ``StepTracker`` decides
"same step" conservatively: a plan is reused only when the metadata objects are the very same
objects as at plan time (held alive here, so their ids cannot be recycled), their in-place
version counters have not moved (torch bumps ``_version`` on every in-place write, also through
views of a static buffer), and the layer asking has not been served in this step yet (a layer
asking twice means a new forward pass over metadata that happens to look unchanged). Anything
else replans: a spurious replan costs microseconds, a wrong reuse would attend over another
step's pages.

No torch import here: the math runs on NumPy arrays, the identity checks on any objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _version(t):
    # torch tensors count in-place writes; inference-mode tensors and non-tensors do not.
    try:
        return t._version
    except (AttributeError, RuntimeError):
        return None


class StepTracker:
    """One per (engine cache, layer group): says whether a call belongs to the step last planned."""

    def __init__(self):
        self._objects = ()  # the metadata objects of the planned step, kept alive
        self._versions = ()
        self._versioned = ()  # those of them that count versions (tensors), in order
        self._signature = ()
        self._served = set()
        self.steps = 0  # plans made (tests and the overhead report read it)

    def is_same_step(self, layer, objects, signature=()) -> bool:
        """True when ``objects`` (the step's metadata: index tensors, lists) are the planned
        step's, ``signature`` (shapes, options: compared by value) is the planned one and
        ``layer`` has not been served since; records ``layer`` as served."""
        planned = self._objects
        if (layer in self._served or signature != self._signature
                or len(objects) != len(planned)):
            return False
        for a, b in zip(objects, planned):
            if a is not b:
                return False
        # The same objects as at plan time, so the same ones count versions; each must still
        # be at the version the plan read (an in-place refill moves it).
        for o, v in zip(self._versioned, self._versions):
            if _version(o) != v:
                return False
        self._served.add(layer)
        return True

    def new_step(self, layer, objects, signature=()):
        """Record that a plan was made for ``objects`` and ``signature`` at ``layer``."""
        self._signature = signature
        self._objects = tuple(objects)
        versions = [(o, _version(o)) for o in self._objects]
        self._versioned = tuple(o for o, v in versions if v is not None)
        self._versions = tuple(v for _, v in versions if v is not None)
        self._served = {layer}
        self.steps += 1


@dataclass
class StepPageTable:
    """The host side of one step for one layer group, from the engine's cumulative lengths.

    ``qo_indptr`` / ``kv_lens`` per request; with ``page_size`` the page table's ``kv_indptr``
    (in pages), ``last_page_len`` and ``page_starts``: the token index, within the engine's
    flat per-token read index, of each page's first token (the page ids are read there).
    """

    qo_indptr: np.ndarray
    kv_lens: np.ndarray
    page_size: int
    kv_indptr: np.ndarray
    last_page_len: np.ndarray
    page_starts: np.ndarray
    _num_q_tokens: int | None = None

    @property
    def batch(self) -> int:
        return int(self.kv_lens.shape[0])

    @property
    def qo_lens(self) -> np.ndarray:
        return np.diff(self.qo_indptr)

    @property
    def decode_only(self) -> bool:
        """Every request has exactly one query token (batch decode serves the step)."""
        return self.batch > 0 and bool((self.qo_lens == 1).all())

    @property
    def num_q_tokens(self) -> int:
        if self._num_q_tokens is None:  # read once per call of every layer: keep the int
            self._num_q_tokens = int(self.qo_indptr[-1])
        return self._num_q_tokens


def step_page_table(cu_seq_lens_q, cu_seq_lens_k, page_size) -> StepPageTable:
    """Pages of ``page_size`` tokens over requests laid out as the engine's flat read index
    lays them out: request r's KV tokens at ``cu_seq_lens_k[r] ..`` in logical order, each
    page's tokens contiguous in one engine block (so the page id is ``read_index[start] //
    page_size``). Requests with no KV get no pages (last_page_len 0, which flashkv's checks
    accept for empty requests)."""
    cu_q = np.asarray(cu_seq_lens_q, dtype=np.int64).reshape(-1)
    cu_k = np.asarray(cu_seq_lens_k, dtype=np.int64).reshape(-1)
    if cu_q.shape != cu_k.shape or cu_q.shape[0] < 1:
        raise ValueError(f"cu_seq_lens_q / cu_seq_lens_k: expected two [batch + 1] arrays, got "
                         f"{cu_q.shape[0]} and {cu_k.shape[0]} entries")
    if page_size < 1:
        raise ValueError(f"page_size: expected >= 1, got {page_size}")
    qo_lens, kv_lens = np.diff(cu_q), np.diff(cu_k)
    if (qo_lens < 0).any() or (kv_lens < 0).any() or cu_q[0] != 0 or cu_k[0] != 0:
        raise ValueError("cu_seq_lens_q / cu_seq_lens_k: expected non-decreasing from 0")
    if (qo_lens > kv_lens).any():
        r = int(np.argmax(qo_lens > kv_lens))
        raise ValueError(f"request {r}: {int(qo_lens[r])} query tokens but only "
                         f"{int(kv_lens[r])} KV tokens (the engine's KV lengths include the step's)")
    pages = (kv_lens + page_size - 1) // page_size
    kv_indptr = np.zeros(kv_lens.shape[0] + 1, dtype=np.int32)
    np.cumsum(pages, out=kv_indptr[1:])
    last = np.where(kv_lens > 0, kv_lens - (pages - 1) * page_size, 0).astype(np.int32)
    # Token index of each page's first token: cu_k[r] + j * page_size for j < pages[r].
    owner = np.repeat(np.arange(kv_lens.shape[0]), pages)
    j = np.arange(int(kv_indptr[-1])) - kv_indptr[:-1][owner]
    starts = cu_k[:-1][owner] + j * page_size
    return StepPageTable(qo_indptr=cu_q.astype(np.int32), kv_lens=kv_lens.astype(np.int32),
                         page_size=int(page_size), kv_indptr=kv_indptr, last_page_len=last,
                         page_starts=starts.astype(np.int64))


def sliding_reads_survive_writes(cu_seq_lens_q, cu_seq_lens_k, window) -> bool:
    """True when writing a step's new tokens into a sliding-window ring buffer of ``window``
    slots first cannot overwrite a slot the step still reads: request r reads its last
    ``kv_len - qo_len`` cached tokens and writes ``qo_len`` new ones, and the ring holds
    ``window`` slots, so the two sets are disjoint while ``kv_len <= window``."""
    kv_lens = np.diff(np.asarray(cu_seq_lens_k, dtype=np.int64))
    return bool((kv_lens <= int(window)).all())
