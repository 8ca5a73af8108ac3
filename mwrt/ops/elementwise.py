"""Elementwise ops: every NumPy ufunc by name, its in-place form `name_`, and the operators."""

from __future__ import annotations

import re

import numpy as np

from .meta_helpers import (
    OutputCastingError,
    bind,
    normalize_axes,
    result_dtype,
    run_small,
    shape_of,
    uncut,
)
from .registry import Spec, register

# Python operator -> ufunc name; the tensor class builds __op__/__rop__/__iop__ from this.
BINARY_OPERATORS = {
    "add": "add", "sub": "subtract", "mul": "multiply", "truediv": "true_divide",
    "floordiv": "floor_divide", "mod": "remainder", "pow": "power", "and": "bitwise_and",
    "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "left_shift", "rshift": "right_shift",
}
COMPARISONS = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
               "gt": "greater", "ge": "greater_equal"}
UNARY_OPERATORS = {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}

# vars(), not dir() + getattr(): NumPy 2 imports a submodule (testing, f2py, ctypeslib...)
# on its first attribute access, ~90 ms of every process's start; ufuncs are never lazy.
_NP_UFUNCS = {name: value for name, value in vars(np).items() if isinstance(value, np.ufunc)}
UFUNCS = sorted(set(_NP_UFUNCS) | {value.__name__ for value in _NP_UFUNCS.values()})


def _ufunc_impl(name):
    def impl(xp, *args, **kwargs):
        return getattr(xp, name)(*args, **kwargs)
    return impl


def _inplace_impl(name):
    def impl(xp, target, *args, **kwargs):
        getattr(xp, name)(target, *args, out=target, **kwargs)
    # A replayed graph calls xp's ufunc directly (worker/compiled.py): functions take
    # attributes, which their type does not declare.
    impl.ufunc = name  # type: ignore[attr-defined]
    return impl


def _broadcast(name, args):
    shapes = [a.shape if type(a) is Spec else shape_of(a) for a in args]
    widest = max(shapes, key=len)
    if all(s == widest or s == () for s in shapes):  # the common case, without NumPy's call
        return widest
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        said = " ".join(str(shape_of(a)) for a in args)
        raise ValueError(f"{name}: operands could not be broadcast together with shapes "
                         f"{said}") from None


def _ufunc_meta(ufunc):
    name = ufunc.__name__

    def meta(*args, **kwargs):
        if len(args) != ufunc.nin:
            raise TypeError(f"{name}: takes {ufunc.nin} operands (got {len(args)})")
        shape = _broadcast(name, args)
        where = kwargs.get("where")
        if where is not None and type(where) is not bool:
            _broadcast(name, (*args, where))  # where= broadcasts with the operands
        dtype = result_dtype(ufunc, args, kwargs)
        if isinstance(dtype, tuple):
            return tuple(Spec(shape, d) for d in dtype)
        return Spec(shape, dtype)
    return meta


def _gufunc_meta(ufunc):
    """The meta rule of a generalized ufunc (vecdot, matvec, vecmat): loop dimensions
    broadcast, core dimensions as its signature names them ("(m,n),(n)->(m)")."""
    name = ufunc.__name__
    ins, outs = (re.findall(r"\(([^)]*)\)", part) for part in ufunc.signature.split("->"))
    ins, outs = [[d for d in g.split(",") if d] for g in ins], [[d for d in g.split(",") if d]
                                                                for g in outs]

    def probes(*values):  # 1-element probes with the core dimensions each operand needs
        return ufunc(*[np.reshape(v, (1,) * len(core)) for v, core in zip(values, ins)])

    def meta(*args, **kwargs):
        if len(args) != ufunc.nin:
            raise TypeError(f"{name}: takes {ufunc.nin} operands (got {len(args)})")
        sizes: dict[str, int] = {}  # core dimension name -> its size
        loops = []
        for i, (arg, core) in enumerate(zip(args, ins)):
            shape = shape_of(arg)
            if len(shape) < len(core):
                raise ValueError(f"{name}: operand {i} has {len(shape)} dimensions (expected "
                                 f"at least {len(core)}: {ufunc.signature})")
            loops.append(shape[:len(shape) - len(core)])
            for dim, size in zip(core, shape[len(shape) - len(core):]):
                if sizes.setdefault(dim, size) != size:
                    raise ValueError(f"{name}: core dimension {dim} of operand {i} is {size} "
                                     f"(expected {sizes[dim]}: {ufunc.signature})")
        shape = _broadcast(name, [np.broadcast_to(np.empty((), "V0"), s) for s in loops])
        return Spec(tuple(shape) + tuple(sizes[d] for d in outs[0]),
                    result_dtype(probes, args, kwargs))
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
            raise OutputCastingError(
                f"{name}_: cannot cast the result to the target's dtype in place (got {dtype}, "
                f"expected a dtype castable to {target.dtype}); use the out-of-place form",
                ufunc, "same_kind", dtype, target.dtype)
    return meta


