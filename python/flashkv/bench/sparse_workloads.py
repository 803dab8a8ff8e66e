"""The sparse workloads B1-B4 of docs/benchmarks.md, exactly as `flashkv bench sparse` draws them
(apps/flashkv/sparse_workloads.cpp): the same splitmix64 stream in both languages, so a pattern is
the same bits in C++ and Python. GQA 32/8, head_dim 128, f16.

- B1 / B2: block-sparse causal prefill, M = N = 32768, R = C (128 / 64). Block row i keeps its
  local band (the `band` blocks ending at its diagonal, diagonal last), the global column 0, and
  earlier blocks drawn at random, each with one probability, so that the stored blocks are about
  `density` of the causal triangle's MB (MB + 1) / 2 (the dense causal work: density is what the
  target "time <= 1.15 x dense time x density" means). The exact density is reported.
- B3: vector-sparse decode: batch 16, context 65536, 4096 tokens per request and KV head.
- B4: page-selection decode: batch 16, context 131072, 256 pages of 16 per request and KV head.
"""

from dataclasses import dataclass

MASK64 = (1 << 64) - 1
HQ, HKV, HEAD_DIM = 32, 8, 128


class SplitMix64:
    """Steele et al.'s splitmix64: one 64-bit state, one output per step."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        """A double in [0, 1) from the top 53 bits (exact in C++ and Python)."""
        return (self.next() >> 11) * (1.0 / (1 << 53))


@dataclass
class BlockWorkload:
    id: str
    n: int  # M = N
    block: int  # R = C
    density: float  # of the causal triangle's blocks (target)
    band: int
    seed: int

    @property
    def blocks_per_side(self):
        return self.n // self.block


@dataclass
class SelectWorkload:
    id: str
    batch: int
    context: int
    page: int  # 1: token selection (vector sparsity); 16: page selection
    selected: int  # pages (or tokens) per request and KV head
    seed: int

    @property
    def selected_tokens(self):
        return self.selected * self.page


B1 = BlockWorkload("B1", 32768, 128, 0.10, 4, 2026)
B2 = BlockWorkload("B2", 32768, 64, 0.01, 1, 2027)
B3 = SelectWorkload("B3", 16, 65536, 1, 4096, 2028)
B4 = SelectWorkload("B4", 16, 131072, 16, 256, 2029)
WORKLOADS = {w.id: w for w in (B1, B2, B3, B4)}


def causal_blocks(mb):
    return mb * (mb + 1) // 2


def bsr_pattern(w: BlockWorkload):
    """(indptr, indices) of w's causal pattern: each row's block columns ascending, so the
    diagonal is last."""
    mb = w.blocks_per_side
    rng = SplitMix64(w.seed)
    base = sum(len(set(range(max(0, i - w.band + 1), i + 1)) | {0}) for i in range(mb))
    candidates = sum(max(0, i - w.band + 1 - 1) for i in range(mb))  # columns 1 .. i - band
    p = max(0.0, w.density * causal_blocks(mb) - base) / candidates if candidates else 0.0
    indptr, indices = [0], []
    for i in range(mb):
        row = set(range(max(0, i - w.band + 1), i + 1)) | {0}
        for j in range(1, i - w.band + 1):
            if rng.uniform() < p:
                row.add(j)
        indices += sorted(row)
        indptr.append(len(indices))
    return indptr, indices


def causal_pairs(w: BlockWorkload, indptr, indices):
    """Visible (query, key) pairs: full blocks below the diagonal, R (R + 1) / 2 on it."""
    r = w.block
    pairs = 0
    for i in range(len(indptr) - 1):
        for j in indices[indptr[i]:indptr[i + 1]]:
            pairs += r * r if j < i else r * (r + 1) // 2
    return pairs
