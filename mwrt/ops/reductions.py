"""Reductions over axes: sum, mean, prod, min, max, argmin, argmax, std, var, any, all…"""

from __future__ import annotations

import math

import numpy as np

from .meta_helpers import bind, normalize_axes, run_small, uncut
from .registry import Spec, register

REDUCTIONS = ["sum", "mean", "prod", "min", "max", "amin", "amax", "std", "var", "any", "all",
              "nansum", "nanmean", "nanprod", "nanmin", "nanmax", "nanstd", "nanvar",
              "argmin", "argmax", "cumsum", "cumprod", "count_nonzero", "ptp", "median"]
# Functions that take one axis (an int or None), not a tuple.
_SINGLE_AXIS = {"argmin", "argmax", "cumsum", "cumprod"}
# Functions whose result keeps the input's shape (scans) unless axis is None.
_SCANS = {"cumsum", "cumprod"}


# NumPy's functions that reach the same ufunc reduction as the array's method of the name,
# with the same parameters in the same order: on a NumPy array the method goes straight there,
# where np.sum and the like first pass ~80 bytecodes of checks (_wrapreduction), a third of
# the worker's Python in a small op. Not std and var: their functions take NumPy 2's
# correction=, which the methods do not.
_SAME_AS_METHOD = frozenset(("sum", "mean", "prod", "min", "max", "any", "all", "argmin",
                             "argmax", "cumsum", "cumprod"))


def _impl(name):
    if name in _SAME_AS_METHOD:
        def by_method(xp, a, *args, **kwargs):
            if type(a) is np.ndarray:
                return getattr(a, name)(*args, **kwargs)
            return getattr(xp, name)(a, *args, **kwargs)
        return by_method

    def impl(xp, a, *args, **kwargs):
        return getattr(xp, name)(a, *args, **kwargs)
    return impl


def _meta(name):
    fn = getattr(np, name)

    def meta(a, *args, **kwargs):
        if args:  # bound as NumPy binds them: t.sum(0, np.float64) is axis=0, dtype=float64
            kwargs = bind(fn, a, args, kwargs, name)
        if "out" in kwargs:
            raise TypeError(f"{name}: pass out= by keyword (mwrt writes it in place)")
        if not isinstance(a, Spec):
            raise TypeError(f"{name}: expected a tensor (got {type(a).__name__})")
        if name in _SINGLE_AXIS and isinstance(kwargs.get("axis"), tuple):
            raise TypeError(f"{name}: axis must be an int or None (got {kwargs['axis']!r})")
        # NumPy itself on a stand-in with every axis cut to at most one element: its dtype,
        # its errors (an axis out of bounds, an empty min), and its shape where nothing was cut
        probe = run_small(fn, a, **kwargs)
        if uncut(a):
            return Spec(probe.shape, probe.dtype)
        axis, keepdims = kwargs.get("axis"), kwargs.get("keepdims", False)
        axes = normalize_axes(axis, len(a.shape), name)
        if name in _SCANS:
            return Spec(a.shape if axis is not None else (math.prod(a.shape),), probe.dtype)
        if keepdims:
            return Spec(tuple(1 if i in axes else d for i, d in enumerate(a.shape)), probe.dtype)
        return Spec(tuple(d for i, d in enumerate(a.shape) if i not in axes), probe.dtype)
    return meta


for _name in REDUCTIONS:
    register(_name, _impl(_name), _meta(_name), scalar=True)
