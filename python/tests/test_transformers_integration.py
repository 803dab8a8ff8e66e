"""flashkv inside Hugging Face transformers (flashkv.integrations.transformers), on the CPU
reference backend: registration, plan reuse across layers, step detection, bad input, and greedy
generation of every served model family against the engine's own attention. Skips without torch
and transformers; the same checks run on the GPU with `python -m flashkv.integrations.model_families`."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("psutil")  # transformers sizes its CPU paged cache with it

from flashkv.integrations import _step  # noqa: E402
from flashkv.integrations import model_families as mf  # noqa: E402
from flashkv.integrations import transformers as fkv_tf  # noqa: E402


@pytest.fixture(scope="module")
def impl():
    return fkv_tf.register()


def test_registration_names_both_forms(impl):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert "paged|fkv" in AttentionInterface._global_mapping
    assert "fkv" in AttentionInterface._global_mapping
    assert "fkv" in AttentionMaskInterface._global_mapping
    assert fkv_tf.registered() is impl


def test_registration_refuses_flash_in_the_name():
    with pytest.raises(ValueError, match="contains 'flash'"):
        fkv_tf.register("flashkv")
    with pytest.raises(ValueError, match="plain implementation name"):
        fkv_tf.register("paged|x")


def test_unknown_transformers_version_is_refused():
    with pytest.raises(ImportError, match="5.10 <= transformers < 6"):
        fkv_tf.check_transformers_version("4.57.1")
    with pytest.raises(ImportError, match="not supported"):
        fkv_tf.check_transformers_version("6.0.0")
    fkv_tf.check_transformers_version("5.17.0")


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        fkv_tf.FlashkvTransformersAttention(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="backend"):
        fkv_tf.FlashkvTransformersAttention(backend="cudnn")
    with pytest.raises(ValueError, match="k_scale"):
        fkv_tf.FlashkvTransformersAttention(k_scale=2.0)


def test_step_page_table_matches_engine_blocks():
    # Two requests: 5 tokens (1 cached + 4 new... the engine's lengths include the step's) and
    # 33 tokens, in blocks of 16: pages 1 and 3, last pages 5 and 1.
    t = _step.step_page_table([0, 4, 5], [0, 5, 38], 16)
    assert t.kv_indptr.tolist() == [0, 1, 4]
    assert t.last_page_len.tolist() == [5, 1]
    assert t.page_starts.tolist() == [0, 5, 21, 37]
    assert not t.decode_only
    assert _step.step_page_table([0, 1, 2], [0, 7, 9], 4).decode_only
    with pytest.raises(ValueError, match="query tokens but only"):
        _step.step_page_table([0, 6], [0, 5], 16)
    with pytest.raises(ValueError, match="non-decreasing"):
        _step.step_page_table([0, 2, 1], [0, 3, 4], 16)


def test_sliding_reads_survive_writes():
    assert _step.sliding_reads_survive_writes([0, 1, 2], [0, 24, 24], 24)
    assert not _step.sliding_reads_survive_writes([0, 10], [0, 30], 24)


def test_step_tracker_reuses_only_within_a_step():
    tr = _step.StepTracker()
    a = [torch.zeros(3, dtype=torch.int32)]
    objs = (a[0], a)
    assert not tr.is_same_step(0, objs)
    tr.new_step(0, objs)
    assert tr.is_same_step(1, objs)  # the next layer of the step reuses
    assert not tr.is_same_step(1, objs)  # a layer asking twice is a new forward
    tr.new_step(1, objs)
    a[0][0] = 7  # in-place rewrite of the metadata (a static buffer refilled): version moves
    assert not tr.is_same_step(2, objs)
    tr.new_step(2, objs)
    b = [a[0]]  # a new kwargs list with the same tensor: a new step
    assert not tr.is_same_step(3, (a[0], b))
    tr.new_step(3, (a[0], b))
    assert not tr.is_same_step(4, (a[0], b), signature=("other heads",))
    assert tr.steps == 4


def _fresh(**kw):
    impl = fkv_tf.register(**kw)
    impl.stats.reset()
    return impl


@pytest.mark.parametrize("family", mf.SDPA_COMPARABLE)
def test_cb_generation_matches_paged_sdpa(family):
    impl = _fresh()
    r = mf.check_family(family, "paged|fkv", device="cpu", dtype=torch.float32,
                        ref_impl="paged|sdpa", new_tokens=6, margin_tol=1e-3)
    assert r["tokens_equal_ref"], r
    assert r["passed"], r
    st = impl.stats
    layers = mf.family_config(family).num_hidden_layers
    # One plan per step and layer group: calls = steps x layers, plans = steps x groups.
    assert st.calls > st.plans > 0
    assert st.calls % layers == 0
    # Chunked prefill (64-token steps) and decode; a sliding-window chunk longer than the ring's
    # free slots is served from the engine's gather (Mistral: every layer slides, window 24).
    assert "decode" in st.paths and ("prefill" in st.paths or family == "mistral"), st.paths


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_cb_generation_with_softcap_sinks_and_alternating_windows(family):
    # paged|sdpa has neither soft-cap nor sinks: the reference is a float32 eager forward.
    impl = _fresh()
    r = mf.check_family(family, "paged|fkv", device="cpu", dtype=torch.float32, ref_impl=None,
                        new_tokens=6, margin_tol=1e-3)
    assert r["passed"], r
    assert impl.stats.groups == {0, 1}  # sliding and full layer groups, planned apart
    assert "decode" in impl.stats.paths


def test_long_chunk_on_a_sliding_ring_uses_the_engine_gather():
    # A 70-token prompt in 64-token chunks over a 24-token window: the second chunk reads 23
    # cached tokens and writes 6 (kv_len 29 > 24), so that step's sliding layers gather.
    impl = _fresh()
    r = mf.check_family("mistral", "paged|fkv", device="cpu", dtype=torch.float32,
                        ref_impl="paged|sdpa", lengths=(70,), new_tokens=4, margin_tol=1e-3)
    assert r["tokens_equal_ref"] and r["passed"], r
    assert impl.stats.paths.get("gather", 0) > 0


def test_plain_form_prefill_logits_with_padding():
    _fresh()
    for family in ("llama", "gemma2"):
        err = mf.prefill_logits_error(family, "fkv", device="cpu", dtype=torch.float32)
        assert err < 1e-4, (family, err)


def test_plain_form_generate_matches_eager():
    _fresh()
    prompts = mf.prompts_for(256, (6, 11), seed=3)
    ids = torch.zeros(2, 11, dtype=torch.long)
    mask = torch.zeros(2, 11, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, 11 - len(p):] = torch.tensor(p)
        mask[r, 11 - len(p):] = 1
    outs = []
    for name in ("fkv", "eager"):
        m = mf.build_model("llama", name, torch.float32, "cpu")
        outs.append(m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                               pad_token_id=0).tolist())
    assert outs[0] == outs[1]


def test_bad_input_is_refused_with_named_errors(impl):
    cfg = mf.family_config("llama")
    m = mf.build_model("llama", "paged|fkv", torch.float32, "cpu")
    attn = m.model.layers[0].self_attn
    q = torch.randn(1, 8, 3, 128)
    k = torch.randn(1, 2, 3, 128)
    with pytest.raises(ValueError, match="continuous-batching manager"):
        impl.paged_forward(attn, q, k, k, None)
    with pytest.raises(ValueError, match="head_dim"):
        impl.plain_forward(attn, torch.randn(1, 8, 3, 96), torch.randn(1, 2, 3, 96),
                           torch.randn(1, 2, 3, 96), None)
    with pytest.raises(ValueError, match="without a copy"):
        kt = torch.randn(1, 3, 2, 128).transpose(1, 2)  # [B, S, H, D] memory: not HND pages
        impl.plain_forward(attn, q, kt, kt, None)
    with pytest.raises(ValueError, match="s_aux"):
        impl.plain_forward(attn, q, k, k, None, s_aux=torch.zeros(3))
    assert cfg.num_attention_heads == 8
    fi = fkv_tf.FlashkvTransformersAttention.__new__(fkv_tf.FlashkvTransformersAttention)
    assert fi is not None
    with pytest.raises(NotImplementedError, match="sinks"):
        from flashkv.integrations._backends import AttentionBackend

        b = AttentionBackend("flashkv")
        b.name = "flashinfer"  # the check is by name: flashinfer is not installed here
        b.variant_kwargs(torch.zeros(8))


def test_fp8_cache_refused_for_sliding_models():
    impl = fkv_tf.FlashkvTransformersAttention(kv_cache_dtype="e4m3")
    fake = type("Cache", (), {"num_sliding_attention_groups": 1, "key_cache": [],
                              "value_cache": []})()
    with pytest.raises(NotImplementedError, match="full attention in every layer"):
        impl._make_fp8(fake, torch.float8_e4m3fn)
    assert np.dtype("float32")  # numpy stays importable beside torch


def test_paged_layout_it_cannot_view_is_refused():
    k = torch.zeros(64, 2, 128)
    fkv_tf._check_paged_layout(k, k, 16, 2, 128)
    with pytest.raises(ValueError, match="without a copy"):
        fkv_tf._check_paged_layout(k[:, :, :64], k, 16, 2, 128)
    with pytest.raises(ValueError, match="without a copy"):
        fkv_tf._check_paged_layout(torch.zeros(60, 2, 128), k, 16, 2, 128)
    with pytest.raises(ValueError, match="without a copy"):
        kt = torch.zeros(2, 64, 128).transpose(0, 1)
        fkv_tf._check_paged_layout(kt, kt, 16, 2, 128)


def test_fp8_cache_generation_through_the_adapter():
    # The adapter owns the cache dtype: e4m3 tensors swapped in, written by flashkv's quantizing
    # append (decode: run_step) and the engine's write (fresh prompts), read by every path.
    impl = fkv_tf.register("fkv8", kv_cache_dtype="e4m3")
    impl.stats.reset()
    r = mf.check_family("llama", "paged|fkv8", device="cpu", dtype=torch.bfloat16,
                        ref_impl="paged|sdpa", new_tokens=6, margin_tol=0.5)
    assert r["passed"], r
    assert {"ragged", "prefill", "decode"} <= set(impl.stats.paths)
