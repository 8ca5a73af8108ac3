"""The standard's array functions (manipulation, indexing, searching, sets, sorting,
statistics, utilities, the main namespace's linear algebra), each one remote op.

Where NumPy's function of the standard's name already follows the standard it runs by
name on the worker (CuPy's on a GPU); where it does not (sort's `descending`, the unique_*
named tuples, lists where NumPy gives tuples) the master composes the standard's result
from remote ops. Nothing here copies values to the master.
"""

from __future__ import annotations

from typing import NamedTuple

from ..master import creation
from ..master.tensor import DistributedTensor
from ._run import op, run, tensor, wire_dtype

__all__ = [
    "broadcast_arrays", "broadcast_to", "concat", "expand_dims", "flip", "moveaxis",
    "permute_dims", "repeat", "reshape", "roll", "squeeze", "stack", "tile", "unstack", "take",
    "take_along_axis", "argmax", "argmin", "count_nonzero", "nonzero", "searchsorted", "where",
    "unique_all", "unique_counts", "unique_inverse", "unique_values", "sort", "argsort", "max",
    "min", "all", "any", "mean", "sum", "prod", "std", "var", "cumulative_sum",
    "cumulative_prod", "diff", "matmul", "matrix_transpose", "tensordot", "vecdot"]


class UniqueAllResult(NamedTuple):
    """unique_all's result."""

    values: DistributedTensor
    indices: DistributedTensor
    inverse_indices: DistributedTensor
    counts: DistributedTensor


class UniqueCountsResult(NamedTuple):
    """unique_counts's result."""

    values: DistributedTensor
    counts: DistributedTensor


class UniqueInverseResult(NamedTuple):
    """unique_inverse's result."""

    values: DistributedTensor
    inverse_indices: DistributedTensor


def _axis(axis):
    return {} if axis is None else {"axis": axis}


# -- manipulation ---------------------------------------------------------------------

def broadcast_arrays(*arrays) -> list:
    """The tensors broadcast against each other (read-only views)."""
    if len(arrays) == 1:
        return [arrays[0]]
    return list(run("broadcast_arrays", *arrays))


def broadcast_to(x, /, shape):
    """`x` broadcast to `shape` (a read-only view)."""
    return op("broadcast_to", x, tuple(shape))


def concat(arrays, /, *, axis=0):
    """The tensors joined along `axis` (flattened first if axis is None)."""
    return run("concat", tuple(arrays), axis=axis)


def expand_dims(x, /, axis=0):
    """`x` with a new length-1 axis at `axis` (a view)."""
    return op("expand_dims", x, axis)


def flip(x, /, *, axis=None):
    """`x` with the order of elements reversed along `axis` (all axes if None)."""
    return op("flip", x, **_axis(axis))


def moveaxis(x, source, destination, /):
    """`x` with axes moved from `source` to `destination` (a view)."""
    return op("moveaxis", x, source, destination)


def permute_dims(x, /, axes):
    """`x` with its axes in the order `axes` (a view)."""
    return op("transpose", x, tuple(axes))


def repeat(x, repeats, /, *, axis=None):
    """Each element repeated `repeats` times (an int or a tensor of counts), along `axis`."""
    if isinstance(repeats, DistributedTensor) and repeats.size == 1:
        repeats = int(repeats.reshape(()))  # one count: its value sizes the result
    if not isinstance(repeats, DistributedTensor):
        return run("repeat", x, repeats, **_axis(axis))
    # A count per element: element i fills the places below the running total's i-th entry
    # (the total, one number, is read back: it is the result's length).
    if axis is None:
        x, axis = op("reshape", tensor(x, "repeat"), (-1,)), 0
    ends = cumulative_sum(repeats)
    total = int(ends[-1]) if ends.shape[0] else 0
    places = creation.arange(0, total, 1, dtype=ends.dtype, node=x.get_node(),
                             device=x.get_device())
    return take(x, searchsorted(ends, places, side="right"), axis=axis)


