"""flashkv's peers: the attention implementations its benchmark is compared with, measured in
the same run on the same workloads (docs/benchmarks.md).

  torch group       sdpa-flash, sdpa-cudnn, sdpa-efficient (SDPA on padded dense tensors, one
                    backend at a time), sdpa-lower-right (A1/S1 only), fa2-varlen (FA2 varlen
                    through torch on packed contiguous KV), flex (FlexAttention, square prefill)
  flashinfer group  flashinfer-decode, flashinfer-decode-tc, flashinfer-prefill-fa2,
                    flashinfer-prefill-fa3 (FlashInfer 0.7 on a paged cache, as flashkv reads)

`--peers torch,flashinfer` (groups, names, or "all") selects them (registry). Every peer is
timed the same way (timing), checked against float32 math attention on sampled rows of the same
inputs (batch) and written as rows of the result schema (runner). The torch peers and FlashInfer
are imported only when a peer runs: this package needs neither, nor flashkv's compiled
extension, to select peers or build rows.

Modules: registry (names, selection), timing (the method), ceilings, batch (inputs, reference),
torch_sdpa, torch_varlen, torch_flex, flashinfer_paged (one file per kind of peer), runner (the
run, the rows), merge (several result files in one), cli.
"""

from .registry import PEERS, Peer, names, select

__all__ = ["PEERS", "Peer", "names", "select"]
