"""Meta rules for the Array API functions of NumPy's namespace that run by path (np.concat,
np.permute_dims, np.unstack, np.vecdot, np.cumulative_sum, np.linalg.cross…), so the master
knows their results' shapes at once.

Shape functions run NumPy itself on stand-ins of item size 0 (no memory, NumPy's own shape
errors); their dtype is an operand's. Numeric functions give their shape by hand and take
the dtype NumPy gives on small probes (numpy_functions.rule). Functions whose shape depends on the
data (unique_*, nonzero, repeat by a tensor) have no rule: the worker reports the shape.
"""

from __future__ import annotations

import numpy as np

from .meta_helpers import normalize_axes, shape_of, shaped, standin
from .numpy_functions import RULES, as_lists, rule
from .registry import UNKNOWN, Spec


def _stand(value):
    """Specs as zero-byte stand-ins."""
    if isinstance(value, Spec):
        return standin(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_stand(v) for v in value)
    return value


def _specs(value) -> list:
    if isinstance(value, Spec):
        return [value]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _specs(v)]
    return []


def _dtype(value) -> np.dtype:
    """A Spec's dtype, or the dtype of NumPy's array of an inline array or number."""
    return value.dtype if isinstance(value, Spec) else np.asarray(value).dtype


def _shaped(path: str, dtypes: str):
    """A rule running np.<path> on stand-ins; dtypes "first" (the first operand's), "promote"
    (all operands' promoted) or "each" (result i has operand i's)."""
    fn = getattr(np, path)

    def meta(*args, **kwargs):
        stand = _stand(args)
        if path in _INDEXED and len(args) > 1 and isinstance(args[1], Spec):
            stand = (stand[0], np.broadcast_to(np.zeros((), np.intp), args[1].shape),
                     *stand[2:])  # zero indices: in bounds of any non-empty axis
        out = fn(*stand, **_stand(kwargs))
        specs = _specs((args, tuple(kwargs.values())))
        if dtypes == "each":  # result i is operand i's, a NumPy array or number among them
            return tuple(Spec(o.shape, _dtype(v)) for o, v in zip(out, args, strict=True))
        dtype = np.result_type(*(s.dtype for s in specs)) if dtypes == "promote" \
            else specs[0].dtype
        if isinstance(out, (tuple, list)):
            return tuple(Spec(o.shape, dtype) for o in out)
        return Spec(out.shape, dtype)
    RULES[path] = meta


_INDEXED = {"take", "take_along_axis"}
for _path in ["flip", "roll", "tile", "take", "take_along_axis", "permute_dims",
              "matrix_transpose", "squeeze", "expand_dims", "moveaxis", "broadcast_to",
              "unstack", "reshape", "tril", "triu", "split", "array_split", "hsplit",
              "vsplit", "dsplit"]:
    _shaped(_path, "first")
for _path in ["concat", "stack"]:
    _shaped(_path, "promote")
for _path in ["broadcast_arrays", "meshgrid"]:
    _shaped(_path, "each")


def _leaves(value) -> list:
    if isinstance(value, (tuple, list)) and not isinstance(value, Spec):  # a Spec is a tuple
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _stand_all(value):
    """Specs, inline arrays and numbers as zero-byte stand-ins of their shapes."""
    if isinstance(value, (tuple, list)) and not isinstance(value, Spec):
        return type(value)(_stand_all(v) for v in value)
    return shaped(shape_of(value))


def _block(arrays):
    """np.block's shape from NumPy on stand-ins; its dtype is every block's, promoted (NumPy
    makes arrays of numbers among them first)."""
    out = np.block(as_lists(_stand_all(arrays)))
    return Spec(out.shape, np.result_type(*(_dtype(v) for v in _leaves(arrays))))


RULES["block"] = _block


def _repeat(x, repeats, axis=None):
    if isinstance(repeats, Spec):
        return UNKNOWN  # the length is the sum of the counts
    return Spec(np.repeat(standin(x), repeats, axis).shape, x.dtype)


RULES["repeat"] = _repeat


