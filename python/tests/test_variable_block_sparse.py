"""flashkv.VariableBlockSparseAttentionWrapper (FlashInfer's flashinfer.sparse API) against dense
masked attention computed here in float64 from the per-head layout: blocks of different sizes per
KV head (0 included), empty block rows, causal by position with M != N, GQA and MQA, soft-cap and
sinks, q / k / v head-major (FlashInfer's) and token-major; the errors plan() raises. Host arrays
(the CPU reference) in CI; the GPU test runs the same cases on CUDA tensors."""

import numpy as np
import pytest

import flashkv
from conftest import LOG2E, assert_close, rand, requires_gpu, to_fw
from test_block_sparse import masked_attention


def sizes(rng, n, total):
    s = np.zeros(n, np.int32)
    np.add.at(s, rng.integers(0, n, total), 1)
    return s


def make_layout(rng, hk, MB, NB, M, N, density):
    m = rng.uniform(size=(hk, MB, NB)) < density
    m[0, 1, :] = False  # head 0, block row 1: empty
    rows = np.stack([sizes(rng, MB, M) for _ in range(hk)])
    cols = np.stack([sizes(rng, NB, N) for _ in range(hk)])
    if rows[0, 1] == 0:  # block row 1 of head 0 holds rows, so the empty row shows
        a = int(np.argmax(rows[0]))
        rows[0, a] -= 1
        rows[0, 1] += 1
    return m, rows, cols


def visible(m, rows, cols, h, M, N, causal):
    """[M, N] bool of KV head h."""
    vis = np.zeros((M, N), bool)
    r0 = np.concatenate([[0], np.cumsum(rows[h])])
    c0 = np.concatenate([[0], np.cumsum(cols[h])])
    for a in range(m.shape[1]):
        for b in range(m.shape[2]):
            if m[h, a, b]:
                vis[r0[a]:r0[a + 1], c0[b]:c0[b + 1]] = True
    if causal:
        vis &= np.arange(N)[None, :] <= np.arange(M)[:, None] + N - M
    return vis


def reference(q, k, v, m, rows, cols, causal, cap=0.0, sinks=None, slopes=None, rope_theta=None):
    """Token-major q [M, hq, d], k, v [N, hk, d]: (out, natural lse) per head group."""
    M, hq, d = q.shape
    N, hk = k.shape[:2]
    g = hq // hk
    out = np.zeros((M, hq, d))
    lse = np.zeros((M, hq))
    for h in range(hk):
        vis = visible(m, rows, cols, h, M, N, causal)
        o, s = masked_attention(q[:, h * g:(h + 1) * g], k[:, h:h + 1], v[:, h:h + 1], vis,
                                cap=cap, sinks=None if sinks is None else sinks[h * g:(h + 1) * g],
                                slopes=None if slopes is None else slopes[h * g:(h + 1) * g],
                                rope_theta=rope_theta)
        out[:, h * g:(h + 1) * g] = o
        lse[:, h * g:(h + 1) * g] = s
    return out, lse


def to_side(x, fw, cuda):
    t = to_fw(x, fw)
    return t.cuda() if cuda else t


def run_case(ws, fw, rng, hq, hk, d, MB, NB, M, N, density, causal, layout, cap=0.0,
             with_sinks=False, dtype=np.float16, mode="NONE"):
    m, rows, cols = make_layout(rng, hk, MB, NB, M, N, density)
    q, k, v = rand(rng, (M, hq, d), dtype), rand(rng, (N, hk, d), dtype), rand(rng, (N, hk, d),
                                                                                  dtype)
    sinks = (rng.uniform(-1, 1, hq)).astype(np.float32) if with_sinks else None
    from flashkv.variants import alibi_slopes_for

    ref, ref_lse = reference(q, k, v, m, rows, cols, causal, cap, sinks,
                             alibi_slopes_for(hq) if mode == "ALIBI" else None,
                             500.0 if mode == "ROPE_LLAMA" else None)
    cuda = fw == "cuda"
    fw = "torch" if cuda else fw
    w = flashkv.VariableBlockSparseAttentionWrapper(ws, layout=layout)
    kw = dict(logits_soft_cap=cap or None, pos_encoding_mode=mode, rope_theta=500.0)
    if with_sinks:
        kw["sinks"] = to_side(sinks, fw, cuda)
    w.plan(to_fw(m, fw), to_fw(rows, fw), to_fw(cols, fw), hq, hk, d, causal=causal,
           q_data_type=np.dtype(dtype).name, **kw)
    hm = layout == "HND"
    arrange = (lambda x: np.ascontiguousarray(x.transpose(1, 0, 2))) if hm else (lambda x: x)
    out, lse = w.run(to_side(arrange(q), fw, cuda), to_side(arrange(k), fw, cuda),
                     to_side(arrange(v), fw, cuda), return_lse=True)
    out = np.asarray(out.cpu() if hasattr(out, "cpu") else out, np.float64)
    lse = np.asarray(lse.cpu() if hasattr(lse, "cpu") else lse, np.float64)
    if hm:
        assert out.shape == (hq, M, d) and lse.shape == (hq, M)
        out, lse = out.transpose(1, 0, 2), lse.T
    assert_close(out, ref, np.dtype(dtype).name)
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), fin) or with_sinks
    np.testing.assert_allclose(lse[fin], ref_lse[fin] * LOG2E, rtol=1e-3, atol=1e-3)
    if not with_sinks:
        assert (~fin).any(), "the empty block row must show"