for _name in UFUNCS:
    _np_ufunc = getattr(np, _name)
    if _np_ufunc.signature:  # vecdot, matvec, vecmat (matmul has its own rule, in misc.py)
        register(_name, _ufunc_impl(_np_ufunc.__name__), _gufunc_meta(_np_ufunc), by_type=True,
                 scalar=True)
    elif _np_ufunc.nout == 1:
        register(_name, _ufunc_impl(_np_ufunc.__name__), _ufunc_meta(_np_ufunc), by_type=True,
                 scalar=True)
        register(_name + "_", _inplace_impl(_np_ufunc.__name__), _inplace_meta(_np_ufunc),
                 inplace=True, by_type=True)
    else:
        register(_name, _ufunc_impl(_np_ufunc.__name__), _ufunc_meta(_np_ufunc), scalar=True)


# -- ufunc methods: np.add.accumulate(t), np.multiply.outer(a, b), np.add.at(t, i, v) -------

_METHODS = ("reduce", "accumulate", "outer", "reduceat")


def _ufunc(name: str) -> np.ufunc:
    ufunc = getattr(np, name, None)
    if not isinstance(ufunc, np.ufunc):
        raise TypeError(f"ufunc: {name!r} is not a NumPy ufunc")
    return ufunc


def _method_impl(xp, name, method, *args, **kwargs):
    if method not in _METHODS:
        raise ValueError(f"ufunc: unknown method {method!r} (known: {', '.join(_METHODS)})")
    _ufunc(name)
    return getattr(getattr(xp, name), method)(*args, **kwargs)


def _method_meta(name, method, a, *args, **kwargs):
    """Shapes by NumPy's rule for each method; the dtype by NumPy on one-element probes."""
    ufunc = _ufunc(name)
    if method not in _METHODS:
        raise ValueError(f"ufunc: unknown method {method!r} (known: {', '.join(_METHODS)})")
    sa = shape_of(a)
    fn = getattr(ufunc, method)
    if method == "outer":
        b, = args
        return Spec(sa + shape_of(b), result_dtype(ufunc, (a, b), kwargs))
    kwargs = bind(fn, a, args, kwargs, f"{name}.{method}")
    if type(a) is not Spec:
        raise TypeError(f"{name}.{method}: expected a tensor (got {type(a).__name__})")
    indices = kwargs.pop("indices", None)
    # NumPy itself on a stand-in of at most one element per axis: dtype, errors, small shapes
    probe = run_small(fn, a, *(() if indices is None else (np.zeros(1, np.intp),)), **kwargs)
    if uncut(a) and indices is None:
        return Spec(probe.shape, probe.dtype)
    axis = kwargs.get("axis", 0)
    axes = normalize_axes(axis, len(sa), f"{name}.{method}")
    if method == "reduceat":
        return Spec(sa[:axes[0]] + shape_of(indices)[:1] + sa[axes[0] + 1:], probe.dtype)
    if method == "accumulate":
        return Spec(sa, probe.dtype)
    if kwargs.get("keepdims"):
        return Spec(tuple(1 if i in axes else d for i, d in enumerate(sa)), probe.dtype)
    return Spec(tuple(d for i, d in enumerate(sa) if i not in axes), probe.dtype)


def _at_impl(xp, a, name, *args, **kwargs):
    _ufunc(name)
    getattr(xp, name).at(a, *args, **kwargs)


def _at_meta(a, name, indices, *values):
    ufunc = _ufunc(name)
    if len(values) != ufunc.nin - 1:
        raise TypeError(f"{name}.at: takes {ufunc.nin - 1} operand(s) after the indices (got "
                        f"{len(values)})")


register("ufunc_method", _method_impl, _method_meta, scalar=True,
         doc="A ufunc's reduce, accumulate, outer or reduceat (np.add.accumulate(t)).")
register("ufunc_at_", _at_impl, _at_meta, inplace=True,
         doc="A ufunc applied in place at indices (np.add.at(t, i, v)).")
