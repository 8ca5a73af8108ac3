"""Reductions over axes: sum, mean, prod, min, max, argmin, argmax, std, var, any, all…"""

from __future__ import annotations

import numpy as np

from . import Spec, register
from ._meta import bind, normalize_axes

REDUCTIONS = ["sum", "mean", "prod", "min", "max", "amin", "amax", "std", "var", "any", "all",
              "nansum", "nanmean", "nanprod", "nanmin", "nanmax", "nanstd", "nanvar",
              "argmin", "argmax", "cumsum", "cumprod", "count_nonzero", "ptp", "median"]
# Functions that take one axis (an int or None), not a tuple.
_SINGLE_AXIS = {"argmin", "argmax", "cumsum", "cumprod"}
# Functions whose result keeps the input's shape (scans) unless axis is None.
_SCANS = {"cumsum", "cumprod"}


def _impl(name):
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
        axis, keepdims = kwargs.pop("axis", None), kwargs.pop("keepdims", False)
        if not isinstance(a, Spec):
            raise TypeError(f"{name}: expected a tensor (got {type(a).__name__})")
        if name in _SINGLE_AXIS and isinstance(axis, tuple):
            raise TypeError(f"{name}: axis must be an int or None (got {axis!r})")
        axes = normalize_axes(axis, len(a.shape), name)
        extra = dict(kwargs, **({"keepdims": keepdims} if keepdims else {}))
        probe_kwargs = dict(extra, axis=None if axis is None else
                            (tuple(range(len(axes))) if name not in _SINGLE_AXIS else 0))
        dtype = _probe_dtype(fn, a, probe_kwargs)
        if name in _SCANS:
            size = int(np.prod(a.shape))
            return Spec(a.shape if axis is not None else (size,), dtype)
        if keepdims:
            shape = tuple(1 if i in axes else d for i, d in enumerate(a.shape))
        else:
            shape = tuple(d for i, d in enumerate(a.shape) if i not in axes)
        return Spec(shape, dtype)
    return meta


def _probe_dtype(fn, a, kwargs):
    # A probe of ndim max(len(axes), 1) of size 1 gives NumPy's dtype for this reduction.
    ndim = max(len(a.shape), 1)
    probe = np.ones((1,) * ndim, dtype=a.dtype)
    if kwargs.get("axis") is not None and not isinstance(kwargs["axis"], int):
        kwargs = dict(kwargs, axis=tuple(range(min(len(kwargs["axis"]), ndim))))
    # a tensor keyword (where=, mean=) as ones of its dtype and ndim: NumPy broadcasts it
    kwargs = {k: np.ones((1,) * len(v.shape), v.dtype) if type(v) is Spec else v
              for k, v in kwargs.items()}
    return np.asarray(fn(probe, **kwargs)).dtype


for _name in REDUCTIONS:
    register(_name, _impl(_name), _meta(_name))
