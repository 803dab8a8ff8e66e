"""``flashinfer.page`` on flashkv."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

from ... import page as _pg
from ._missing import missing, module_getattr

__getattr__ = module_getattr("flashinfer.page")

append_paged_kv_cache = _pg.append_paged_kv_cache
get_batch_indices_positions = _pg.get_batch_indices_positions
get_seq_lens = _pg.get_seq_lens
append_paged_mla_kv_cache = missing("flashinfer.page.append_paged_mla_kv_cache", "MLA caches")
