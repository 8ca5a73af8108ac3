"""The NumPy functions the `numpy` op may run by name on a worker, each with its result's size.

A worker runs np.<path> for a master only if the path is listed here: functions that compute
on the arrays they are given and return new arrays (or views within them). Nothing that makes
an array from an address or a buffer (lib.stride_tricks.as_strided, frombuffer, ctypeslib,
ndarray), reads or writes files (load, save, fromfile, memmap, lib.format), runs a callable or
unpickles (apply_along_axis, vectorize, frompyfunc, piecewise), or hands out memory it did not
fill (empty: `empty_like` runs as `zeros_like`) is listed, and whatever is not listed is
refused by name: an unkeyed daemon, which any local user may reach, runs no code of theirs.

Each entry is one line: the path and a bound on its results' element count, computed from
the arguments (Specs in place of tensors) before the function runs, so that an oversized
result is refused unmade (mwrt.worker.quotas). A function with a shape rule (numpy_functions.RULES)
is sized exactly by the rule's shape; the bound serves the forms the rule leaves UNKNOWN.
Adding a function is adding its line, with a bound that holds for every argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .registry import Spec

# Results are sized at 16 bytes per element (complex128) or the widest dtype among the
# arguments, whichever is more: the dtype of a function's result is not known unrun.
WIDTH = 16
MAX_NDIM = 64  # NumPy's limit on dimensions: a tuple of index arrays has at most this many


def _is_array(value) -> bool:
    """A tensor's Spec, or an array sent inline with the command."""
    return type(value) is Spec or isinstance(value, np.ndarray)


def elements(value) -> int:
    """How many elements `value` holds: a Spec's or an inline array's size, a nested list's
    leaves, 1 for a scalar."""
    if _is_array(value):
        return math.prod(value.shape)
    if isinstance(value, (tuple, list)):
        return sum(elements(v) for v in value) or 1
    if isinstance(value, dict):
        return sum(elements(v) for v in value.values()) or 1
    return 1


def _ndim(value) -> int:
    return len(_shape(value))


def _total(*args, **kwargs) -> int:
    return elements(args) + elements(kwargs)


def linear(k: int = 1):
    """At most `k` times as many elements as the arguments hold (sorts, set operations,
    reductions, cumulative sums, differences: never more than they are given)."""
    return lambda *args, **kwargs: k * _total(*args, **kwargs)


def _indices(*args, **kwargs) -> int:
    """Index arrays, one per dimension (nonzero, argwhere, where(c), *_indices_from)."""
    return max(map(_ndim, args), default=1) * _total(*args, **kwargs)


def _product(*args, **kwargs) -> int:
    """The product of the arguments' sizes (outer products, quantiles of many q)."""
    return math.prod(elements(v) for v in (*args, *kwargs.values()))


def _broadcast(*args, **kwargs) -> int:
    """Broadcasting functions: the largest of each aligned dimension of the operands (the
    broadcast shape where NumPy accepts them; an axis tuple among them only adds to it)."""
    shapes = [_shape(v) for v in (*args, *kwargs.values())
              if _is_array(v) or isinstance(v, (tuple, list))]
    ndim = max(map(len, shapes), default=0)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    return math.prod(max(dims) for dims in zip(*padded)) + _total(*args, **kwargs)


def _like(a, dtype=None, order="K", subok=True, shape=None, **kwargs) -> int:
    return elements(a) if shape is None else math.prod(np.atleast_1d(shape).tolist())


def _bins(bins, dims: int) -> int:
    """Histogram bins and edges: bins+1 per dimension for a count, an array's size for edges."""
    counted = type(bins) is Spec and (not bins.shape or (dims > 1 and bins.shape[0] == dims))
    if isinstance(bins, str) or counted:
        raise TypeError(f"np.histogram: bins={bins!r:.40} are counted from the data, so the "
                        "result cannot be sized before it is made; pass a count or edges")
    if dims > 1 and type(bins) is not Spec and _shape(bins)[:1] == (dims,):  # one per dimension
        return math.prod(_bins(b, 1) for b in bins)
    if (isinstance(bins, (int, np.integer)) and not isinstance(bins, (bool, np.bool_))) or \
            (isinstance(bins, np.ndarray) and bins.ndim == 0):  # a count, a NumPy one too
        return (abs(int(bins)) + 1) ** dims
    return (elements(bins) + 1) ** dims


def _histogram(a, bins=10, *args, **kwargs) -> int:
    return 2 * _bins(bins, 1) + elements(a)


