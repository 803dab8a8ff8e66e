"""FlexAttention (torch.nn.attention.flex_attention, torch.compile'd) as a prefill peer.

The batch is packed into one sequence [1, H, T, d] with a block mask that is causal within each
request and hides other requests' keys (document masking), so ragged batches need no padding;
the KV is contiguous, not paged. The block mask (BLOCK_SIZE 128) and the first call, which
compiles, stay outside the timing; their seconds are in the notes. Square prefill only (P1-P5).
"""

import math
import time

from .batch import HEAD_DIM, rel_err

_compiled = {}  # one compiled flex_attention per process: recompiles are per shape anyway


def compiled_flex(torch):
    from torch.nn.attention.flex_attention import flex_attention

    if "fn" not in _compiled:
        import torch._dynamo

        # every (workload, shape) is a new specialization: allow them all
        for attr in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, attr):
                setattr(torch._dynamo.config, attr, 128)
        _compiled["fn"] = torch.compile(flex_attention, dynamic=False)
    return _compiled["fn"]


def run(torch, b, timer):
    from torch.nn.attention.flex_attention import create_block_mask

    if not b.square:
        raise ValueError("the FlexAttention peer runs square prefill (qo_len == kv_len) only")
    flex = compiled_flex(torch)
    total = sum(b.kv_lens)
    doc = torch.repeat_interleave(torch.arange(len(b.kv_lens), device="cuda", dtype=torch.int32),
                                  torch.tensor(b.kv_lens, device="cuda"))

    def mask_mod(batch, head, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    t0 = time.time()
    block_mask = create_block_mask(mask_mod, None, None, total, total, device="cuda")
    mask_s = time.time() - t0
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (b.q, b.k, b.v))
    kw = dict(block_mask=block_mask, scale=1.0 / math.sqrt(HEAD_DIM))
    gqa = b.num_kv_heads != b.num_qo_heads
    if gqa:
        kw["enable_gqa"] = True

    def call():
        return flex(qt, kt, vt, **kw)

    t0 = time.time()
    out = call()
    torch.cuda.synchronize()
    compile_s = time.time() - t0
    err = rel_err(torch, b, out[0].transpose(0, 1))
    del out
    notes = (f"flex_attention torch.compile(dynamic=False) default kernel options; packed "
             f"[1,H,T,d] contiguous; causal+document block mask (BLOCK_SIZE 128, built untimed in "
             f"{mask_s:.1f}s); first call incl. compile {compile_s:.1f}s"
             + ("; enable_gqa" if gqa else ""))
    return dict(**timer.measure(call), rel_err=err, notes=notes)
