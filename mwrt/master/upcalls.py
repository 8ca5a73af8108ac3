"""Up-calls: a lower module's names for the few functions of a layer above it.

A handle's methods issue ops, and issuing makes handles: the class stands below the verbs
(tensor.py below issue.py, transfer.py, arrayfunc.py), and the one-node constructors below
the mesh's. Where a lower module must call up, it names the function with `unbound()`, and
mwrt.master (its __init__.py) binds every such name once, as it loads, before any handle
exists. The stand-in says so if it is ever called unbound.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any


class Unbound:
    """A stand-in for an up-call that mwrt.master has not bound (yet)."""

    def __init__(self, name: str, provider: str) -> None:
        self.name, self.provider = name, provider

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.name}: not bound (expected {self.provider}'s, bound by "
                           "mwrt.master as it loads); import mwrt, not one of its modules alone")


def unbound(name: str, provider: str) -> Callable[..., Any]:
    """A module-level name for `provider`'s function, bound by mwrt.master at import."""
    return Unbound(name, provider)


def bind(module: ModuleType, **functions: Any) -> None:
    """Give `module` the functions it named with unbound()."""
    for name, function in functions.items():
        if not isinstance(getattr(module, name, None), Unbound):
            raise TypeError(f"bind: {module.__name__}.{name} is not an up-call (expected "
                            "a name the module set with unbound())")
        setattr(module, name, function)
