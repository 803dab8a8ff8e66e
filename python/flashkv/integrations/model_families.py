"""Small random-weight models of the families the transformers adapter serves, and the checks that
compare an implementation's generation with a reference. Shared by the CPU tests
(python/tests/test_transformers_integration.py, on flashkv's CPU reference backend) and the GPU
check (``python -m flashkv.integrations.model_families``, on the GPU machine).

No weights can be downloaded on our machines, so each model is built from its config with random
weights (seeded). The configs keep each family's attention shape (GQA group, head_dim, sliding
window on all or alternate layers, soft-cap, sinks) and shrink everything else.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

FAMILIES = ("llama", "qwen2", "mistral", "gemma2", "gpt_oss")
# Where paged|sdpa computes the same function (it has no soft-cap and no sinks).
SDPA_COMPARABLE = ("llama", "qwen2", "mistral")


def family_config(name: str, *, layers: int = 4, window: int = 24, vocab: int = 256):
    """A small config of family ``name``: its attention shape, shrunk elsewhere."""
    import transformers as tf

    if name == "llama":  # GQA 4, head_dim 128
        return tf.LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=layers, num_attention_heads=8,
                              num_key_value_heads=2, head_dim=128, max_position_embeddings=4096)
    if name == "qwen2":  # group 7 (Qwen2-0.5B: 14 / 2, hidden 896), head_dim 64
        return tf.Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=512,
                              num_hidden_layers=layers, num_attention_heads=14,
                              num_key_value_heads=2, max_position_embeddings=4096)
    if name == "mistral":  # sliding window on every layer, head_dim 128
        return tf.MistralConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512,
                                num_hidden_layers=layers, num_attention_heads=8,
                                num_key_value_heads=2, head_dim=128, sliding_window=window,
                                max_position_embeddings=4096)
    if name == "gemma2":  # alternate sliding / full layers, soft-cap 50, head_dim 256
        return tf.Gemma2Config(vocab_size=vocab, hidden_size=256, intermediate_size=512,
                               num_hidden_layers=layers, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=256, sliding_window=window,
                               query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                               final_logit_softcapping=30.0, max_position_embeddings=4096)
    if name == "gpt_oss":  # sinks, alternate sliding / full layers, head_dim 64, MoE
        return tf.GptOssConfig(vocab_size=vocab, hidden_size=256, intermediate_size=256,
                               num_hidden_layers=layers, num_attention_heads=8,
                               num_key_value_heads=2, head_dim=64, sliding_window=window,
                               num_local_experts=4, num_experts_per_tok=2,
                               max_position_embeddings=4096)
    raise ValueError(f"family: expected one of {FAMILIES}, got {name!r}")


def build_model(name, attn_implementation, dtype, device, seed=0, **cfg_kwargs):
    """The family's model with seeded random weights (the same weights for every
    implementation); gpt-oss sinks are drawn too (zeros would hide a missing sink)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = family_config(name, **cfg_kwargs)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation,
                                             dtype=torch.float32)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for p in model.parameters():
            # transformers' init leaves some tensors (norms, sinks, biases) constant: random
            # values everywhere, small enough that activations stay in range.
            p.copy_(torch.randn(p.shape, generator=g) * 0.05 + (1.0 if p.dim() == 1 and
                                                                 p.shape[0] == cfg.hidden_size
                                                                 else 0.0))
    return model.to(device=device, dtype=dtype).eval()


