"""The standard workloads (docs/benchmarks.md), exactly as `flashkv bench` defines them
(apps/flashkv/workloads.cpp) and the peers (flashkv.bench.peers) draw them, and how they are
counted.

Decode D1-D6: one query token per request over paged KV. Prefill P1-P5: causal, qo_len = kv_len
per request. D2/P2 are uniform in [512, 1024] from Python's random.Random(2025) (the sequence the
C++ CLI copies); D3/P3 are Zipf, l_i = max(16, round(16 * 1024 * i^-1.1 / sum_j j^-1.1)).
"""

import random
from dataclasses import dataclass, field

SHAPES = {"gqa-32-8": (32, 8), "mha-32-32": (32, 32)}  # name -> (query heads, KV heads)
DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}
UNIT_ROUNDOFF = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 2.0**-24}
L2_ROTATE_BYTES = 200 << 20  # rotate input copies until this much (4x the H200's 50 MB L2)


@dataclass
class Workload:
    id: str
    kind: str  # "decode" or "prefill"
    kv_lens: list
    qo_lens: list = field(default_factory=list)  # prefill: [] means qo_len = kv_len

    @property
    def batch(self) -> int:
        return len(self.kv_lens)

    def qo(self) -> list:
        """Query tokens per request."""
        if self.kind == "decode":
            return [1] * self.batch
        return list(self.qo_lens) if self.qo_lens else list(self.kv_lens)


def uniform_lens():
    r = random.Random(2025)
    return [r.randint(512, 1024) for _ in range(16)]


def zipf_lens():
    s = sum(j ** -1.1 for j in range(1, 17))
    return [max(16, round(16 * 1024 * i ** -1.1 / s)) for i in range(1, 17)]


def standard_workloads():
    uni, zipf = uniform_lens(), zipf_lens()
    return [
        Workload("D1", "decode", [1024] * 16),
        Workload("D2", "decode", uni),
        Workload("D3", "decode", zipf),
        Workload("D4", "decode", [32768]),
        Workload("D5", "decode", [4096] * 64),
        Workload("D6", "decode", [2048] * 256),
        Workload("P1", "prefill", [1024] * 16),
        Workload("P2", "prefill", uni),
        Workload("P3", "prefill", zipf),
        Workload("P4", "prefill", [8192]),
        Workload("P5", "prefill", [32768]),
    ]


def append_workloads():
    """A1 (append: 16 requests, 512 new query tokens on 4096 cached) and S1 (speculative
    verification: 64 requests, 4 query tokens on 4096 keys): prefill with qo_len < kv_len, the
    causal mask aligned to the end of the KV (`flashkv bench prefill` runs them too)."""
    return [Workload("A1", "prefill", [4096 + 512] * 16, [512] * 16),
            Workload("S1", "prefill", [4096] * 64, [4] * 64)]


def select(kind, ids=None):
    """The standard workloads of `kind`, restricted to `ids` when given."""
    return [w for w in standard_workloads() if w.kind == kind and (not ids or w.id in ids)]


def page_table(kv_lens, page_size):
    """(indptr [B+1], last_page_len [B]) of requests stored in consecutive pages."""
    indptr, last = [0], []
    for n in kv_lens:
        pages = (n + page_size - 1) // page_size
        indptr.append(indptr[-1] + pages)
        last.append(n - (pages - 1) * page_size if pages else 0)
    return indptr, last


def causal_pairs(qo_len, kv_len) -> int:
    """Unmasked (query, key) pairs of one request, the mask aligned to the end of the KV."""
    return sum(min(kv_len, max(0, kv_len - qo_len + i + 1)) for i in range(qo_len))


def decode_bytes(w: Workload, hq, hkv, head_dim, dtype, kv_dtype=None) -> int:
    """q + every K and V element attended + o, in the storage dtypes (real tokens only; the
    cache's is kv_dtype, default the q dtype)."""
    b, kb = DTYPE_BYTES[dtype], DTYPE_BYTES[kv_dtype or dtype]
    return 2 * w.batch * hq * head_dim * b + sum(w.kv_lens) * hkv * head_dim * 2 * kb


def prefill_bytes(w: Workload, hq, hkv, head_dim, dtype) -> int:
    b = DTYPE_BYTES[dtype]
    return 2 * sum(w.qo()) * hq * head_dim * b + sum(w.kv_lens) * hkv * head_dim * 2 * b


def prefill_flops(w: Workload, hq, head_dim) -> float:
    """4 * head_dim * H_qo * unmasked pairs (causal), summed over requests."""
    pairs = sum(causal_pairs(q, k) for q, k in zip(w.qo(), w.kv_lens))
    return 4.0 * head_dim * hq * pairs


def rotation_copies(bytes_per_copy) -> int:
    """Input copies to rotate over so that the L2 does not flatter a kernel: enough to span
    L2_ROTATE_BYTES, between 1 and 8 (apps/flashkv/bench_util.cpp's rule)."""
    b = max(int(bytes_per_copy), 1)
    return max(1, min(8, -(-L2_ROTATE_BYTES // b)))


def error_bound(err_lowp, dtype) -> float:
    """The reference check's bound: the kernel's relative error may be at most twice that of the
    reference rounded to the dtype, plus the unit roundoff, and never above 1e-2."""
    return min(2 * err_lowp + UNIT_ROUNDOFF[dtype], 1e-2)