CASES = [  # hq, hk, d, MB, NB, M, N, density, causal, layout, cap, sinks
    (8, 2, 64, 5, 4, 60, 80, 0.5, False, "HND", 0.0, False),
    (8, 2, 64, 5, 4, 60, 80, 0.5, True, "NHD", 0.0, False),
    (4, 1, 64, 4, 6, 50, 120, 0.4, True, "HND", 0.0, False),  # MQA, M != N
    (4, 4, 64, 3, 3, 40, 30, 1.0, True, "HND", 2.5, True),  # M > N, soft-cap + sinks
]


@pytest.mark.parametrize("case", CASES)
def test_matches_dense_masked_attention(fw, case):
    rng = np.random.default_rng(31 + CASES.index(case))
    hq, hk, d, MB, NB, M, N, dens, causal, layout, cap, sinks = case
    run_case(np.empty(1, np.uint8), fw, rng, hq, hk, d, MB, NB, M, N, dens, causal, layout, cap,
             sinks)


@pytest.mark.parametrize("mode", ["ALIBI", "ROPE_LLAMA"])
def test_alibi_and_rope_at_token_positions(fw, mode):
    rng = np.random.default_rng(57)
    run_case(np.empty(1, np.uint8), fw, rng, 8, 2, 64, 5, 4, 60, 80, 0.5, True, "HND", mode=mode)


def test_bad_layouts_are_named(fw):
    rng = np.random.default_rng(5)
    m, rows, cols = make_layout(rng, 2, 3, 4, 30, 40, 0.5)
    w = flashkv.VariableBlockSparseAttentionWrapper(np.empty(1, np.uint8))
    with pytest.raises(ValueError, match="block_mask_map: expected"):
        w.plan(to_fw(m[:1], fw), to_fw(rows, fw), to_fw(cols, fw), 4, 2, 64)
    with pytest.raises(ValueError, match="block_row_sz: expected"):
        w.plan(to_fw(m, fw), to_fw(rows[:, :2], fw), to_fw(cols, fw), 4, 2, 64)
    bad = rows.copy()
    bad[1, 0] += 1  # head 1's rows sum to M + 1
    with pytest.raises(ValueError, match="block_row_sz"):
        w.plan(to_fw(m, fw), to_fw(bad, fw), to_fw(cols, fw), 4, 2, 64)
    with pytest.raises(ValueError, match="before a successful plan"):
        w.run(rand(rng, (4, 30, 64), np.float16), rand(rng, (2, 40, 64), np.float16),
              rand(rng, (2, 40, 64), np.float16))
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        w.plan(to_fw(m, fw), to_fw(rows, fw), to_fw(cols, fw), 4, 2, 64, pos_encoding_mode="XPOS")


@requires_gpu
@pytest.mark.parametrize("case", CASES + [
    (32, 8, 128, 16, 16, 2048, 2048, 0.3, True, "HND", 0.0, False),
    (16, 2, 256, 6, 9, 500, 700, 0.5, False, "NHD", 0.0, False),
])
@pytest.mark.parametrize("mode", ["NONE", "ALIBI", "ROPE_LLAMA"])
def test_gpu_matches_dense_masked_attention(case, mode):
    import torch

    rng = np.random.default_rng(41 + len(case) + int(case[5]))
    hq, hk, d, MB, NB, M, N, dens, causal, layout, cap, sinks = case
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # FlashInfer's usual size
    run_case(ws, "cuda", rng, hq, hk, d, MB, NB, M, N, dens, causal, layout, cap, sinks,
             dtype=np.float16, mode=mode)
