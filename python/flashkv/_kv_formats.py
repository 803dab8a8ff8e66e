"""The quantized KV formats' names and run()'s group-scale arguments (flashkv.kv_quant has the
formats' description and the public quantizers). Private, so that _common (below _torch_ops) can
use it without importing a public module."""

from typing import NamedTuple

# Canonical names (flashkv::kv_format_name) and the spellings taken for them.
_FORMATS = {
    "e4m3-per-token": "e4m3", "e5m2-per-token": "e5m2",
    "int4-g32": "u8", "int4-g64": "u8", "int4-g128": "u8", "nvfp4": "u8",
}
_ALIASES = {"fp8_e4m3_per_token": "e4m3-per-token", "fp8_e5m2_per_token": "e5m2-per-token"}
FORMATS = tuple(_FORMATS)


def format_name(kv_data_type):
    """The canonical name of a quantized format given as ``kv_data_type``, or None (a dtype)."""
    if not isinstance(kv_data_type, str):
        return None
    name = _ALIASES.get(kv_data_type, kv_data_type)
    return name if name in _FORMATS else None


def is_format(name) -> bool:
    return name in _FORMATS


def value_dtype(name) -> str:
    """The element dtype a format's cache arrays have ("e4m3", "e5m2", "u8"); a dtype's own
    name for anything else."""
    return _FORMATS.get(name, name)


def is_packed(name) -> bool:
    return name in _FORMATS and _FORMATS[name] == "u8"


def has_zero_point(name) -> bool:
    return name.startswith("int4-")


class GroupScales(NamedTuple):
    """A quantized format's part of a run()'s scales (_common.kv_scales' `group`)."""

    format: str = ""
    k_group: object = None
    v_group: object = None
    k_zero: object = None
    v_zero: object = None


def group_scales(plan_kv_dtype, k_group_scale=None, v_group_scale=None, k_zero=None,
                 v_zero=None) -> GroupScales:
    """run()'s group-scale arguments against the plan's kv_data_type: required (and only taken)
    with a quantized format, zero points only for INT4. ValueError naming the argument; shapes,
    dtypes and values are the C++ checks' (paged_kv.scale.*)."""
    given = {"k_group_scale": k_group_scale, "v_group_scale": v_group_scale, "k_zero": k_zero,
             "v_zero": v_zero}
    if not is_format(plan_kv_dtype):
        for name, x in given.items():
            if x is not None:
                raise ValueError(
                    f"{name}: group scales belong to a quantized kv_data_type "
                    f"({', '.join(FORMATS)}); the plan's is {plan_kv_dtype}")
        return GroupScales()
    wanted = ["k_group_scale", "v_group_scale"]
    if has_zero_point(plan_kv_dtype):
        wanted += ["k_zero", "v_zero"]
    for name in wanted:
        if given[name] is None:
            raise ValueError(f"{name}: the plan's kv_data_type {plan_kv_dtype} needs it (its "
                             f"scale pool, the cache's shape with head_dim -> groups)")
    for name in ("k_zero", "v_zero"):
        if name not in wanted and given[name] is not None:
            raise ValueError(f"{name}: {plan_kv_dtype} has no zero points: expected None")
    return GroupScales(plan_kv_dtype, k_group_scale, v_group_scale, k_zero, v_zero)
