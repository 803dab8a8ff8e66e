"""Adapters that make flashkv the attention backend of serving engines.

* :mod:`flashkv.integrations.transformers`: Hugging Face transformers' continuous batching
  (``attn_implementation="paged|flashkv"``) and ``generate()`` (``"flashkv"``).

Each adapter imports its engine only when used; ``import flashkv`` never does.
"""
