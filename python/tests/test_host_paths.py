"""The per-call host paths an engine pays on every layer (flashkv._array_core.dl, the memo of
_common.kv_scales, _step.StepTracker): their fast paths give what the general paths give, and
what the general paths refuse is still refused, with the same errors."""

import numpy as np
import pytest

import flashkv._array_core as A
import flashkv._common as C
from flashkv.integrations import _step

torch = pytest.importorskip("torch")
from torch.utils.dlpack import from_dlpack  # noqa: E402


def _roundtrip(x):
    return from_dlpack(A.dl(x))


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4),
    lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # strided view
    lambda: torch.ones(5, dtype=torch.bfloat16, requires_grad=True),
    lambda: torch.nn.Parameter(torch.ones(4)),  # a subclass: torch's own __dlpack__
    lambda: torch.zeros(0, dtype=torch.int32),
])
def test_dl_torch_tensors_share_memory(make):
    x = make()
    y = _roundtrip(x)
    assert y.data_ptr() == x.data_ptr() and y.shape == x.shape and y.stride() == x.stride()
    assert y.dtype == x.dtype and torch.equal(y, x.detach())


def test_dl_refusals_are_torchs():
    sparse = torch.eye(3).to_sparse()
    with pytest.raises((BufferError, RuntimeError)):
        A.dl(sparse)


def test_dl_scalars_and_host_arrays_pass_unchanged():
    for v in (1, 2.5, True, "NHD", None):
        assert A.dl(v) is v
    a = np.arange(4, dtype=np.int32)
    assert A.dl(a) is a


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_dl_fp8_arrays_are_retyped_views(name):
    if not hasattr(torch, name):
        pytest.skip(f"torch has no {name}")
    x = torch.zeros(4, 2, dtype=getattr(torch, name))
    c = A.dl(x)
    assert c is not x and type(c).__name__ != "Tensor"  # the retyped uint8 capsule
    ml = pytest.importorskip("ml_dtypes")
    h = np.zeros(3, dtype=getattr(ml, name))
    assert A.dl(h) is not h
    assert A.dl(np.zeros(3, dtype=ml.bfloat16)).dtype == ml.bfloat16  # not fp8: unchanged


def test_kv_scales_memo_equals_the_check_and_keeps_refusing():
    fp8 = torch.zeros(2, 4, 2, 8, dtype=torch.float8_e4m3fn)
    bf16 = torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16)
    for _ in range(2):  # the second call reads the memo
        s = C.kv_scales(0.5, 2.0, fp8, 2)
        assert (s.k, s.v, s.k_tensor, s.v_tensor) == (0.5, 2.0, None, None)
        assert C.kv_scales(1.0, 1.0, bf16, 2).is_identity
        assert C.kv_scales(1, None, fp8, 2).k == 1.0
    for _ in range(2):  # refusals are never memoized
        with pytest.raises(ValueError, match="k_scale=2.0"):
            C.kv_scales(2.0, 1.0, bf16, 2)
        with pytest.raises(ValueError, match="finite scale"):
            C.kv_scales(float("nan"), 1.0, fp8, 2)
        with pytest.raises(ValueError, match="finite scale"):
            C.kv_scales(0.0, 1.0, fp8, 2)
    with pytest.raises(ValueError):  # bool is not a scale (no memo by value: True == 1)
        C.kv_scales(True, 1.0, fp8, 2)


def test_step_tracker_versions_of_tensors_among_lists():
    t = _step.StepTracker()
    cu = torch.zeros(3, dtype=torch.int32)
    lst = [cu]
    objs = (cu, lst)
    t.new_step(0, objs, ("sig",))
    assert t.is_same_step(1, objs, ("sig",))
    assert not t.is_same_step(1, objs, ("sig",))  # layer 1 asks twice: a new step
    assert t.is_same_step(2, objs, ("sig",))
    cu.add_(1)  # the engine refills its buffer in place
    assert not t.is_same_step(3, objs, ("sig",))
    t.new_step(3, objs, ("sig",))
    assert t.is_same_step(4, objs, ("sig",))
    assert not t.is_same_step(5, (cu, [cu]), ("sig",))  # another list object
    assert not t.is_same_step(5, objs, ("other",))
    assert not t.is_same_step(5, objs[:1], ("sig",))
    with torch.inference_mode():
        inf = torch.zeros(2)
    t.new_step(0, (inf,), ())  # no version counter: identity decides
    assert t.is_same_step(1, (inf,), ())
