"""FlashAttention-2 varlen through torch (torch.ops.aten._flash_attention_forward) as a peer.

It reads the packed, contiguous q / k / v with cumulative sequence lengths: ragged batches need
no padding, but the KV is contiguous per request, not paged (which favours it). GQA is native.
causal=True aligns the mask to the end of the KV (FA2 >= 2.1), so A1 and S1 run as they are.
"""

import math

from .batch import HEAD_DIM, rel_err


def run(torch, b, timer):
    cu_q = torch.tensor(b.cu_q, dtype=torch.int32, device="cuda")
    cu_k = torch.tensor(b.cu_k, dtype=torch.int32, device="cuda")
    max_q, max_k = max(b.qo_lens), max(b.kv_lens)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    op = torch.ops.aten._flash_attention_forward

    def call():
        # (q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask)
        return op(b.q, b.k, b.v, cu_q, cu_k, max_q, max_k, 0.0, b.causal, False, scale=scale)

    out = call()[0]
    torch.cuda.synchronize()
    err = rel_err(torch, b, out)
    del out
    notes = ("aten._flash_attention_forward varlen (cu_seqlens), "
             + ("causal=True, " if b.causal and not b.square else "")
             + "packed contiguous NHD q/k/v"
             + (", native GQA" if b.num_kv_heads != b.num_qo_heads else ""))
    return dict(**timer.measure(call), rel_err=err, notes=notes)