def reshape(x, /, shape, *, copy=None):
    """`x` in `shape` (-1 once inferred); copy=False refuses a reshape that must copy."""
    if copy is None:
        return op("reshape", tensor(x, "reshape"), tuple(shape))
    return run("reshape", x, tuple(shape), copy=copy)


def roll(x, /, shift, *, axis=None):
    """`x` with elements shifted by `shift` along `axis` (flattened if None), wrapping."""
    return run("roll", x, shift, **_axis(axis))


def squeeze(x, /, axis):
    """`x` without the length-1 axes `axis` (a view)."""
    return op("squeeze", x, axis=axis)


def stack(arrays, /, *, axis=0):
    """The tensors joined along a new axis."""
    return run("stack", tuple(arrays), axis=axis)


def tile(x, repetitions, /):
    """`x` repeated `repetitions` times along each axis."""
    return run("tile", x, tuple(repetitions))


def unstack(x, /, *, axis=0) -> tuple:
    """The slices of `x` along `axis`, as a tuple of views."""
    if not tensor(x, "unstack").shape[axis]:
        return ()  # no slices: nothing to issue
    out = run("unstack", x, axis=axis)
    return out if isinstance(out, tuple) else (out,)


# -- indexing ---------------------------------------------------------------------------

def take(x, indices, /, *, axis=None):
    """The elements of `x` at `indices` (an integer tensor) along `axis`."""
    return run("take", x, indices, **_axis(axis))


def take_along_axis(x, indices, /, *, axis=-1):
    """Elements picked by `indices` of the same rank as `x`, along `axis`."""
    return run("take_along_axis", x, indices, axis=axis)


# -- searching --------------------------------------------------------------------------

def argmax(x, /, *, axis=None, keepdims=False):
    """The index of the first maximum (of the flattened tensor if axis is None)."""
    return op("argmax", x, **_axis(axis), keepdims=keepdims)


def argmin(x, /, *, axis=None, keepdims=False):
    """The index of the first minimum (of the flattened tensor if axis is None)."""
    return op("argmin", x, **_axis(axis), keepdims=keepdims)


def count_nonzero(x, /, *, axis=None, keepdims=False):
    """How many elements are not zero, over `axis`."""
    return op("count_nonzero", x, **_axis(axis), keepdims=keepdims)


def nonzero(x, /) -> tuple:
    """The indices of the non-zero elements, one tensor per axis (their length is the data's:
    asked of the worker when needed)."""
    x = tensor(x, "nonzero")
    if x.ndim == 0:
        raise ValueError("nonzero: a 0-d tensor has no axes to index (got shape ())")
    out = run("nonzero", x, outputs=x.ndim)
    return out if isinstance(out, tuple) else (out,)


def searchsorted(x1, x2, /, *, side="left", sorter=None):
    """Where the elements of `x2` go in sorted 1-D `x1` to keep it sorted."""
    return run("searchsorted", x1, x2, side=side, sorter=sorter)


def where(condition, x1=None, x2=None, /):
    """Elements of `x1` where `condition` holds, else of `x2`; with `condition` alone, its
    nonzero() as NumPy's where gives (scikit-learn's roc_curve calls xp.where(mask))."""
    if x1 is None and x2 is None:
        return nonzero(condition)
    if x1 is None or x2 is None:
        raise TypeError("where: give both x1 and x2, or neither (got one)")
    return op("where", condition, x1, x2)


# -- sets -------------------------------------------------------------------------------

def unique_all(x, /) -> UniqueAllResult:
    """The unique values, the first index of each, each element's index among the values,
    and the counts."""
    return UniqueAllResult(*run("unique_all", x, outputs=4))


def unique_counts(x, /) -> UniqueCountsResult:
    """The unique values and how often each occurs."""
    return UniqueCountsResult(*run("unique_counts", x, outputs=2))


def unique_inverse(x, /) -> UniqueInverseResult:
    """The unique values and each element's index among them (in `x`'s shape)."""
    return UniqueInverseResult(*run("unique_inverse", x, outputs=2))


def unique_values(x, /):
    """The unique values, sorted (NumPy 2.3's unique_values leaves them unsorted; sorted, a
    fit's classes_ come out as on NumPy), NaNs each its own."""
    return run("unique", x, equal_nan=False)


