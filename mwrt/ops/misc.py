"""Matrix products, copies and casts, fills, and the array functions (where, clip, concatenate…)."""

from __future__ import annotations

import numpy as np

from .. import arrays
from .meta_helpers import result_dtype, shape_of, shaped, standin
from .registry import KEEPS, Spec, register


def matmul_meta(a, b, **kwargs):
    """NumPy's matmul shape rule: 1-D operands are promoted then squeezed; batches broadcast."""
    sa, sb = shape_of(a), shape_of(b)
    if not sa or not sb:
        raise ValueError("matmul: input operand does not have enough dimensions (got a 0-d "
                         "operand, expected at least 1-D)")
    ea = (1,) + sa if len(sa) == 1 else sa
    eb = sb + (1,) if len(sb) == 1 else sb
    if ea[-1] != eb[-2]:
        raise ValueError(f"matmul: core dimensions do not match (got {sa} @ {sb}: "
                         f"{ea[-1]} != {eb[-2]})")
    batch = np.broadcast_shapes(ea[:-2], eb[:-2])
    shape = batch + ((ea[-2],) if len(sa) > 1 else ()) + ((eb[-1],) if len(sb) > 1 else ())
    return Spec(shape, result_dtype(np.matmul, (_as2d(a), _as2d(b)), kwargs))


def dot_meta(a, b):
    """np.dot's rule: a 0-d operand multiplies; else a's last axis meets b's second to last
    (its only one if 1-D), and the result has a's other axes, then b's."""
    sa, sb = shape_of(a), shape_of(b)
    dtype = result_dtype(np.dot, (a, b))
    if not sa or not sb:
        return Spec(sa or sb, dtype)
    k = sb[0] if len(sb) == 1 else sb[-2]
    if sa[-1] != k:
        raise ValueError(f"dot: shapes {sa} and {sb} not aligned: {sa[-1]} (dim "
                         f"{len(sa) - 1}) != {k} (dim {max(len(sb) - 2, 0)})")
    return Spec(sa[:-1] + sb[:-2] + sb[-1:] if len(sb) > 1 else sa[:-1], dtype)


def _as2d(x):
    return Spec((1, 1), x.dtype) if isinstance(x, Spec) else np.ones((1, 1), np.asarray(x).dtype)


def _same(a, *args, **kwargs):
    return Spec(a.shape, a.dtype)


def astype_meta(a, dtype):
    return Spec(a.shape, np.dtype(dtype))


def copy_meta(target, src):
    try:
        np.broadcast_to(shaped(shape_of(src)), target.shape)
    except ValueError:
        raise ValueError(f"copy_: source shape {shape_of(src)} cannot be broadcast to the "
                         f"target's {target.shape}") from None


def _copy_into(xp, target, src):
    if isinstance(src, np.ndarray) and xp is not np:  # host bytes beside the command
        target[...] = src
    else:  # a GPU's copy engine for like arrays (indexing runs a kernel, ~2/3 the speed)
        xp.copyto(target, src, casting="unsafe")


def _fill(xp, target, value):
    target.fill(value)


def _fill_meta(target, value):
    if isinstance(value, Spec):
        raise TypeError("fill_: value must be a Python scalar (got a tensor); use copy_")


def where_meta(cond, x, y):
    shape = np.broadcast_shapes(shape_of(cond), shape_of(x), shape_of(y))
    return Spec(shape, result_dtype(np.where, (Spec((1,), np.dtype(bool)), x, y)))


def _bounds(a_min=None, a_max=None, *, min=None, max=None):
    """np.clip's bounds, given as a_min/a_max or (NumPy 2.1's) min/max."""
    if (a_min is not None and min is not None) or (a_max is not None and max is not None):
        raise ValueError("clip: pass a_min/a_max or min/max, not both")
    return (a_min if min is None else min), (a_max if max is None else max)


def clip_meta(a, *args, **kwargs):
    lo, hi = _bounds(*args, **kwargs)
    shape = np.broadcast_shapes(*(shape_of(v) for v in (a, lo, hi) if v is not None))
    return Spec(shape, result_dtype(np.clip, (a, lo, hi)))


def _clip(xp, a, *args, out=None, **kwargs):
    lo, hi = _bounds(*args, **kwargs)
    return xp.clip(a, lo, hi, out=out)


def round_meta(a, decimals=0):
    return Spec(a.shape, result_dtype(np.round, (a,)))


def trace_meta(a, offset=0, axis1=0, axis2=1):
    shape = np.diagonal(standin(a), offset, axis1, axis2).shape[:-1]
    return Spec(shape, np.trace(np.ones((1, 1), a.dtype)).dtype)


def _join_meta(name):
    fn = getattr(np, name)

    def meta(arrays, axis=0, **kwargs):
        if not isinstance(arrays, tuple) or not arrays:
            raise ValueError(f"{name}: need a non-empty sequence of tensors")
        shape = fn([shaped(shape_of(a)) for a in arrays], axis=axis).shape
        # NumPy's own dtype rule (dtype=, casting=) on one-element arrays of the same dtypes
        probes = [np.ones((1,) * len(shape_of(arrays[0])),
                          a.dtype if isinstance(a, Spec) else np.asarray(a).dtype)
                  for a in arrays]
        axis = 0 if shape_of(arrays[0]) or name == "stack" else None
        return Spec(shape, fn(probes, axis=axis, **kwargs).dtype)
    return meta


def _join_impl(name):
    def impl(xp, arrays, axis=0, **kwargs):
        return getattr(xp, name)(list(arrays), axis=axis, **kwargs)
    return impl


def _to_device_impl(xp, a, device):
    # xp is the namespace of the destination stream's device.
    if device == -1:
        get = getattr(a, "get", None)
        return get() if get is not None else a.copy()
    if type(a) is not np.ndarray:
        return arrays.copy_to_device(xp, a, device)  # GPU to GPU: the GPUs copy it
    with xp.cuda.Device(device):
        return xp.asarray(a)


# (scalar=True: a 0-d result is a NumPy scalar, as np.dot(v, v) and np.clip(a0, 0, 1) give)
register("matmul", lambda xp, a, b, **kwargs: xp.matmul(a, b, **kwargs), matmul_meta,
         scalar=True)
register("dot", lambda xp, a, b, **kwargs: xp.dot(a, b, **kwargs), dot_meta, scalar=True)
register("astype", lambda xp, a, dtype: a.astype(dtype), astype_meta, scalar=KEEPS)
register("copy", lambda xp, a: a.copy(), _same, scalar=KEEPS)
register("copy_", _copy_into, copy_meta, inplace=True,
         doc="Copy `src` (broadcast) into the tensor in place.")
register("fill_", _fill, _fill_meta, inplace=True, doc="Set every element to a scalar in place.")
register("where", lambda xp, c, x, y: xp.where(c, x, y), where_meta)
register("clip", _clip, clip_meta, scalar=True)
register("round", lambda xp, a, decimals=0: xp.round(a, decimals), round_meta, scalar=True)
register("trace", lambda xp, a, offset=0, axis1=0, axis2=1: xp.trace(a, offset, axis1, axis2),
         trace_meta, scalar=True)
register("concatenate", _join_impl("concatenate"), _join_meta("concatenate"))
register("stack", _join_impl("stack"), _join_meta("stack"))
register("to_device", _to_device_impl, lambda a, device: Spec(a.shape, a.dtype),
         doc="A copy on another device of the same node (-1: host memory).")
