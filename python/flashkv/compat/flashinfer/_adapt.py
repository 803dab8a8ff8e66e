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
