"""flashkv._C's plan structs on any machine: the options and shapes the plan() bindings take, the
PlanInfo classes the wrappers' plan_info() dicts come from, the page-table names of the C++
checks, and the fixed-split chunk count the decode wrapper sizes its workspace by."""

import numpy as np
import pytest

from flashkv import _C
from flashkv import _common as C


def test_shape_and_options_round_trip():
    shape = C.make(_C.AttentionShape, num_qo_heads=8, num_kv_heads=2, head_dim=64,
                   q_dtype="bfloat16", kv_dtype="e4m3", o_dtype="bf16")
    assert shape.to_dict() == dict(num_qo_heads=8, num_kv_heads=2, head_dim=64, q_dtype="bf16",
                                   kv_dtype="e4m3", o_dtype="bf16", kv_format="")
    shape.kv_dtype, shape.kv_format = "u8", "int4-g64"  # a quantized format (flashkv.kv_quant)
    assert (shape.kv_dtype, shape.kv_format) == ("u8", "int4-g64")
    o = C.make(_C.PrefillPlanOptions, causal=True, backend="fa3", tile_rows=64)
    assert (o.causal, o.backend, o.tile_rows, o.sm_scale) == (True, "fa3", 64, 0.0)
    assert C.make(_C.CascadePlanOptions, use="never").to_dict()["use"] == "never"
    assert _C.DecodePlanOptions().to_dict()["enable_pdl"] is True  # the C++ defaults
    with pytest.raises(ValueError, match="backend: expected 'auto', 'fa2' or 'fa3'"):
        o.backend = "fa4"
    with pytest.raises(ValueError, match="use_cascade: expected"):
        C.make(_C.CascadePlanOptions, use="sometimes")
    with pytest.raises(AttributeError):
        C.make(_C.DecodePlanOptions, no_such_field=1)


def test_plan_info_dicts_have_the_old_keys():
    assert set(_C.DecodePlanInfo().to_dict()) >= {
        "num_ctas", "num_work_items", "num_split_tiles", "num_partial_states", "slot_capacity",
        "split_limited", "chunk_bound", "plan_us", "schedule_us", "tensor_cores", "ctas_per_sm",
        "warps"}
    assert set(_C.PrefillPlanInfo().to_dict()) == {
        "num_ctas", "num_work_items", "num_split_tiles", "num_partial_states", "slot_capacity",
        "split_limited", "tile_rows", "chunk_bound", "wgmma", "kv_tma", "plan_us"}
    assert set(_C.CascadePlanInfo().to_dict()) == {
        "num_levels", "cascade", "plain_kv_bytes", "cascade_kv_bytes", "estimated_plain_us",
        "estimated_cascade_us", "num_split_tiles", "split_limited", "plan_us"}


def test_host_checks_name_the_wrappers_arguments():
    shape = C.make(_C.AttentionShape, num_qo_heads=4, num_kv_heads=2, head_dim=64)
    names = C.page_table_names(kv_indptr="indptr", kv_indices="indices",
                               kv_last_page_len="last_page_len")
    indptr, last = np.array([0, 2, 1], np.int32), np.array([3, 3], np.int32)
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1: expected >= indptr\[1\] = 2"):
        _C.check_host_decode_plan(indptr, last, None, 16, shape, names)
    ids = np.array([0, 5, 1], np.int32)
    assert _C.check_host_decode_plan(np.array([0, 2, 3], np.int32), last, ids, 16, shape,
                                     names) == (5, 1)


def test_fixed_split_chunks():
    # kv_lens 40, 0 (no pages) and 16 in pages of 16, chunks of 16: 3 + 0 + 1.
    indptr, last = np.array([0, 3, 3, 4], np.int32), np.array([8, 1, 16], np.int32)
    assert _C.BatchDecode.fixed_split_chunks(indptr, last, 16, 16) == 4
    assert _C.BatchDecode.fixed_split_chunks(indptr, last, 16, 0) == 0
    # Unchecked input counts no negative lengths (plan() names the bad entry later).
    assert _C.BatchDecode.fixed_split_chunks(np.array([0, 2, 1], np.int32),
                                             np.array([1, 1], np.int32), 16, 8) == 3