@rule("vecdot", "linalg.vecdot")
def _vecdot(x1, x2, axis=-1, **placed):
    if placed:  # the ufunc's axes= or keepdims=: sized on the worker
        return UNKNOWN
    s1, s2 = shape_of(x1), shape_of(x2)
    n = max(len(s1), len(s2))
    if not s1 or not s2:
        raise ValueError("vecdot: operands must have at least one dimension (got a 0-d one)")
    shape = np.broadcast_shapes(s1, s2)
    ax = normalize_axes(axis, n, "vecdot")[0]
    if ax - n < -min(len(s1), len(s2)) or s1[ax - n] != s2[ax - n]:
        raise ValueError(f"vecdot: the contracted axis differs (got shapes {s1} and {s2})")
    return shape[:ax] + shape[ax + 1:]


@rule("tensordot", "linalg.tensordot")
def _tensordot(a, b, axes=2):
    sa, sb = shape_of(a), shape_of(b)
    if isinstance(axes, int):
        if axes > min(len(sa), len(sb)) or axes < 0:
            raise ValueError(f"tensordot: axes={axes} exceeds the operands' dimensions (got "
                             f"shapes {sa} and {sb})")
        ia, ib = list(range(len(sa) - axes, len(sa))), list(range(axes))
    else:
        ia, ib = ([x] if isinstance(x, int) else list(x) for x in axes)
    ia = [i % len(sa) for i in ia]
    ib = [i % len(sb) for i in ib]
    for i, j in zip(ia, ib, strict=True):
        if sa[i] != sb[j]:
            raise ValueError(f"tensordot: shape-mismatch for sum (got {sa} and {sb} on axes "
                             f"{ia} and {ib})")
    return tuple(d for i, d in enumerate(sa) if i not in ia) + \
        tuple(d for i, d in enumerate(sb) if i not in ib)


@rule("cumulative_sum", "cumulative_prod")
def _cumulative(x, axis=None, dtype=None, include_initial=False):
    shape = shape_of(x)
    if axis is None:
        if len(shape) > 1:
            raise ValueError(f"cumulative_sum: axis is required for a {len(shape)}-d array")
        axis = 0
    if not shape:
        return UNKNOWN  # NumPy's 0-d rule, left to the worker
    ax = normalize_axes(axis, len(shape), "cumulative_sum")[0]
    return shape[:ax] + (shape[ax] + bool(include_initial),) + shape[ax + 1:]


def _diff(a, n=1, axis=-1, prepend=None, append=None):
    shape = list(shape_of(a))
    ax = normalize_axes(axis, len(shape), "diff")[0]
    dtypes = [a.dtype]
    for extra in (prepend, append):
        if extra is not None:
            shape[ax] += shape_of(extra)[ax] if shape_of(extra) else 1
            dtypes.append(extra.dtype if isinstance(extra, Spec) else np.asarray(extra).dtype)
    shape[ax] = max(shape[ax] - n, 0)
    joined = np.concatenate([np.ones(1, d) for d in dtypes])  # what diff differences
    return Spec(tuple(shape), np.diff(joined[:1].repeat(2)).dtype)


RULES["diff"] = _diff


@rule("searchsorted")
def _searchsorted(a, v, side="left", sorter=None):
    return shape_of(v)


@rule("real", "imag", "conj", "nextafter", "copysign", "hypot", "signbit")
def _elementwise(*args, **kwargs):
    return np.broadcast_shapes(*(shape_of(a) for a in args))


def _cross(x1, x2, axis=-1):
    s1, s2 = shape_of(x1), shape_of(x2)
    if not s1 or not s2 or s1[axis] != 3 or s2[axis] != 3:
        raise ValueError(f"linalg.cross: operands need length 3 on axis {axis} (got shapes "
                         f"{s1} and {s2})")
    return Spec(np.broadcast_shapes(s1, s2), np.result_type(x1.dtype, x2.dtype))


RULES["linalg.cross"] = _cross


@rule("linalg.outer")
def _outer(x1, x2):
    return shape_of(x1) + shape_of(x2)


@rule("linalg.diagonal")
def _diagonal(x, offset=0):
    return np.diagonal(shaped(shape_of(x)), offset, -2, -1).shape


@rule("linalg.trace")
def _trace(x, offset=0, dtype=None):
    return shape_of(x)[:-2]


def _sort(name: str):
    def meta(a, axis=-1, **kwargs):
        shape = np.sort(standin(a), axis).shape  # NumPy's axis errors; axis None flattens
        return Spec(shape, a.dtype if name == "sort" else np.dtype(np.intp))
    RULES[name] = meta


_sort("sort")
_sort("argsort")
