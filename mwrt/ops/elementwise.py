"""Elementwise ops: every NumPy ufunc by name, its in-place form `name_`, and the operators."""

from __future__ import annotations

import numpy as np

from . import Spec, register
from ._meta import result_dtype, shape_of

# Python operator -> ufunc name; the tensor class builds __op__/__rop__/__iop__ from this.
BINARY_OPERATORS = {
    "add": "add", "sub": "subtract", "mul": "multiply", "truediv": "true_divide",
    "floordiv": "floor_divide", "mod": "remainder", "pow": "power", "and": "bitwise_and",
    "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "left_shift", "rshift": "right_shift",
}
COMPARISONS = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
               "gt": "greater", "ge": "greater_equal"}
UNARY_OPERATORS = {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}

UFUNCS = sorted({name for name in dir(np) if isinstance(getattr(np, name), np.ufunc)}
                | {getattr(np, name).__name__ for name in dir(np)
                   if isinstance(getattr(np, name), np.ufunc)})


def _ufunc_impl(name):
    def impl(xp, *args, **kwargs):
        return getattr(xp, name)(*args, **kwargs)
    return impl


def _inplace_impl(name):
    def impl(xp, target, *args, **kwargs):
        getattr(xp, name)(target, *args, out=target, **kwargs)
    impl.ufunc = name  # a replayed graph calls xp's ufunc directly (worker/compiled.py)
    return impl


def _broadcast(name, args):
    shapes = [a.shape if type(a) is Spec else shape_of(a) for a in args]
    widest = max(shapes, key=len)
    if all(s == widest or s == () for s in shapes):  # the common case, without NumPy's call
        return widest
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        shapes = " ".join(str(shape_of(a)) for a in args)
        raise ValueError(f"{name}: operands could not be broadcast together with shapes "
                         f"{shapes}") from None


def _ufunc_meta(ufunc):
    name = ufunc.__name__

    def meta(*args, **kwargs):
        if len(args) != ufunc.nin:
            raise TypeError(f"{name}: takes {ufunc.nin} operands (got {len(args)})")
        shape = _broadcast(name, args)
        dtype = result_dtype(ufunc, args, kwargs)
        if isinstance(dtype, tuple):
            return tuple(Spec(shape, d) for d in dtype)
        return Spec(shape, dtype)
    return meta


def _inplace_meta(ufunc):
    name = ufunc.__name__

    def meta(target, *args, **kwargs):
        shape = _broadcast(name, (target, *args))
        if shape != target.shape:
            raise ValueError(f"{name}_: in-place result has the wrong shape (got broadcast "
                             f"shape {shape}, expected the target's {target.shape})")
        dtype = result_dtype(ufunc, (target, *args), kwargs)
        if not np.can_cast(dtype, target.dtype, casting="same_kind"):
            raise TypeError(f"{name}_: cannot cast the result to the target's dtype in place "
                            f"(got {dtype}, expected a dtype castable to {target.dtype}); "
                            f"use the out-of-place form")
        return None
    return meta


for _name in UFUNCS:
    _ufunc = getattr(np, _name)
    if _ufunc.nout == 1:
        register(_name, _ufunc_impl(_ufunc.__name__), _ufunc_meta(_ufunc), by_type=True)
        register(_name + "_", _inplace_impl(_ufunc.__name__), _inplace_meta(_ufunc),
                 inplace=True, by_type=True)
    else:
        register(_name, _ufunc_impl(_ufunc.__name__), _ufunc_meta(_ufunc))
