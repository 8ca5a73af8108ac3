"""Helpers for meta rules: stand-in arrays that carry a shape but no bytes, dtype probes."""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np

from . import Spec

# A dtype of item size 0: an array of any shape made of it takes no memory, so NumPy's own
# shape logic (reshape, indexing, concatenate…) can run on the master at no cost.
_VOID0 = np.dtype([])


def standin(spec: Spec) -> np.ndarray:
    """An array with `spec`'s shape and zero bytes."""
    return np.empty(spec.shape, dtype=_VOID0)


def probe(value):
    """A 1-element array of `value`'s dtype for Specs; Python scalars stay (NEP 50 weak types)."""
    if isinstance(value, Spec):
        return np.ones(1, dtype=value.dtype)
    return value


def probe_key(value):
    """What of a value decides a result dtype: the dtype of a Spec, the type of a scalar."""
    if type(value) is Spec:
        return value.dtype
    if isinstance(value, np.ndarray):
        return ("array", value.dtype)
    return type(value)


@lru_cache(maxsize=4096)
def _dtype_of(fn, keys, kwargs):
    values = [np.ones(1, dtype=k) if isinstance(k, np.dtype) else
              np.ones(1, dtype=k[1]) if isinstance(k, tuple) else
              None if k is type(None) else k(1) for k in keys]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = fn(*values, **dict(kwargs))
    if isinstance(out, tuple):
        return tuple(np.asarray(o).dtype for o in out)
    return np.asarray(out).dtype


def result_dtype(fn, args, kwargs=None):
    """The dtype(s) NumPy gives `fn(*args, **kwargs)`, found on 1-element probes (cached)."""
    keys = tuple(probe_key(a) for a in args)
    items = tuple(sorted(kwargs.items())) if kwargs else ()
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
        if not isinstance(ax, (int, np.integer)) or not -ndim <= ax < max(ndim, 1):
            raise np.exceptions.AxisError(f"{what}: axis {ax} is out of bounds for array of "
                                          f"dimension {ndim}")
        out.append(int(ax) % max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated axis (got {axis!r})")
    return tuple(sorted(out))
