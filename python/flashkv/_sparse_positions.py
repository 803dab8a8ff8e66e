"""FlashInfer's pos_encoding_mode for the block-sparse wrappers (sparse.py, variable_sparse.py):
ALiBi and RoPE at the tokens' own positions (C++ BlockSparseOptions::alibi_slopes / rope)."""

from .variants import _alibi_slopes_on


def positional(pos_encoding_mode, num_qo_heads, rope_scale, rope_theta, on_gpu, like):
    """The C++ plan's ALiBi / RoPE arguments for FlashInfer's pos_encoding_mode: (alibi_slopes
    or None, rope mode, rope_scale, rope_theta). Both act at the tokens' own positions (query row
    m at m + N - M, key n at n), however the layout gathers the keys."""
    if pos_encoding_mode == "NONE":
        return None, "none", 1.0, 1e4
    if pos_encoding_mode == "ALIBI":
        return _alibi_slopes_on(int(num_qo_heads), on_gpu, like), "none", 1.0, 1e4
    if pos_encoding_mode == "ROPE_LLAMA":
        return (None, "llama", float(1.0 if rope_scale is None else rope_scale),
                float(1e4 if rope_theta is None else rope_theta))
    raise ValueError(f"pos_encoding_mode: expected 'NONE', 'ROPE_LLAMA' or 'ALIBI', got "
                     f"{pos_encoding_mode!r}")