def _histogram2d(x, y, bins=10, *args, **kwargs) -> int:
    return 3 * _bins(bins, 2) + elements(x) + elements(y)


def _histogramdd(sample, bins=10, *args, **kwargs) -> int:
    """An array's rows are points; a sequence holds one array of coordinates per dimension."""
    shape = _shape(sample)
    dims = len(sample) if isinstance(sample, (tuple, list)) else shape[-1] if shape else 1
    return 2 * _bins(bins, dims) + elements(sample)


def _unique(ar, *args, **kwargs) -> int:
    return 4 * elements(ar)  # the values, and up to three arrays of indices or counts


def _cov(m, y=None, rowvar=True, *args, **kwargs) -> int:
    def variables(x):
        shape = _shape(x)
        return 1 if len(shape) < 2 else shape[0] if rowvar else shape[1]
    n = variables(m) + (variables(y) if y is not None else 0)
    return n * n + _total(m, y)


def _diagflat(v, k=0) -> int:
    return (elements(v) + abs(int(k))) ** 2


def _vander(x, N=None, *args, **kwargs) -> int:
    return elements(x) * (elements(x) if N is None else abs(int(N)))


def _meshgrid(*xi, **kwargs) -> int:
    return max(len(xi), 1) * _product(*xi)


def _broadcast_arrays(*args, **kwargs) -> int:
    return max(len(args), 1) * _broadcast(*args)


def _where(condition, *args, **kwargs) -> int:
    return _broadcast(condition, *args) if args else _indices(condition)


def _unravel(indices, shape, order="C") -> int:
    return max(elements(shape), 1) * elements(indices)


def _shape(value) -> tuple:
    """A Spec's or an array's shape, a nested sequence's as NumPy reads it, (1,) a scalar's."""
    if _is_array(value):
        return tuple(value.shape)
    if not isinstance(value, (tuple, list)):
        return (1,)
    shape = []
    while isinstance(value, (tuple, list)):
        shape.append(len(value))
        if not value:
            return tuple(shape)
        value = value[0]
    return tuple(shape) + (tuple(value.shape) if _is_array(value) else ())


def _matrices(a, *args, **kwargs) -> int:
    """Factorizations of a stack of m x n matrices: at most (m + n)^2 elements each."""
    shape = _shape(a)
    m, n = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, elements(a))
    return math.prod(shape[:-2]) * (m + n) ** 2


def _matmul(a, b, *args, **kwargs) -> int:
    sa, sb = _shape(a), _shape(b)
    m, n = (sa[-2] if len(sa) > 1 else 1), (sb[-1] if len(sb) > 1 else 1)
    try:
        batch = math.prod(np.broadcast_shapes(sa[:-2], sb[:-2]))
    except ValueError:  # NumPy refuses these shapes itself
        batch = 1
    return batch * m * n + elements(a) + elements(b)


def _dot(a, b, out=None) -> int:
    sa, sb = _shape(a), _shape(b)
    return math.prod(sa[:-1]) * math.prod(sb[:-2] + sb[-1:]) + elements(a) + elements(b)


def _tensordot(a, b, axes=2) -> int:
    sa, sb = _shape(a), _shape(b)
    free_a: Sequence[int]
    free_b: Sequence[int]
    if isinstance(axes, int):
        free_a, free_b = sa[:len(sa) - axes], sb[axes:]
    else:
        ax_a, ax_b = (list(np.atleast_1d(x).tolist()) for x in axes)
        free_a = [d for i, d in enumerate(sa) if i not in {x % len(sa) for x in ax_a}]
        free_b = [d for i, d in enumerate(sb) if i not in {x % len(sb) for x in ax_b}]
    return math.prod(free_a) * math.prod(free_b) + elements(a) + elements(b)


def _chain(arrays, *args, **kwargs) -> int:
    """multi_dot: each product in the chain is at most the largest dimension squared."""
    largest = max((max(_shape(a), default=1) for a in arrays), default=1)
    return 2 * largest * largest + elements(arrays)


def _lstsq(a, b, rcond=None) -> int:
    sa, sb = _shape(a), _shape(b)
    n, k = sa[-1], (sb[-1] if len(sb) > 1 else 1)
    return n * k + k + n + 1 + elements(a) + elements(b)


def _fft(a, n=None, axis=-1, norm=None, out=None, s=None, axes=None) -> int:
    """The transforms' rules size them exactly; this holds for any n= or s= as well."""
    sizes = [abs(int(n))] if n is not None else []
    sizes += [abs(int(x)) for x in s] if s is not None else []
    return 2 * elements(a) * max(math.prod(sizes), 1) + 2