def prompts_for(vocab, lengths, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def generate_cb(model, prompts, new_tokens, *, block_size=16, num_blocks=256,
                max_batch_tokens=256):
    """Greedy continuous-batching generation (transformers' generate_batch); fixed lengths."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gc = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                          pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=block_size, num_blocks=num_blocks,
                                  max_batch_tokens=max_batch_tokens, use_cuda_graph=False)
    out = model.generate_batch(prompts, gc, continuous_batching_config=cb)
    by_id = {o.request_id: o.generated_tokens for o in out.values()}
    return [list(by_id[k]) for k in sorted(by_id, key=lambda r: int(r.split("_")[-1]))]


def teacher_forced_margins(ref_model, prompts, generations):
    """For each request, the reference model's logit margin at each generated token: the top
    logit minus the chosen token's logit at that position (0 where the reference agrees). The
    reference runs one full forward over prompt + generation (its own attention, in its dtype)."""
    import torch

    margins = []
    with torch.no_grad():
        for p, gen in zip(prompts, generations):
            ids = torch.tensor([p + gen[:-1]], device=ref_model.device)
            logits = ref_model(ids).logits[0].float()
            rows = logits[len(p) - 1:]
            chosen = rows.gather(1, torch.tensor(gen, device=rows.device)[:, None])[:, 0]
            margins.append((rows.max(dim=1).values - chosen).tolist())
    return margins


def first_divergence(a, b):
    """(request, token index) of the first difference between two token lists, or None."""
    for r, (x, y) in enumerate(zip(a, b)):
        for i, (s, t) in enumerate(zip(x, y)):
            if s != t:
                return r, i
    return None


def check_family(name, impl, *, device, dtype, ref_impl="paged|sdpa", lengths=(5, 17, 40, 70),
                 new_tokens=12, max_batch_tokens=64, block_size=16, margin_tol=0.0):
    """Generate with ``impl`` and with ``ref_impl`` (continuous batching, greedy) on the same
    random model; then score ``impl``'s tokens against a teacher-forced float32 eager forward.
    Returns a dict: tokens equal, the first divergence, the largest teacher-forced margin
    (0 = the eager reference picks every token ``impl`` picked)."""
    import torch

    cfg_vocab = 256
    prompts = prompts_for(cfg_vocab, lengths, seed=len(name))
    m = build_model(name, impl, dtype, device)
    got = generate_cb(m, prompts, new_tokens, block_size=block_size,
                      max_batch_tokens=max_batch_tokens)
    ref = None
    if ref_impl is not None:
        m.set_attn_implementation(ref_impl)
        ref = generate_cb(m, prompts, new_tokens, block_size=block_size,
                          max_batch_tokens=max_batch_tokens)
    eager = build_model(name, "eager", torch.float32, device)
    margins = teacher_forced_margins(eager, prompts, got)
    worst = max(max(m_) for m_ in margins)
    return {"family": name, "impl": impl, "ref_impl": ref_impl, "dtype": str(dtype),
            "tokens_equal_ref": None if ref is None else got == ref,
            "first_divergence": None if ref is None else first_divergence(got, ref),
            "max_teacher_forced_margin": worst, "margin_tol": margin_tol,
            "passed": worst <= margin_tol}


def prefill_logits_error(name, impl, *, device, dtype, batch_lengths=(9, 33), seed=0):
    """Relative error of ``impl``'s prefill logits (plain forward over a left-padded batch)
    against a float32 eager forward of the same weights: ||a - b|| / ||b|| over valid rows."""
    import torch

    prompts = prompts_for(256, batch_lengths, seed=seed)
    width = max(batch_lengths)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad():
        a = build_model(name, impl, dtype, device)(ids, attention_mask=mask).logits.float()
        b = build_model(name, "eager", torch.float32, device)(ids, attention_mask=mask).logits
    valid = mask.bool()
    diff = (a[valid] - b[valid]).norm() / b[valid].norm()
    return float(diff)


def main(argv=None):
    """GPU check of every family: paged|fkv against paged|sdpa and a float32 eager forward."""
    import torch

    import flashkv.integrations.transformers as fkv_tf

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--families", nargs="*", default=list(FAMILIES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--margin-tol", type=float, default=0.25,
                    help="largest teacher-forced logit margin accepted (bf16 noise of the logits)")
    args = ap.parse_args(argv)
    fkv_tf.register()
    dtype = getattr(torch, args.dtype)
    rows, ok = [], True
    for fam in args.families:
        t = time.time()
        ref = "paged|sdpa" if fam in SDPA_COMPARABLE else "paged|eager"
        r = check_family(fam, "paged|fkv", device="cuda", dtype=dtype, ref_impl=ref,
                         margin_tol=args.margin_tol)
        # Prefill logits of the plain form in float16 (bf16's rounding alone, through the whole
        # model, comes near 1e-2) against float32 eager; sdpa's error beside it for scale.
        r["prefill_rel_err_fkv_f16"] = prefill_logits_error(fam, "fkv", device="cuda",
                                                            dtype=torch.float16)
        try:  # gpt-oss has no sdpa path in transformers: eager in float16 instead
            base = "sdpa"
            r["prefill_rel_err_sdpa_f16"] = prefill_logits_error(fam, base, device="cuda",
                                                                 dtype=torch.float16)
        except ValueError:
            base = "eager"
            r["prefill_rel_err_eager_f16"] = prefill_logits_error(fam, base, device="cuda",
                                                                  dtype=torch.float16)
        r["prefill_ok"] = r["prefill_rel_err_fkv_f16"] <= 1e-2
        r["seconds"] = round(time.time() - t, 1)
        ok &= r["passed"] and r["prefill_ok"]
        rows.append(r)
        print(json.dumps(r), flush=True)
    print("adapter stats:", fkv_tf.registered().stats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("model families:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
