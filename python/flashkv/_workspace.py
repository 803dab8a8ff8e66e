"""The C++ plan/run object behind a wrapper, created at plan() time inside the caller's workspace.

flashkv's BatchDecode / BatchPrefill* / MultiLevelCascade objects are made for a configuration
(requests, query tokens, pages, heads, head_dim) and take any buffer of at least
``min_workspace_bytes(cfg)`` (the plan arrays); ``workspace_bytes(cfg)`` is the size that never
limits split-KV. FlashInfer's wrappers take one user buffer (128 MB is usual; its tests use 16-32
MB) and size nothing up front. This bridges the two: each plan() asks for a configuration that
covers it; the object is (re)created only when the plan needs more than the current one, with the
request, token and page counts rounded up to a power of two when the buffer allows (so a growing
batch re-creates it a few times, not every step), and always over the whole buffer: what the plan
arrays leave holds the split-KV partial states, and each plan fits its splits into them (fewer,
longer chunks when the buffer is short; ``plan_info()["split_limited"]`` says so). Only a plan
whose arrays alone exceed the buffer raises ValueError, naming the bytes it needs at least.

Under CUDA graphs the object is created once, at the first plan(), and never re-created: a
captured graph holds pointers into it.
"""

from . import _C
from . import _arrays as A
from . import _common as C

# Configuration fields that are counts (rounded up for headroom); the others are exact maxima.
_COUNTS = ("max_batch", "max_qo_tokens", "max_pages", "max_kv_tokens")


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class OpSlot:
    """Holds the C++ op (cls: _C.BatchDecode / BatchPrefillPaged / BatchPrefillRagged /
    MultiLevelCascade) for one wrapper and its workspace buffer (a CUDA array)."""

    def __init__(self, cls, workspace, device: int, frozen: bool):
        self.cls = cls
        self.device = device
        self.frozen = frozen  # CUDA graph mode: never re-create after the first plan
        self.op = None
        self.cfg = None
        self.reset(workspace)

    def reset(self, workspace):
        check_alignment(workspace, "float_workspace_buffer")
        self.release()
        self.workspace = workspace
        self.nbytes = int(workspace.nbytes) if hasattr(workspace, "nbytes") else (
            workspace.numel() * workspace.element_size())

    def release(self):
        if self.op is not None:
            # Runs enqueued on any stream may still read the old object's workspace.
            _C.device_synchronize(self.device)
        self.op = None
        self.cfg = None

    def _min_bytes(self, cfg) -> int:
        return self.cls.min_workspace_bytes(**cfg, device=self.device)

    def acquire(self, need: dict, what: str, exact_fields=()):
        """The op, re-created if `need` (config field -> value) exceeds the current config, or
        differs from it in one of `exact_fields` (a mode, such as the decode cascade's
        max_qo_tokens = 0: taken as given, never rounded or kept from an earlier plan). `what`
        describes the plan for error messages."""
        # A field the current config lacks (an optional one, e.g. decode's max_kv_tokens) is 0.
        def fits(k, v):
            have = self.cfg.get(k, 0)
            return have == v if k in exact_fields else have >= v

        if self.op is not None and all(fits(k, v) for k, v in need.items()):
            return self.op
        if self.op is not None and self.frozen:
            over = ", ".join(f"{k} {v} {'!=' if k in exact_fields else '>'} {self.cfg.get(k, 0)}"
                             for k, v in need.items() if not fits(k, v))
            raise ValueError(
                f"plan: {over}: in CUDA graph mode the wrapper is sized by its first plan() "
                f"(and the buffers given to the constructor); create another wrapper for a larger "
                f"configuration")
        # Grown to cover the current config too (fields `need` leaves out are kept as they are).
        # Every field grows with the need (decode's min_fixed_split_size is always 1: decode.py).
        exact = dict(need) if self.cfg is None else {**self.cfg, **{
            k: (v if k in exact_fields else max(v, self.cfg.get(k, 0))) for k, v in need.items()}}
        roomy = {k: (_pow2(v) if k in _COUNTS and k not in exact_fields and not self.frozen
                     else v)
                 for k, v in exact.items()}
        required = None
        for cfg in (roomy, exact):
            required = self._min_bytes(cfg)
            if required <= self.nbytes:
                break
        else:
            full = self.cls.workspace_bytes(**exact, device=self.device)
            raise ValueError(
                f"float_workspace_buffer: {self.nbytes} bytes is too small for this plan "
                f"({what}): flashkv needs at least {required} bytes "
                f"({self.cls.__name__}.min_workspace_bytes of {exact}: the plan arrays, with no "
                f"room to split KV; {full} bytes never limit splitting); pass a larger buffer")
        self.release()
        self.op = A.call(self.cls, self.workspace, **cfg, device=self.device)
        self.cfg = cfg
        return self.op


