"""torch.nn.functional.scaled_dot_product_attention as a peer, one backend at a time.

SDPA takes dense [B, H, L, d] tensors, so a ragged batch is right-padded to a common length (to a
multiple of 16 when the lengths differ; padding is built before the timing and its waste shows up
as lower utilisation, since bytes and FLOPs count real tokens only).
  decode: one query per request; where lengths differ, a boolean key-padding mask [B, 1, 1, L]
          keeps the padded keys out. FLASH takes no mask: it runs unmasked, attends the padding
          and its rel_err says so (the notes too).
  prefill, qo == kv: right-padded queries with is_causal=True, exact for the real rows.
  prefill, qo < kv (A1, S1: every request the same lengths, so dense views need no padding): the
          causal mask aligned to the end of the KV as a boolean tensor; FLASH takes no mask and
          fails (a recorded failure). The "lower-right" peer passes torch's causal_lower_right
          bias instead, which dispatches to flash or efficient by itself (hence no backend name).
GQA: enable_gqa=True first; where a backend refuses it, the KV heads are repeated before the
timing (the kernel then reads that many times the KV bytes: noted). Layouts: the [B, H, L, d]
view of the padded [B, L, H, d] tensor first, a contiguous copy where a backend refuses strides.
The first of these attempts that runs is timed; the ones that failed are listed in the notes.
"""

import warnings

from .batch import HEAD_DIM, rel_err

BACKENDS = ("flash", "cudnn", "efficient")


def backend_enum(name):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def _first_line(e):
    return str(e).splitlines()[0][:160] if str(e) else ""


def _gqa_modes(b):
    """(name, enable_gqa) to try, in order."""
    if b.num_kv_heads == b.num_qo_heads:
        return [("mha", False)]
    return [("enable_gqa", True), ("kv_repeated", False)]