def _windows(x, window_shape, axis=None, **kwargs) -> int:
    return elements(x) * math.prod(np.atleast_1d(window_shape).tolist())


def _einsum(subscripts, *operands, **kwargs) -> int:
    """Each output dimension is a labelled dimension of some operand, or a broadcast one."""
    if not isinstance(subscripts, str):
        return _product(*operands)
    sizes: dict = {}
    broadcast = 1
    inputs = subscripts.replace(" ", "").partition("->")[0].split(",")
    for term, operand in zip(inputs, operands):
        shape = _shape(operand)
        head, dots, tail = term.partition("...")
        labelled = shape[:len(head)] + (shape[len(shape) - len(tail):] if tail else ())
        for label, size in zip(head + tail, labelled):
            sizes[label] = max(sizes.get(label, 1), size)
        if dots:  # the dimensions the ellipsis stands for
            broadcast *= math.prod(shape[len(head):len(shape) - len(tail)])
    return math.prod(sizes.values()) * broadcast + elements(operands)


def _take(a, indices, axis=None, **kwargs) -> int:
    """Elements of `a` along `axis` picked by `indices`: the rest of `a` once per index."""
    if axis is None:
        return elements(indices)
    shape = _shape(a)
    rest = math.prod(d for i, d in enumerate(shape) if i != int(axis) % max(len(shape), 1))
    return rest * elements(indices)


def _tile(a, reps) -> int:
    return elements(a) * math.prod(abs(int(r)) for r in np.atleast_1d(reps).tolist())


def _repeat(a, repeats, axis=None) -> int:
    if type(repeats) is Spec:
        raise TypeError("np.repeat: counts held in a tensor size the result from the data, "
                        "which cannot be bounded before it is made; mwrt.array_api.repeat "
                        "composes it from cumulative_sum, searchsorted and take")
    return elements(a) * max((abs(int(r)) for r in np.atleast_1d(repeats).tolist()), default=0)


def _cumulative(x, axis=None, dtype=None, include_initial=False) -> int:
    return elements(x) + math.prod(max(d, 1) for d in _shape(x))  # one more per lane


def _broadcast_to(array, shape, **kwargs) -> int:
    return math.prod(np.atleast_1d(shape).tolist()) + elements(array)