WORKSPACE_ALIGNMENT = 16  # bytes: FlashInfer 0.6's rule, and the plan arrays' vector loads


def data_ptr(buf) -> int:
    """The address of an array's first element (torch, CuPy, NumPy; 0 when unknown)."""
    fw = A.framework(buf)
    if fw == "torch":
        return int(buf.data_ptr())
    if fw == "cupy":
        return int(buf.data.ptr)
    if fw == "numpy":
        return int(buf.ctypes.data)
    return 0


def check_alignment(buf, name: str):
    """ValueError naming `name` unless buf starts on a WORKSPACE_ALIGNMENT-byte boundary."""
    ptr = data_ptr(buf)
    if ptr % WORKSPACE_ALIGNMENT:
        raise ValueError(f"{name} must be {WORKSPACE_ALIGNMENT}-byte aligned (it starts at "
                         f"{ptr:#x}, {ptr % WORKSPACE_ALIGNMENT} bytes past a boundary); pass a "
                         f"buffer from torch.empty or a slice at a multiple of "
                         f"{WORKSPACE_ALIGNMENT} bytes")


# FlashInfer 0.6's workspace_size() returns (float, int) sizes; flashkv needs no int workspace, and
# reports this nominal size for the int buffer FlashInfer's callers allocate anyway.
INT_WORKSPACE_BYTES = 16


def bytes_for(wrapper, cls, need: dict) -> int:
    """The float workspace bytes `wrapper` needs for a plan asking for `need` (OpSlot.acquire's
    configuration) of the C++ op `cls`: its workspace_bytes (the plan arrays plus every split-KV
    partial state, so an exact buffer never limits splitting) on the wrapper's device, or the
    host path's rule (_common.host_workspace_need_bytes) for a host wrapper."""
    if not wrapper._on_gpu:
        return C.host_workspace_need_bytes(cls, need)
    return int(cls.workspace_bytes(**need, device=wrapper._device))


# own_slot's slots: (op class, device) -> OpSlot.
_OWN_SLOTS = {}


def own_slot(cls, like, need: dict, what: str) -> OpSlot:
    """A slot whose op (cls) lives in a workspace of its own, one per (cls, device of `like`), for
    the single-request calls that get no workspace from the caller. The workspace only grows: it
    covers `need` and every earlier call's configuration, so alternating shapes never re-allocate.
    The op is slot.op; the slot also keeps arrays a launched kernel still reads."""
    dev = A.device_index(like)
    slot = _OWN_SLOTS.get((cls, dev))
    cfg = dict(need)
    if slot is not None and slot.cfg is not None:
        cfg = {key: max(val, slot.cfg[key]) for key, val in cfg.items()}
    nbytes = cls.workspace_bytes(**cfg, device=dev)
    if slot is None or slot.nbytes < nbytes:
        if slot is not None:
            slot.release()
        slot = OpSlot(cls, A.empty(like, ((nbytes + 3) // 4,), "f32"), dev, frozen=False)
        _OWN_SLOTS[(cls, dev)] = slot
    slot.acquire(need, what)
    return slot


def reset_workspace_buffer(wrapper, float_workspace_buffer, int_workspace_buffer=None):
    """The body the wrappers' reset_workspace_buffer share: the new buffer must be on the same side
    (host or CUDA); the C++ object is re-created in it and the plan dropped (call plan() again).
    Both buffers must be 16-byte aligned, as FlashInfer 0.6 requires (ValueError naming the
    buffer); flashkv keeps everything in the float one and only checks the int one."""
    check_alignment(float_workspace_buffer, "float_workspace_buffer")
    if int_workspace_buffer is not None:
        check_alignment(int_workspace_buffer, "int_workspace_buffer")
    if A.is_cuda(float_workspace_buffer) != wrapper._on_gpu:
        raise ValueError("float_workspace_buffer: the new buffer must be on the same side "
                         "(host or CUDA) as the old one")
    wrapper._float_workspace_buffer = float_workspace_buffer
    if wrapper._slot is not None:
        wrapper._slot.reset(float_workspace_buffer)
    wrapper._plan = None
