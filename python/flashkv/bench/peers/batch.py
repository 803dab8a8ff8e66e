"""One workload's inputs for the peers, and the reference they are checked against.

Queries, keys and values are packed (NHD, requests one after another, no padding and no pages):
each peer builds the layout it needs from them outside the timing. They are float16 randn from a
CUDA generator seeded per (workload, shape), drawn q, k, v in that order.

The check: for each request a sample of query rows (decode: its one row; otherwise the first, the
last and random ones, 48 in all where there are that many) is computed in float32 math attention
with the causal mask aligned to the end of the KV (query i of qo sees keys <= kv - qo + i; for
qo == kv that is the usual causal mask). rel_err = ||out - ref|| / ||ref|| over the sampled rows,
NaN when the peer's output is not finite. No bound is applied: a peer with a wrong mask shows a
large error beside its time.
"""

import math
import random
from dataclasses import dataclass

HEAD_DIM = 128
SAMPLED_ROWS = 48  # query rows checked per request, at most


def sampled_rows(qo_lens, seed):
    """The query rows checked, per request: [0] for one-token requests, else the first, the last
    and random rows (random.Random(seed)), min(qo, SAMPLED_ROWS) in all."""
    rs = random.Random(seed)
    rows = []
    for qo in qo_lens:
        if qo == 1:
            rows.append([0])
        else:
            random_rows = [rs.randint(0, qo - 1) for _ in range(min(qo, SAMPLED_ROWS) - 2)]
            rows.append([0, qo - 1] + random_rows)
    return rows


def offsets(lens):
    """Cumulative offsets [0, l0, l0 + l1, ...] of packed sequences."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


@dataclass
class Batch:
    """Packed inputs of one workload on one head shape, with the sampled reference rows."""

    kind: str  # "decode" or "prefill"
    qo_lens: list
    kv_lens: list
    num_qo_heads: int
    num_kv_heads: int
    q: object  # [sum(qo_lens), Hq, d] float16
    k: object  # [sum(kv_lens), Hkv, d] float16
    v: object
    rows: list  # sampled query rows per request
    ref: object = None  # [sum of len(rows), Hq, d] float32

    @property
    def cu_q(self):
        return offsets(self.qo_lens)

    @property
    def cu_k(self):
        return offsets(self.kv_lens)

    @property
    def causal(self):
        return self.kind == "prefill"

    @property
    def square(self):
        """Every request has as many query tokens as keys (prefill P1-P5)."""
        return self.kind == "prefill" and self.qo_lens == self.kv_lens


def make(torch, workload, num_qo_heads, num_kv_heads, seed, kv_round=None):
    """The inputs of `workload` (flashkv.bench.workloads.Workload) and their reference.
    kv_round: a torch dtype that K and V are rounded through (an fp8 cache's), so the reference
    sees exactly the values the cache holds."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    qo_lens, kv_lens = workload.qo(), list(workload.kv_lens)
    d, f16 = HEAD_DIM, torch.float16
    q = torch.randn(sum(qo_lens), num_qo_heads, d, device="cuda", dtype=f16, generator=g)
    k = torch.randn(sum(kv_lens), num_kv_heads, d, device="cuda", dtype=f16, generator=g)
    v = torch.randn(sum(kv_lens), num_kv_heads, d, device="cuda", dtype=f16, generator=g)
    if kv_round is not None:
        k, v = k.to(kv_round).to(f16), v.to(kv_round).to(f16)
    b = Batch(workload.kind, qo_lens, kv_lens, num_qo_heads, num_kv_heads, q, k, v,
              sampled_rows(qo_lens, seed))
    b.ref = reference(torch, b)
    return b


def reference(torch, b: Batch):
    """float32 math attention of the sampled rows, causal aligned to the end of the KV."""
    group = b.num_qo_heads // b.num_kv_heads
    scale = 1.0 / math.sqrt(HEAD_DIM)
    cu_q, cu_k = b.cu_q, b.cu_k
    outs = []
    for r, (qo, kv) in enumerate(zip(b.qo_lens, b.kv_lens)):
        rows = torch.tensor(b.rows[r], device="cuda")
        qr = b.q[cu_q[r] + rows].float()
        kr = b.k[cu_k[r]:cu_k[r + 1]].float().repeat_interleave(group, dim=1)
        vr = b.v[cu_k[r]:cu_k[r + 1]].float().repeat_interleave(group, dim=1)
        s = torch.einsum("nhd,lhd->hnl", qr, kr) * scale
        hidden = torch.arange(kv, device="cuda")[None, :] > (kv - qo + rows)[:, None]
        s = s.masked_fill(hidden[None], float("-inf"))
        outs.append(torch.einsum("hnl,lhd->nhd", torch.softmax(s, dim=-1), vr))
    return torch.cat(outs, 0)


def rel_err(torch, b: Batch, out_packed):
    """rel_err of a peer's packed output [sum(qo_lens), Hq, d] on the sampled rows."""
    cu_q = b.cu_q
    idx = torch.tensor([cu_q[r] + x for r in range(len(b.rows)) for x in b.rows[r]], device="cuda")
    got = out_packed[idx].float()
    if not torch.isfinite(got).all():
        return float("nan")
    return (torch.linalg.vector_norm(got - b.ref) / torch.linalg.vector_norm(b.ref)).item()
