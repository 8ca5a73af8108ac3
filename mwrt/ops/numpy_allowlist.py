"""The NumPy functions the `numpy` op may run by name on a worker, each with its result's size.

A worker runs np.<path> for a master only if the path is listed here: functions that compute
on the arrays they are given and return new arrays (or views within them). Nothing that makes
an array from an address or a buffer (lib.stride_tricks.as_strided, frombuffer, ctypeslib,
ndarray), reads or writes files (load, save, fromfile, memmap, lib.format), runs a callable or
unpickles (apply_along_axis, vectorize, frompyfunc, piecewise), or hands out memory it did not
fill (empty: `empty_like` runs as `zeros_like`) is listed, and whatever is not listed is
refused by name: an unkeyed daemon, which any local user may reach, runs no code of theirs.

Each entry is one line: the path and a bound on its results' element count (numpy_bounds.py),
computed from the arguments (Specs in place of tensors) before the function runs, so that an
oversized result is refused unmade (mwrt.worker.quotas). A function with a shape rule
(numpy_functions.RULES) is sized exactly by the rule's shape; the bound serves the forms the
rule leaves UNKNOWN.
Adding a function is adding its line, with a bound that holds for every argument.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .numpy_bounds import (
    broadcast,
    broadcast_arrays,
    broadcast_to,
    chain,
    cov,
    cumulative,
    diagflat,
    dot,
    einsum,
    elements,
    fft,
    histogram,
    histogram2d,
    histogram_bin_edges,
    histogramdd,
    indices,
    is_array,
    like,
    linear,
    lstsq,
    matmul,
    matrices,
    meshgrid,
    product,
    repeat,
    shape_of,
    take,
    tensordot,
    tile,
    unique,
    unravel,
    vander,
    where,
    windows,
)
from .registry import Spec

# Results are sized at 16 bytes per element (complex128) or the widest dtype among the
# arguments, whichever is more: the dtype of a function's result is not known unrun.
WIDTH = 16


# path -> bound on its results' elements, by family, one line per function.
ALLOWED = {
    # linalg (most are sized exactly by their rules in numpy_shape_rules.py)
    "linalg.inv": linear(), "linalg.pinv": linear(), "linalg.cholesky": linear(),
    "linalg.matrix_power": linear(), "linalg.det": linear(), "linalg.slogdet": linear(2),
    "linalg.cond": linear(), "linalg.matrix_rank": linear(), "linalg.eigh": linear(2),
    "linalg.eigvalsh": linear(), "linalg.eig": linear(2), "linalg.eigvals": linear(),
    "linalg.svd": matrices, "linalg.svdvals": linear(), "linalg.qr": matrices,
    "linalg.norm": linear(), "linalg.matrix_norm": linear(), "linalg.vector_norm": linear(),
    "linalg.matrix_transpose": linear(), "linalg.solve": linear(), "linalg.lstsq": lstsq,
    "linalg.matmul": matmul, "linalg.multi_dot": chain, "linalg.tensordot": tensordot,
    "linalg.outer": product, "linalg.cross": broadcast, "linalg.diagonal": linear(),
    "linalg.trace": linear(), "linalg.vecdot": broadcast,
    # fft (sized exactly by their rules)
    "fft.fft": fft, "fft.ifft": fft, "fft.rfft": fft, "fft.ihfft": fft, "fft.irfft": fft,
    "fft.hfft": fft, "fft.fftn": fft, "fft.ifftn": fft, "fft.fft2": fft,
    "fft.ifft2": fft, "fft.rfftn": fft, "fft.rfft2": fft, "fft.irfftn": fft,
    "fft.irfft2": fft, "fft.fftshift": linear(), "fft.ifftshift": linear(),
    # products
    "einsum": einsum, "outer": product, "kron": product, "tensordot": tensordot,
    "inner": product, "vdot": linear(), "dot": dot, "matmul": matmul, "cross": broadcast,
    "convolve": linear(), "correlate": linear(), "polymul": linear(), "polyval": broadcast,
    # reductions and statistics
    "sum": linear(), "prod": linear(), "mean": linear(), "std": linear(), "var": linear(),
    "min": linear(), "max": linear(), "argmin": linear(), "argmax": linear(), "all": linear(),
    "any": linear(), "ptp": linear(), "median": linear(), "nanmedian": linear(),
    "percentile": product, "quantile": product, "nanpercentile": product,
    "nanquantile": product, "average": linear(2), "cov": cov, "corrcoef": cov,
    "histogram": histogram, "histogram_bin_edges": histogram_bin_edges,
    "histogram2d": histogram2d,
    "histogramdd": histogramdd, "nansum": linear(), "nanprod": linear(), "nanmean": linear(),
    "nanstd": linear(), "nanvar": linear(), "nanmin": linear(), "nanmax": linear(),
    "nanargmin": linear(), "nanargmax": linear(), "count_nonzero": linear(),
    "cumsum": linear(), "cumprod": linear(), "nancumsum": linear(), "nancumprod": linear(),
    # sorting, searching, sets
    "sort": linear(), "argsort": linear(), "sort_complex": linear(), "lexsort": linear(),
    "partition": linear(), "argpartition": linear(), "searchsorted": linear(),
    "digitize": linear(), "isin": linear(), "unique": unique, "unique_values": linear(),
    "unique_counts": linear(2), "unique_inverse": linear(2), "unique_all": linear(4),
    "intersect1d": linear(3), "union1d": linear(), "setdiff1d": linear(),
    "setxor1d": linear(), "nonzero": indices, "flatnonzero": linear(), "argwhere": indices,
    "where": where,
    # elementwise and differences
    "diff": linear(), "ediff1d": linear(), "gradient": indices, "trapezoid": linear(),
    "interp": broadcast, "unwrap": linear(), "sinc": linear(), "i0": linear(),
    "nan_to_num": linear(), "real_if_close": linear(), "angle": linear(), "real": linear(),
    "imag": linear(), "conj": linear(), "round": linear(), "around": linear(), "fix": linear(),
    "clip": broadcast, "isclose": broadcast, "allclose": broadcast,
    "array_equal": broadcast, "array_equiv": broadcast,
    # rearranging what is given (views or copies of it)
    "reshape": linear(), "ravel": linear(), "transpose": linear(), "swapaxes": linear(),
    "moveaxis": linear(), "squeeze": linear(), "expand_dims": linear(), "flip": linear(),
    "roll": linear(), "rot90": linear(), "flipud": linear(), "fliplr": linear(),
    "diagonal": linear(), "trace": linear(), "tril": linear(), "triu": linear(),
    "diag": diagflat, "diagflat": diagflat, "copy": linear(), "ascontiguousarray": linear(),
    "atleast_1d": linear(), "atleast_2d": linear(), "atleast_3d": linear(),
    "concatenate": linear(), "stack": linear(), "hstack": linear(), "vstack": linear(),
    "dstack": linear(), "column_stack": linear(), "block": linear(), "append": linear(),
    "delete": linear(),
    "trim_zeros": linear(), "take_along_axis": broadcast, "compress": linear(),
    "extract": linear(), "tril_indices_from": indices, "triu_indices_from": indices,
    "diag_indices_from": indices, "unravel_index": unravel, "ravel_multi_index": linear(),
    "meshgrid": meshgrid, "broadcast_arrays": broadcast_arrays, "vander": vander,
    "zeros_like": like, "ones_like": like, "full_like": like, "empty_like": like,
    "lib.stride_tricks.sliding_window_view": windows,
    # the Array API standard's names (mwrt.array_api runs these by path)
    "concat": linear(), "permute_dims": linear(), "matrix_transpose": linear(),
    "unstack": linear(), "split": linear(), "array_split": linear(), "hsplit": linear(),
    "vsplit": linear(), "dsplit": linear(), "take": take, "tile": tile, "repeat": repeat,
    "cumulative_sum": cumulative, "cumulative_prod": cumulative, "vecdot": broadcast,
    "matvec": broadcast, "vecmat": broadcast,
    "broadcast_to": broadcast_to,
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
        if is_array(value):
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
    return 0 if is_array(value) else value


def inplace_bytes(target, args: tuple, kwargs: dict) -> int:
    """At most how many bytes an in-place function (IN_PLACE) makes beside its target: the
    arrays of its inline arguments, and the places its arguments broadcast to past the
    target's own (put_along_axis's indices (N, 1) along a (1, K) target visit N x K)."""
    values = (*args, *kwargs.values())
    inline = [v for v in values if type(v) is not Spec and isinstance(v, (np.ndarray, tuple,
                                                                         list))]
    try:
        spread = math.prod(np.broadcast_shapes(*(shape_of(v) for v in (target, *values)
                                                 if is_array(v) or isinstance(v, (tuple, list)))))
    except (ValueError, TypeError):  # NumPy refuses these shapes itself, having made nothing
        spread = 0
    held = math.prod(target.shape) if is_array(target) else 0
    item = max(target.dtype.itemsize if is_array(target) else WIDTH, 8)  # indices are intp
    return (max(spread - held, 0) + sum(elements(v) for v in inline)) * item


def result_bytes(path: str, args: tuple, kwargs: dict) -> int:
    """At most how many bytes np.<path>(*args, **kwargs) returns (Specs for tensors)."""
    bound = ALLOWED.get(path)
    if bound is None:
        return 0  # refused by name when it runs
    return bound(*args, **kwargs) * width(args, kwargs)
