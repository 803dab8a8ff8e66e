"""Where FlashInfer 0.6's API and flashkv's differ in behaviour, the namespace's wrappers adapt:

- ``k_scale`` / ``v_scale`` (floats) on a 16-bit cache: FlashInfer scales the logits by k_scale
  and the output by v_scale; flashkv takes scales only for fp8 caches (it asks the caller to fold
  them). Here q is scaled by k_scale before the run (q.k * s = (q * s).k) and the output by
  v_scale after it (attention is linear in V): FlashInfer's numbers, one rounding of q to its
  dtype more.
- ``_plan_info`` (FlashInfer's private plan state, which its tests read): None before a plan.
"""

import numbers

from ... import _array_core as A


def _is_float_scale(s):
    return isinstance(s, numbers.Real) and not isinstance(s, bool)


def fold_16bit_scales(q, cache_k, k_scale, v_scale):
    """(q, k_scale, v_scale, v_factor) for a run: on a 16-bit cache float scales other than 1
    move into q (k) and into a factor for the output (v)."""
    check_q_dtype(q.dtype, "q")
    check_kv_dtype(cache_k.dtype, "paged_kv_cache")
    if A.array_dtype(cache_k) in A.FP8_DTYPES:
        return q, k_scale, v_scale, None
    v_factor = None
    if _is_float_scale(k_scale) and float(k_scale) != 1.0:
        q = q * float(k_scale)
        k_scale = None
    if _is_float_scale(v_scale) and float(v_scale) != 1.0:
        v_factor = float(v_scale)
        v_scale = None
    return q, k_scale, v_scale, v_factor


def scale_output(result, v_factor):
    """The run's result with its output times v_factor (in place; lse unchanged)."""
    if v_factor is None:
        return result
    out = result[0] if isinstance(result, tuple) else result
    out *= v_factor
    return result


class PlanInfoMixin:
    @property
    def _plan_info(self):
        """FlashInfer's wrappers keep their plan here (its tests check it is set)."""
        return None if self._plan is None else self.plan_info()


SUPPORTED_HEAD_DIMS = (64, 128, 256)  # flashkv's kernels (include/flashkv/plan_checks.h)


def check_head_dim(head_dim, name="head_dim"):
    """A head_dim FlashInfer runs and flashkv's kernels do not (80, 96, 192, 512, ...) is a
    missing feature (issue 43: head_dim generalisation), not a bad argument: NotImplementedError
    naming it. (flashkv itself raises ValueError: its supported set is its contract.)"""
    if head_dim is not None and int(head_dim) not in SUPPORTED_HEAD_DIMS:
        raise NotImplementedError(
            f"{name}={int(head_dim)}: flashkv's kernels take head_dim 64, 128 or 256; other "
            f"head dims are not implemented yet (issue 43)")


def check_q_dtype(dtype, name="q_data_type"):
    """FP8 queries (FlashInfer's fp8 attention) are a missing feature: NotImplementedError."""
    if dtype is None:
        return
    try:
        dt = A.dtype_name(dtype)
    except ValueError:
        return  # flashkv's own check names it
    if dt in A.FP8_DTYPES:
        raise NotImplementedError(f"{name}={dtype}: FP8 queries are not implemented by flashkv "
                                  f"(float8 KV caches are: q float16 / bfloat16)")


def check_kv_dtype(dtype, name="kv_data_type"):
    """A uint8 KV cache is FlashInfer's NVFP4 (packed fp4 + scale factors): NotImplementedError."""
    if dtype is not None and str(dtype).replace("torch.", "") == "uint8":
        raise NotImplementedError(f"{name}={dtype}: NVFP4 KV caches are not implemented by "
                                  f"flashkv (fp8 and 16-bit caches are)")


def plan_with_head_dim_check(method, position, name):
    """plan() that checks its head_dim argument (positional index `position` after self, or the
    keyword `name`) with check_head_dim first."""
    import functools

    @functools.wraps(method)
    def plan(self, *args, **kwargs):
        value = kwargs.get(name, args[position] if len(args) > position else None)
        check_head_dim(value, name)
        check_q_dtype(kwargs.get("q_data_type"))
        check_q_dtype(kwargs.get("o_data_type"), "o_data_type")
        check_kv_dtype(kwargs.get("kv_data_type"))
        return method(self, *args, **kwargs)

    return plan