# -- sorting ----------------------------------------------------------------------------

def sort(x, /, *, axis=-1, descending=False, stable=True):
    """`x` sorted along `axis` (largest first if `descending`)."""
    out = run("sort", x, axis=axis, kind="stable" if stable else None)
    return op("flip", out, axis=axis) if descending else out


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    """The indices that sort `x` along `axis`; equal elements keep their order if `stable`,
    also when `descending`."""
    kind = "stable" if stable else None
    if not descending:
        return run("argsort", x, axis=axis, kind=kind)
    # The last of equal elements first in the flipped tensor is the first in `x`.
    x = tensor(x, "argsort")
    flipped = run("argsort", op("flip", x, axis=axis), axis=axis, kind=kind)
    return op("subtract", x.shape[axis] - 1, op("flip", flipped, axis=axis))


# -- statistics -------------------------------------------------------------------------

def _reduction(name: str):
    def reduce(x, /, *, axis=None, keepdims=False, **kwargs):
        return op(name, tensor(x, name), **_axis(axis), keepdims=keepdims,
                  **{k: v for k, v in kwargs.items() if v is not None})
    reduce.__name__ = reduce.__qualname__ = name
    return reduce


max = _reduction("max")
min = _reduction("min")
all = _reduction("all")
any = _reduction("any")
mean = _reduction("mean")
max.__doc__ = "The largest element over `axis`."
min.__doc__ = "The smallest element over `axis`."
all.__doc__ = "Whether every element over `axis` is true."
any.__doc__ = "Whether some element over `axis` is true."
mean.__doc__ = "The arithmetic mean over `axis`."


def sum(x, /, *, axis=None, dtype=None, keepdims=False):
    """The sum over `axis` (in `dtype` if given)."""
    return _reduction("sum")(x, axis=axis, keepdims=keepdims, dtype=wire_dtype(dtype))


def prod(x, /, *, axis=None, dtype=None, keepdims=False):
    """The product over `axis` (in `dtype` if given)."""
    return _reduction("prod")(x, axis=axis, keepdims=keepdims, dtype=wire_dtype(dtype))


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    """The standard deviation over `axis`, with `correction` degrees of freedom removed."""
    return _reduction("std")(x, axis=axis, keepdims=keepdims, correction=correction)


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    """The variance over `axis`, with `correction` degrees of freedom removed."""
    return _reduction("var")(x, axis=axis, keepdims=keepdims, correction=correction)


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    """Running sums along `axis`, starting with 0 if `include_initial`."""
    return run("cumulative_sum", x, axis=axis, dtype=wire_dtype(dtype),
               include_initial=include_initial)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    """Running products along `axis`, starting with 1 if `include_initial`."""
    return run("cumulative_prod", x, axis=axis, dtype=wire_dtype(dtype),
               include_initial=include_initial)


def diff(x, /, n=1, axis=-1, prepend=None, append=None):
    """The `n`-th differences along `axis` (n and axis by place too, as NumPy's and CuPy's
    diff take them: scikit-learn's roc_curve calls xp.diff(x, 2))."""
    kwargs = {k: v for k, v in (("prepend", prepend), ("append", append)) if v is not None}
    return run("diff", x, n=n, axis=axis, **kwargs)


# -- linear algebra of the main namespace -----------------------------------------------

def matmul(x1, x2, /):
    """The matrix product (batches broadcast)."""
    return op("matmul", x1, x2)


def matrix_transpose(x, /):
    """`x` with its last two axes swapped."""
    return op("swapaxes", tensor(x, "matrix_transpose"), -1, -2)


def tensordot(x1, x2, /, *, axes=2):
    """Sums of products over `axes` (a count of trailing/leading axes, or two lists)."""
    if not isinstance(axes, int):
        axes = tuple(tuple(a) if not isinstance(a, int) else a for a in axes)
    return run("tensordot", x1, x2, axes=axes)


def vecdot(x1, x2, /, *, axis=-1):
    """The dot product of vectors along `axis` (the first conjugated)."""
    return run("vecdot", x1, x2, axis=axis)