# path -> bound on its results' elements, by family, one line per function.
ALLOWED = {
    # linalg (most are sized exactly by their rules in numpy_shape_rules.py)
    "linalg.inv": linear(), "linalg.pinv": linear(), "linalg.cholesky": linear(),
    "linalg.matrix_power": linear(), "linalg.det": linear(), "linalg.slogdet": linear(2),
    "linalg.cond": linear(), "linalg.matrix_rank": linear(), "linalg.eigh": linear(2),
    "linalg.eigvalsh": linear(), "linalg.eig": linear(2), "linalg.eigvals": linear(),
    "linalg.svd": _matrices, "linalg.svdvals": linear(), "linalg.qr": _matrices,
    "linalg.norm": linear(), "linalg.matrix_norm": linear(), "linalg.vector_norm": linear(),
    "linalg.matrix_transpose": linear(), "linalg.solve": linear(), "linalg.lstsq": _lstsq,
    "linalg.matmul": _matmul, "linalg.multi_dot": _chain, "linalg.tensordot": _tensordot,
    "linalg.outer": _product, "linalg.cross": _broadcast, "linalg.diagonal": linear(),
    "linalg.trace": linear(), "linalg.vecdot": _broadcast,
    # fft (sized exactly by their rules)
    "fft.fft": _fft, "fft.ifft": _fft, "fft.rfft": _fft, "fft.ihfft": _fft, "fft.irfft": _fft,
    "fft.hfft": _fft, "fft.fftn": _fft, "fft.ifftn": _fft, "fft.fft2": _fft,
    "fft.ifft2": _fft, "fft.rfftn": _fft, "fft.rfft2": _fft, "fft.irfftn": _fft,
    "fft.irfft2": _fft, "fft.fftshift": linear(), "fft.ifftshift": linear(),
    # products
    "einsum": _einsum, "outer": _product, "kron": _product, "tensordot": _tensordot,
    "inner": _product, "vdot": linear(), "dot": _dot, "matmul": _matmul, "cross": _broadcast,
    "convolve": linear(), "correlate": linear(), "polymul": linear(), "polyval": _broadcast,
    # reductions and statistics
    "sum": linear(), "prod": linear(), "mean": linear(), "std": linear(), "var": linear(),
    "min": linear(), "max": linear(), "argmin": linear(), "argmax": linear(), "all": linear(),
    "any": linear(), "ptp": linear(), "median": linear(), "nanmedian": linear(),
    "percentile": _product, "quantile": _product, "nanpercentile": _product,
    "nanquantile": _product, "average": linear(2), "cov": _cov, "corrcoef": _cov,
    "histogram": _histogram, "histogram_bin_edges": _histogram, "histogram2d": _histogram2d,
    "histogramdd": _histogramdd, "nansum": linear(), "nanprod": linear(), "nanmean": linear(),
    "nanstd": linear(), "nanvar": linear(), "nanmin": linear(), "nanmax": linear(),
    "nanargmin": linear(), "nanargmax": linear(), "count_nonzero": linear(),
    "cumsum": linear(), "cumprod": linear(), "nancumsum": linear(), "nancumprod": linear(),
    # sorting, searching, sets
    "sort": linear(), "argsort": linear(), "sort_complex": linear(), "lexsort": linear(),
    "partition": linear(), "argpartition": linear(), "searchsorted": linear(),
    "digitize": linear(), "isin": linear(), "unique": _unique, "unique_values": linear(),
    "unique_counts": linear(2), "unique_inverse": linear(2), "unique_all": linear(4),
    "intersect1d": linear(3), "union1d": linear(), "setdiff1d": linear(),
    "setxor1d": linear(), "nonzero": _indices, "flatnonzero": linear(), "argwhere": _indices,
    "where": _where,
    # elementwise and differences
    "diff": linear(), "ediff1d": linear(), "gradient": _indices, "trapezoid": linear(),
    "interp": _broadcast, "unwrap": linear(), "sinc": linear(), "i0": linear(),
    "nan_to_num": linear(), "real_if_close": linear(), "angle": linear(), "real": linear(),
    "imag": linear(), "conj": linear(), "round": linear(), "around": linear(), "fix": linear(),
    "clip": _broadcast, "isclose": _broadcast, "allclose": _broadcast,
    "array_equal": _broadcast, "array_equiv": _broadcast,
    # rearranging what is given (views or copies of it)
    "reshape": linear(), "ravel": linear(), "transpose": linear(), "swapaxes": linear(),
    "moveaxis": linear(), "squeeze": linear(), "expand_dims": linear(), "flip": linear(),
    "roll": linear(), "rot90": linear(), "flipud": linear(), "fliplr": linear(),
    "diagonal": linear(), "trace": linear(), "tril": linear(), "triu": linear(),
    "diag": _diagflat, "diagflat": _diagflat, "copy": linear(), "ascontiguousarray": linear(),
    "atleast_1d": linear(), "atleast_2d": linear(), "atleast_3d": linear(),
    "concatenate": linear(), "stack": linear(), "hstack": linear(), "vstack": linear(),
    "dstack": linear(), "column_stack": linear(), "append": linear(), "delete": linear(),
    "trim_zeros": linear(), "take_along_axis": _broadcast, "compress": linear(),
    "extract": linear(), "tril_indices_from": _indices, "triu_indices_from": _indices,
    "diag_indices_from": _indices, "unravel_index": _unravel, "ravel_multi_index": linear(),
    "meshgrid": _meshgrid, "broadcast_arrays": _broadcast_arrays, "vander": _vander,
    "zeros_like": _like, "ones_like": _like, "full_like": _like, "empty_like": _like,
    "lib.stride_tricks.sliding_window_view": _windows,
    # the Array API standard's names (mwrt.array_api runs these by path)
    "concat": linear(), "permute_dims": linear(), "matrix_transpose": linear(),
    "unstack": linear(), "split": linear(), "array_split": linear(), "hsplit": linear(),
    "vsplit": linear(), "dsplit": linear(), "take": _take, "tile": _tile, "repeat": _repeat,
    "cumulative_sum": _cumulative, "cumulative_prod": _cumulative, "vecdot": _broadcast,
    "broadcast_to": _broadcast_to,
}
# Change their first argument, within its bounds (the numpy_ op).
IN_PLACE = {"copyto", "fill_diagonal", "put", "place", "putmask", "put_along_axis"}
# Run as another function: never hand out memory that was not filled.
ALIASES = {"empty_like": "zeros_like"}
# Named in refusals, so that a reader of the log sees what was asked for.
DANGEROUS = ("lib.stride_tricks.as_strided", "frombuffer", "fromfile", "memmap", "load",
             "ctypeslib", "lib.format", "ndarray", "empty", "apply_along_axis", "vectorize")


def allowed(path: str, inplace: bool = False) -> bool:
    """True if np.<path> may run by name on a worker (listed here)."""
    return path in (IN_PLACE if inplace else ALLOWED)


