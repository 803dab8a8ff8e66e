"""``flashinfer.mla``: flashkv's MLA wrapper where this flashkv has one (flashkv.mla), else
stand-ins raising NotImplementedError."""

__path__ = []  # a package to importers: flashinfer.<this>.<sub> resolves to a stand-in

from ._missing import missing


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        from ... import mla  # another helper's module; absent in this flashkv: stand-ins
    except ImportError:
        return missing(f"flashinfer.mla.{name}", "MLA attention")
    value = getattr(mla, name, None)
    return missing(f"flashinfer.mla.{name}") if value is None else value
