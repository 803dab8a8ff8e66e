"""Compatibility namespaces for code written against other attention libraries.

:mod:`flashkv.compat.flashinfer` maps FlashInfer 0.6's attention API (decode, prefill paged /
ragged / single, cascade, page, rope, sparse, fp8 arguments) onto flashkv; anything flashkv does
not implement raises NotImplementedError naming the feature. To run unchanged FlashInfer code::

    import flashkv.compat
    flashkv.compat.install_as_flashinfer()   # `import flashinfer` now imports the namespace
    import flashinfer

``install_as_flashinfer()`` puts the namespace and its submodules into ``sys.modules`` under
``flashinfer`` / ``flashinfer.<sub>`` (an import hook answers the other ``flashinfer.*``
submodules with stand-ins whose attributes raise NotImplementedError when used); it refuses to
replace a real FlashInfer that is already imported unless ``force=True``.
"""

import importlib.abc
import importlib.machinery
import sys

_SUBMODULES = ("attention", "cascade", "decode", "jit", "mla", "page", "prefill", "quantization",
               "rope", "sparse", "testing", "utils")


class _MissingFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import flashinfer.<anything else>` with a stand-in module (_missing.StubModule)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("flashinfer.") and sys.modules.get("flashinfer") is _namespace():
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        from .flashinfer import _missing

        return _missing.StubModule(spec.name)

    def exec_module(self, module):
        return None


_FINDER = _MissingFinder()


def _namespace():
    from . import flashinfer  # imports its submodules too

    return flashinfer


def install_as_flashinfer(force=False):
    """Make ``import flashinfer`` (and ``flashinfer.decode``, ...) import
    :mod:`flashkv.compat.flashinfer`. Returns the namespace. Raises RuntimeError if a real
    FlashInfer is imported already (``force=True`` replaces it)."""
    ns = _namespace()
    have = sys.modules.get("flashinfer")
    if have is not None and have is not ns and not force:
        raise RuntimeError("install_as_flashinfer: a FlashInfer module is imported already "
                           f"({getattr(have, '__file__', have)!r}); pass force=True to replace it")
    sys.modules["flashinfer"] = ns
    for name in _SUBMODULES:
        sys.modules[f"flashinfer.{name}"] = getattr(ns, name)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    return ns


def uninstall_flashinfer():
    """Undo install_as_flashinfer (the namespace's modules leave sys.modules)."""
    ns = _namespace()
    for key in [k for k in sys.modules if k == "flashinfer" or k.startswith("flashinfer.")]:
        mod = sys.modules[key]
        if mod is ns or getattr(mod, "__name__", "").startswith("flashkv.compat.flashinfer") or \
                type(mod).__name__ == "StubModule":
            del sys.modules[key]
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