def padded(torch, b, backend_name, timer):
    """Decode and square prefill on right-padded dense tensors with one backend."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    backend = backend_enum(backend_name)
    lens = b.kv_lens
    B, lmax = len(lens), max(lens)
    const = all(n == lmax for n in lens)
    lpad = lmax if const else (lmax + 15) // 16 * 16
    hq, hkv, d = b.num_qo_heads, b.num_kv_heads, HEAD_DIM

    def pad(x, cu):  # packed [T, H, d] -> [B, lpad, H, d]
        if const:
            return x.view(B, lmax, x.shape[1], x.shape[2])
        out = x.new_zeros(B, lpad, x.shape[1], x.shape[2])
        for r in range(B):
            out[r, : cu[r + 1] - cu[r]] = x[cu[r]:cu[r + 1]]
        return out

    kp, vp = pad(b.k, b.cu_k), pad(b.v, b.cu_k)
    qp = b.q.view(B, 1, hq, d) if b.kind == "decode" else pad(b.q, b.cu_q)
    key_mask = None
    if b.kind == "decode" and not const and backend_name != "flash":
        key_mask = (torch.arange(lpad, device="cuda")[None, :]
                    < torch.tensor(lens, device="cuda")[:, None]).view(B, 1, 1, lpad)
    notes = []
    if b.causal:
        notes.append("right-padded, is_causal=True (exact for real rows)")
    if not const:
        notes.append(f"padded to L={lpad} (real tokens {sum(lens)} of {B * lpad})")

    layouts = [("BLHD-strided", lambda x: x.transpose(1, 2)),
               ("BHLD-contiguous", lambda x: x.transpose(1, 2).contiguous())]
    masks = [("masked", key_mask), ("unmasked", None)] if key_mask is not None else [("none", None)]
    errors = []
    for mask_name, mask in masks:
        for layout_name, layout in layouts:
            for gqa_name, enable_gqa in _gqa_modes(b):
                caught = []
                try:
                    qt = layout(qp)
                    if gqa_name == "kv_repeated":
                        kt = layout(kp.repeat_interleave(hq // hkv, dim=2))
                        vt = layout(vp.repeat_interleave(hq // hkv, dim=2))
                    else:
                        kt, vt = layout(kp), layout(vp)
                    kw = dict(attn_mask=mask, is_causal=b.causal)
                    if enable_gqa:
                        kw["enable_gqa"] = True

                    def call():
                        with sdpa_kernel([backend]):
                            return F.scaled_dot_product_attention(qt, kt, vt, **kw)

                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        out = call()
                        torch.cuda.synchronize()
                    out_nhd = out.transpose(1, 2)  # [B, Lq, H, d]
                    if b.kind == "decode":
                        packed = out_nhd.reshape(B, hq, d)
                    else:
                        packed = torch.cat([out_nhd[r, : b.qo_lens[r]] for r in range(B)], 0)
                    err = rel_err(torch, b, packed)
                    del out, out_nhd, packed
                    timing = timer.measure(call)
                    n = list(notes)
                    if b.kind == "decode" and not const:
                        if mask is not None:
                            n.append("bool key-padding mask [B,1,1,L]")
                        else:
                            why = ("FLASH backend takes no attn_mask" if backend_name == "flash"
                                   else "backend rejected the masked call")
                            n.append(f"NO key-padding mask ({why}): padded keys are attended, "
                                     "output wrong for requests shorter than max")
                    n += [f"layout {layout_name}", f"gqa: {gqa_name}" if hkv != hq else "MHA"]
                    if gqa_name == "kv_repeated":
                        n.append("KV heads materialised x%d before timing (kernel reads %dx KV "
                                 "bytes)" % (hq // hkv, hq // hkv))
                    if errors:
                        n.append("earlier attempts failed: " + " | ".join(errors)[:500])
                    return dict(**timing, rel_err=err, notes="; ".join(n))
                except Exception as e:  # noqa: BLE001  (the next attempt may run)
                    why = " / ".join(str(w.message).splitlines()[0][:160] for w in caught[:4])
                    errors.append(f"{mask_name}/{layout_name}/{gqa_name}: {type(e).__name__}: "
                                  f"{_first_line(e)} [{why}]")
                    torch.cuda.synchronize()
    raise RuntimeError(" || ".join(errors)[:1500])


def end_aligned(torch, b, backend_name, timer):
    """Prefill with qo < kv on dense views (equal lengths): backend_name one of BACKENDS with a
    boolean mask, or None for the causal_lower_right bias."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    d, B, lq, lk = HEAD_DIM, len(b.qo_lens), b.qo_lens[0], b.kv_lens[0]
    if any(x != lq for x in b.qo_lens) or any(x != lk for x in b.kv_lens):
        raise ValueError("the end-aligned SDPA peer needs equal lengths across the batch")
    hq, hkv = b.num_qo_heads, b.num_kv_heads
    qt = b.q.view(B, lq, hq, d).transpose(1, 2)  # [B, H, L, d] views of the packed tensors
    kt0 = b.k.view(B, lk, hkv, d).transpose(1, 2)
    vt0 = b.v.view(B, lk, hkv, d).transpose(1, 2)
    if backend_name is None:
        mask_name, mask = "causal_lower_right", causal_lower_right(lq, lk)
    else:
        mask_name = "bool"
        mask = torch.ones(lq, lk, dtype=torch.bool, device="cuda").tril(diagonal=lk - lq)
    errors = []
    for gqa_name, enable_gqa in _gqa_modes(b):
        try:
            repeat = gqa_name == "kv_repeated"
            kt = kt0.repeat_interleave(hq // hkv, dim=1) if repeat else kt0
            vt = vt0.repeat_interleave(hq // hkv, dim=1) if repeat else vt0
            kw = dict(attn_mask=mask, enable_gqa=True) if enable_gqa else dict(attn_mask=mask)

            def call():
                if backend_name is None:
                    return F.scaled_dot_product_attention(qt, kt, vt, **kw)
                with sdpa_kernel([backend_enum(backend_name)]):
                    return F.scaled_dot_product_attention(qt, kt, vt, **kw)

            out = call()
            torch.cuda.synchronize()
            err = rel_err(torch, b, out.transpose(1, 2).reshape(B * lq, hq, d))
            del out
            timing = timer.measure(call)
            notes = [f"dense [B,H,L,d] views (equal lengths, no padding), mask {mask_name}",
                     f"gqa: {gqa_name}"]
            if repeat:
                notes.append("KV heads materialised x%d before timing" % (hq // hkv))
            if errors:
                notes.append("earlier attempts failed: " + " | ".join(errors)[:400])
            return dict(**timing, rel_err=err, notes="; ".join(notes))
        except Exception as e:  # noqa: BLE001  (the next attempt may run)
            errors.append(f"{gqa_name}: {type(e).__name__}: {_first_line(e)}")
            torch.cuda.synchronize()
    raise RuntimeError(" || ".join(errors)[:1500])