def resolve(xp, path: str, inplace: bool = False):
    """The function at `path` ("linalg.inv") in namespace `xp`; refuses paths not listed."""
    if not isinstance(path, str) or not allowed(path, inplace):
        kind = "in-place " if inplace else ""
        raise ValueError(f"np.{path!s:.80}: not a NumPy function mwrt runs by name on a worker "
                         f"(its {kind}functions are listed in mwrt/ops/numpy_allowlist.py); run it "
                         "on the master on t.numpy(), or with mwrt.remote on a keyed worker")
    fn = xp
    for part in ALIASES.get(path, path).split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise AttributeError(f"np.{path}: {getattr(xp, '__name__', xp)} has no {path} on "
                                 "this worker; .cpu() the tensor, or use mwrt.remote")
    return fn


def width(args: tuple, kwargs: dict) -> int:
    """Bytes per result element: WIDTH, or the widest dtype among the arguments (a Spec's, an
    inline array's, or one named: zeros_like(a, "V1048576") is 1 MiB an element, and so is a
    subarray dtype's ("f8", (131072,)), positional or not)."""
    widest = WIDTH
    for value in (*args, *kwargs.values()):
        if _is_array(value):
            widest = max(widest, value.dtype.itemsize)
        elif (named := _dtype_named(value)) is not None:
            widest = max(widest, named.itemsize)
    return widest


def refuse_objects(path: str, args: tuple, kwargs: dict) -> None:
    """Refuse arguments that have NumPy make an array of Python objects: a dtype naming
    object, or an inline sequence NumPy reads as one (None among numbers). Such an array's
    work and memory have no bound (a product of Python ints gains digits as it goes), and
    it would hold up a worker that serves other masters."""
    for value in (*args, *kwargs.values()):
        named = _dtype_named(value)
        if (named is not None and named.hasobject) or _holds_objects(value):
            raise TypeError(f"np.{path}: makes an array of Python objects (got {value!r:.60}, "
                            "expected numbers and numeric dtypes); object dtype is refused on "
                            "a worker: compute it on the master, on t.numpy()")


def _dtype_named(value) -> np.dtype | None:
    """The dtype `value` names, if it names one (a string, a (base, shape) tuple, a dict of
    fields); None for what names none (a subscript string, a mode, an axis tuple)."""
    if isinstance(value, np.dtype):
        return value
    if not isinstance(value, (str, tuple, list, dict)):
        return None
    named: Any = value  # any of these may name a dtype; np.dtype is the judge
    try:
        return np.dtype(named)
    except (TypeError, ValueError, SyntaxError, OverflowError):
        return None


def _holds_objects(value) -> bool:
    """True if NumPy reads inline sequence `value` as an array of objects."""
    if not isinstance(value, (tuple, list)):
        return False
    try:
        return np.asarray(_stand_in(value)).dtype.hasobject
    except (ValueError, TypeError):  # a ragged sequence, which NumPy refuses itself
        return False


def _stand_in(value):
    """`value` with a number in place of each array: only its leaves decide object dtype."""
    if isinstance(value, (tuple, list)):
        return [_stand_in(v) for v in value]
    return 0 if _is_array(value) else value


def inplace_bytes(target, args: tuple, kwargs: dict) -> int:
    """At most how many bytes an in-place function (IN_PLACE) makes beside its target: the
    arrays of its inline arguments, and the places its arguments broadcast to past the
    target's own (put_along_axis's indices (N, 1) along a (1, K) target visit N x K)."""
    values = (*args, *kwargs.values())
    inline = [v for v in values if type(v) is not Spec and isinstance(v, (np.ndarray, tuple,
                                                                         list))]
    try:
        spread = math.prod(np.broadcast_shapes(*(_shape(v) for v in (target, *values)
                                                 if _is_array(v) or isinstance(v, (tuple, list)))))
    except (ValueError, TypeError):  # NumPy refuses these shapes itself, having made nothing
        spread = 0
    held = math.prod(target.shape) if _is_array(target) else 0
    item = max(target.dtype.itemsize if _is_array(target) else WIDTH, 8)  # indices are intp
    return (max(spread - held, 0) + sum(elements(v) for v in inline)) * item


def result_bytes(path: str, args: tuple, kwargs: dict) -> int:
    """At most how many bytes np.<path>(*args, **kwargs) returns (Specs for tensors)."""
    bound = ALLOWED.get(path)
    if bound is None:
        return 0  # refused by name when it runs
    return bound(*args, **kwargs) * width(args, kwargs)
