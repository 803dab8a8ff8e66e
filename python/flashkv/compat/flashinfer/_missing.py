"""Stand-ins for what the namespace does not implement: using one raises NotImplementedError
naming the FlashInfer feature, so a FlashInfer program (or test) fails where it needs it, with
the reason, not at import."""

import types


def missing(feature: str, why: str = ""):
    """A stand-in for FlashInfer's `feature`: calling, instantiating or reading an attribute of it
    raises NotImplementedError naming it."""
    return _Missing(feature, why)


def _message(feature, why):
    return (f"flashkv.compat.flashinfer: {feature} is not implemented by flashkv"
            + (f" ({why})" if why else "") + " (issue 43 lists what is missing)")


class _Missing:
    def __init__(self, feature, why):
        self._feature, self._why = feature, why

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(_message(self._feature, self._why))

    def __getattr__(self, name):
        if name.startswith("_"):  # private and dunder lookups (pytest's, copy's) find nothing
            raise AttributeError(name)
        return _Missing(f"{self._feature}.{name}", self._why)

    def __repr__(self):
        return f"<flashkv.compat missing {self._feature}>"

    # Used in annotations (`Missing | None`, `Missing[int]`) or as a base class at import time:
    # still a stand-in; only using it raises.
    def __or__(self, other):
        return self

    __ror__ = __or__

    def __getitem__(self, item):
        return self

    def __mro_entries__(self, bases):
        feature, why = self._feature, self._why

        class MissingBase:
            def __init__(self, *args, **kwargs):
                raise NotImplementedError(_message(feature, why))

        return (MissingBase,)


class StubModule(types.ModuleType):
    """A FlashInfer submodule flashkv lacks (flashinfer.cute_dsl, flashinfer.xqa, ...): every
    attribute is a stand-in (`missing`), every submodule another StubModule."""

    def __init__(self, name):
        super().__init__(name)
        self.__path__ = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return missing(f"{self.__name__}.{name}")


def module_getattr(module_name, why=""):
    """A module-level __getattr__ answering FlashInfer names the module lacks with stand-ins."""

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return missing(f"{module_name}.{name}", why)

    return __getattr__
