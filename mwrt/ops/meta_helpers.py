"""Helpers for meta rules: stand-in arrays that carry a shape but no bytes, dtype probes."""

from __future__ import annotations

import warnings
from functools import cache, lru_cache
from typing import NamedTuple

import numpy as np

from .registry import Spec

# A dtype of item size 0: an array of any shape made of it takes no memory, so NumPy's own
# shape logic (reshape, indexing, concatenate…) can run on the master at no cost.
_VOID0 = np.dtype([])


def standin(spec: Spec) -> np.ndarray:
    """An array with `spec`'s shape and zero bytes."""
    return shaped(spec.shape)


def shaped(shape) -> np.ndarray:
    """An array of `shape` and zero bytes, for NumPy's shape rules."""
    return np.empty(shape, dtype=_VOID0)


def probe(value):
    """A 1-element array of `value`'s dtype for Specs; Python scalars stay (NEP 50 weak types)."""
    if isinstance(value, Spec):
        return np.ones(1, dtype=value.dtype)
    return value


def probe_key(value):
    """What of a value decides a result dtype: the dtype of a Spec, the type of a scalar (a
    Python scalar is weak, a NumPy scalar typed: NEP 50), an array's dtype."""
    if type(value) is Spec:
        return value.dtype
    if isinstance(value, np.ndarray):
        return ("array", value.dtype)
    if isinstance(value, (tuple, list)):  # an array-like: NumPy makes an array of it
        return ("array", np.asarray(value).dtype)
    if isinstance(value, np.generic):  # its dtype, a datetime's unit too (np.datetime64(1)
        return ("scalar", value.dtype)  # has none: NumPy refuses it)
    return type(value)


class _Probe(NamedTuple):
    """A keyword argument that is a tensor (where=, mean=): its dtype and ndim."""

    dtype: np.dtype
    ndim: int


def _kwarg_key(value):
    return _Probe(value.dtype, len(value.shape)) if type(value) is Spec else value


@lru_cache(maxsize=4096)
def _dtype_of(fn, keys, kwargs):
    values = [np.ones(1, dtype=k) if isinstance(k, np.dtype) else
              np.ones(1, dtype=k[1])[0] if isinstance(k, tuple) and k[0] == "scalar" else
              np.ones(1, dtype=k[1]) if isinstance(k, tuple) else
              None if k is type(None) else k(1) for k in keys]
    kwargs = {k: np.ones((1,) * v.ndim, v.dtype) if type(v) is _Probe else v
              for k, v in kwargs}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = fn(*values, **kwargs)
    if isinstance(out, tuple):
        return tuple(np.asarray(o).dtype for o in out)
    return np.asarray(out).dtype


def result_dtype(fn, args, kwargs=None):
    """The dtype(s) NumPy gives `fn(*args, **kwargs)`, found on 1-element probes (cached)."""
    keys = tuple(probe_key(a) for a in args)
    items = tuple(sorted((k, _kwarg_key(v)) for k, v in kwargs.items())) if kwargs else ()
    try:
        return _dtype_of(fn, keys, items)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return _dtype_of.__wrapped__(fn, keys, items)


def shape_of(value) -> tuple:
    """Shape of a Spec, an array or a scalar."""
    if isinstance(value, (Spec, np.ndarray)):
        return value.shape
    if isinstance(value, (int, float, complex, bool, np.generic)):
        return ()
    return np.shape(value)


def normalize_axes(axis, ndim: int, what: str) -> tuple:
    """Axis argument -> sorted tuple of non-negative axes, validated like NumPy."""
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for ax in axes:
        # a 0-d array takes axis 0 and -1, as NumPy's reductions do
        if not isinstance(ax, (int, np.integer)) or not -max(ndim, 1) <= ax < max(ndim, 1):
            raise np.exceptions.AxisError(f"{what}: axis {ax} is out of bounds for array of "
                                          f"dimension {ndim}")
        out.append(int(ax) % max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated axis (got {axis!r})")
    return tuple(sorted(out))


def bind(fn, a, args: tuple, kwargs: dict, what: str) -> dict:
    """Positional arguments after the array as NumPy's signature of `fn` names them
    (t.sum(0, np.float64) is axis=0, dtype=float64), merged into `kwargs`."""
    names = _positional(fn)
    if len(args) > len(names):
        raise TypeError(f"{what}: takes at most {len(names)} arguments after the array (got "
                        f"{len(args)})")
    named = dict(kwargs)
    for name, value in zip(names, args):
        if name in named:
            raise TypeError(f"{what}: got multiple values for argument {name!r}")
        named[name] = value
    return named


@cache
def _positional(fn) -> tuple:
    import inspect

    params = list(inspect.signature(fn).parameters.values())[1:]
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                      p.POSITIONAL_OR_KEYWORD))


def run_small(fn, a: Spec, *args, **kwargs) -> np.ndarray:
    """NumPy's `fn` on a stand-in of `a` with every axis cut to at most one element (tensor
    keywords, where= and mean=, as ones of their ndim): its dtype and its errors are NumPy's
    for `a` (an axis out of bounds, an empty min), its shape too where nothing was cut."""
    probe = np.ones(tuple(min(d, 1) for d in a.shape), dtype=a.dtype)
    kwargs = {k: np.ones((1,) * len(v.shape), v.dtype) if type(v) is Spec else v
              for k, v in kwargs.items()}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the mean of nothing: NumPy warns, the worker too
        return np.asarray(fn(probe, *args, **kwargs))


def uncut(a: Spec) -> bool:
    """True if run_small's stand-in of `a` is `a`'s own shape (no axis longer than one)."""
    return all(d <= 1 for d in a.shape)



def _numpy_output_casting_error() -> type:
    """NumPy's class for a ufunc result its output cannot hold: private to NumPy and moved
    in 2.0, so asked of NumPy itself rather than imported."""
    try:
        np.add(np.zeros(1, np.int8), 0.5, out=np.zeros(1, np.int8))
    except TypeError as error:
        return type(error)
    raise ImportError("NumPy cast 0.5 into an int8 output under casting='same_kind'")


class OutputCastingError(_numpy_output_casting_error()):  # type: ignore[misc]
    """A ufunc's result its target cannot hold (`i += 1.5` of an int tensor): NumPy's own
    error class (a UFuncTypeError, so a TypeError), with a message that names the fix."""

    def __init__(self, message: str, ufunc: np.ufunc, casting: str, from_: np.dtype,
                 to: np.dtype, i: int = 0) -> None:
        super().__init__(ufunc, casting, from_, to, i)  # NumPy's fields: ufunc, casting, ...
        self.message = message

    def __str__(self) -> str:
        return self.message
