"""The op registry itself: `Spec`, `Op`, `register`, the lookups and the memo of meta rules.

The rule modules (elementwise, reductions, ...) import this module and register their ops;
the package's __init__ imports them and re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Spec(NamedTuple):
    """What the master knows of a tensor: shape and dtype."""

    shape: tuple
    dtype: np.dtype


UNKNOWN = "unknown"  # meta result whose shape depends on the data


@dataclass(frozen=True)
class Op:
    """One registry entry."""

    name: str
    impl: Callable
    meta: Callable
    inplace: bool = False  # mutates its first argument, makes no new tensor
    # The result's Spec depends only on argument Specs and scalar types (not scalar values),
    # so the master may remember it: true of ufuncs under NumPy 2's promotion rules.
    by_type: bool = False
    doc: str = ""  # one line: what it computes (the generated tensor methods show it)
    # impl returns the new tensors to store, checked against its own rule (torch's ops: what
    # they make is known from torch's meta device, not from a Spec rule)
    own_results: bool = False
    # A 0-d result is a NumPy scalar, as ufuncs' and reductions' are: immutable, so a view of
    # it is of a copy and augmented assignment makes a new value (NumPy's a0 + a0 is a float64);
    # a function of the op's arguments (Specs for tensors) where that depends on them; KEEPS
    # where it is one when the first argument is (a NumPy scalar's astype, copy, reshape)
    scalar: bool | Callable[..., bool] | str = False


KEEPS = "keeps"  # Op.scalar: a 0-d result is a scalar when the op's first argument is one


_OPS: dict[str, Op] = {}


def register(name: str, impl: Callable, meta: Callable, *, inplace: bool = False,
             by_type: bool = False, doc: str = "", own_results: bool = False,
             scalar: bool | Callable[..., bool] | str = False) -> Op:
    """Add (or replace) op `name`; `doc` defaults to the summary of NumPy's function `name`."""
    op = Op(name, impl, meta, inplace, by_type, doc or _numpy_doc(name, inplace), own_results,
            scalar)
    _OPS[name] = op
    return op


def gives_scalars(op: Op, args: tuple, kwargs: dict) -> bool:
    """Whether op's 0-d results are NumPy scalars for these arguments (Specs for tensors)."""
    scalar = op.scalar
    return scalar is True or (callable(scalar) and scalar(*args, **kwargs))


def summary(func) -> str:
    """The one-line summary of a NumPy function's docstring (its signature line skipped)."""
    name = getattr(func, "__name__", "")
    for paragraph in (getattr(func, "__doc__", None) or "").split("\n\n"):
        text = " ".join(paragraph.split())
        if text and not text.startswith(f"{name}(") and not text.startswith(".."):
            return text.split(". ")[0].rstrip(".") + "."
    return ""


def _numpy_doc(name: str, inplace: bool) -> str:
    func = getattr(np, name.rstrip("_"), None)
    text = summary(func) if func is not None else ""
    if not text:
        return f"NumPy's {name} on the tensor's worker."
    return f"In place: {text[0].lower()}{text[1:]}" if inplace else text


def doc(name: str) -> str:
    """Op `name`'s one-line description."""
    return get(name).doc


def get(name: str) -> Op:
    """The op called `name`; a miss says how to find the known ones."""
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"op: unknown op {name!r} ({len(_OPS)} known; see mwrt.ops.names())") \
            from None


_MEMO: dict = {}
_SCALARS = (int, float, bool, complex)
_UNITED = frozenset((np.datetime64, np.timedelta64))  # NumPy scalars whose type is not a dtype


def infer(op: Op, args: tuple, kwargs: dict):
    """`op`'s meta rule on Specs, remembered (the master runs it for every op it issues, the
    worker to check each result): by argument types for ops whose result depends only on
    them, else by the arguments' values where they are plain (axes, shapes, dtypes, ints)."""
    if not op.by_type or kwargs:
        key = _value_key(op.name, args, kwargs)
        if key is None:
            return op.meta(*args, **kwargs)
        return _remember(key, op, args, kwargs)
    if len(args) == 2:  # a binary ufunc, nearly every such op: its key without a loop
        a, b = args
        key = (op.name, a if type(a) is Spec else type(a), b if type(b) is Spec else type(b))
    else:
        key = (op.name, *[a if type(a) is Spec else type(a) for a in args])
    if not _UNITED.isdisjoint(key):  # a datetime's unit decides too, not its type alone
        key = (*key, *[a.dtype for a in args if type(a) in _UNITED])
    result = _MEMO.get(key)
    if result is None:
        # a NumPy scalar's dtype, not its value, decides (NEP 50): its type is the key
        if not all(type(a) is Spec or type(a) in _SCALARS or isinstance(a, np.generic)
                   for a in args):
            return op.meta(*args)
        result = _MEMO[key] = op.meta(*args) or False
        if len(_MEMO) > 100_000:
            _MEMO.clear()
    return result or None


def _remember(key, op: Op, args: tuple, kwargs: dict):
    result = _MEMO.get(key)
    if result is None:
        result = _MEMO[key] = op.meta(*args, **kwargs) or False
        if len(_MEMO) > 100_000:
            _MEMO.clear()
    return result or None


# Values a meta rule may be remembered by; each with its type in the key (1, 1.0 and True
# are equal and hash alike, but promote differently).
_PLAIN = frozenset((int, float, bool, complex, str, type(None)))


def _value_key(name: str, args: tuple, kwargs: dict):
    """A hashable key of (name, args, kwargs), or None where a value is not plain."""
    parts: list = [name]
    for value in args:
        kind = type(value)
        part = (kind, value) if kind is Spec or kind in _PLAIN else _plain(value)
        if part is None:
            return None
        parts.append(part)
    if kwargs:
        for key, value in kwargs.items():
            kind = type(value)
            part = (kind, value) if kind in _PLAIN else _plain(value)
            if part is None:
                return None
            parts.append((key, part))
    return tuple(parts)


def _plain(value):
    kind = type(value)
    if kind is Spec or kind in _PLAIN:
        return (kind, value)
    if kind is tuple and all(type(v) in _PLAIN for v in value):
        return (kind, tuple(map(type, value)), value)
    return None


def has(name: str) -> bool:
    """True if op `name` is registered."""
    return name in _OPS


def names() -> list[str]:
    """Every registered op name."""
    return sorted(_OPS)

