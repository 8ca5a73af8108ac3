"""Bounds on the element count of a NumPy function's results, computed from its arguments
(Specs in place of tensors) before it runs: the sizes numpy_allowlist.py gives each function
it lists, so that an oversized result is refused unmade. A bound holds for every argument
the function accepts; where the data decide the size (histogram bins counted from the data,
np.repeat's counts in a tensor) the call is refused by name."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .registry import Spec


def is_array(value) -> bool:
    """A tensor's Spec, or an array sent inline with the command."""
    return type(value) is Spec or isinstance(value, np.ndarray)


def elements(value) -> int:
    """How many elements `value` holds: a Spec's or an inline array's size, a nested list's
    leaves, 1 for a scalar."""
    if is_array(value):
        return math.prod(value.shape)
    if isinstance(value, (tuple, list)):
        return sum(elements(v) for v in value) or 1
    if isinstance(value, dict):
        return sum(elements(v) for v in value.values()) or 1
    return 1


def _ndim(value) -> int:
    return len(shape_of(value))


def _total(*args, **kwargs) -> int:
    return elements(args) + elements(kwargs)


def linear(k: int = 1):
    """At most `k` times as many elements as the arguments hold (sorts, set operations,
    reductions, cumulative sums, differences: never more than they are given)."""
    return lambda *args, **kwargs: k * _total(*args, **kwargs)


def indices(*args, **kwargs) -> int:
    """Index arrays, one per dimension (nonzero, argwhere, where(c), *_indices_from)."""
    return max(map(_ndim, args), default=1) * _total(*args, **kwargs)


def product(*args, **kwargs) -> int:
    """The product of the arguments' sizes (outer products, quantiles of many q)."""
    return math.prod(elements(v) for v in (*args, *kwargs.values()))


def broadcast(*args, **kwargs) -> int:
    """Broadcasting functions: the largest of each aligned dimension of the operands (the
    broadcast shape where NumPy accepts them; an axis tuple among them only adds to it)."""
    shapes = [shape_of(v) for v in (*args, *kwargs.values())
              if is_array(v) or isinstance(v, (tuple, list))]
    ndim = max(map(len, shapes), default=0)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    return math.prod(max(dims) for dims in zip(*padded)) + _total(*args, **kwargs)


def like(a, dtype=None, order="K", subok=True, shape=None, **kwargs) -> int:
    return elements(a) if shape is None else math.prod(np.atleast_1d(shape).tolist())


def _bins(bins, dims: int, name: str = "histogram") -> int:
    """Histogram bins and edges: bins+1 per dimension for a count, an array's size for edges."""
    counted = type(bins) is Spec and (not bins.shape or (dims > 1 and bins.shape[0] == dims))
    if isinstance(bins, str) or counted:
        raise TypeError(f"np.{name}: bins={bins!r:.40} are counted from the data, so the "
                        "result cannot be sized before it is made; pass a count or edges")
    if dims > 1 and type(bins) is not Spec and shape_of(bins)[:1] == (dims,):  # one per dimension
        return math.prod(_bins(b, 1, name) for b in bins)
    if (isinstance(bins, (int, np.integer)) and not isinstance(bins, (bool, np.bool_))) or \
            (isinstance(bins, np.ndarray) and bins.ndim == 0):  # a count, a NumPy one too
        return (abs(int(bins)) + 1) ** dims
    return (elements(bins) + 1) ** dims


def histogram(a, bins=10, *args, **kwargs) -> int:
    return 2 * _bins(bins, 1) + elements(a)


def histogram_bin_edges(a, bins=10, *args, **kwargs) -> int:
    return _bins(bins, 1, "histogram_bin_edges") + elements(a)


def histogram2d(x, y, bins=10, *args, **kwargs) -> int:
    return 3 * _bins(bins, 2, "histogram2d") + elements(x) + elements(y)


def histogramdd(sample, bins=10, *args, **kwargs) -> int:
    """An array's rows are points; a sequence holds one array of coordinates per dimension."""
    shape = shape_of(sample)
    dims = len(sample) if isinstance(sample, (tuple, list)) else shape[-1] if shape else 1
    return 2 * _bins(bins, dims, "histogramdd") + elements(sample)


def unique(ar, *args, **kwargs) -> int:
    return 4 * elements(ar)  # the values, and up to three arrays of indices or counts


def cov(m, y=None, rowvar=True, *args, **kwargs) -> int:
    def variables(x):
        shape = shape_of(x)
        return 1 if len(shape) < 2 else shape[0] if rowvar else shape[1]
    n = variables(m) + (variables(y) if y is not None else 0)
    return n * n + _total(m, y)


def diagflat(v, k=0) -> int:
    return (elements(v) + abs(int(k))) ** 2


def vander(x, N=None, *args, **kwargs) -> int:
    return elements(x) * (elements(x) if N is None else abs(int(N)))


def meshgrid(*xi, **kwargs) -> int:
    return max(len(xi), 1) * product(*xi)


def broadcast_arrays(*args, **kwargs) -> int:
    return max(len(args), 1) * broadcast(*args)


def where(condition, *args, **kwargs) -> int:
    return broadcast(condition, *args) if args else indices(condition)


def unravel(indices, shape, order="C") -> int:
    return max(elements(shape), 1) * elements(indices)


def shape_of(value) -> tuple:
    """A Spec's or an array's shape, a nested sequence's as NumPy reads it, (1,) a scalar's."""
    if is_array(value):
        return tuple(value.shape)
    if not isinstance(value, (tuple, list)):
        return (1,)
    shape = []
    while isinstance(value, (tuple, list)):
        shape.append(len(value))
        if not value:
            return tuple(shape)
        value = value[0]
    return tuple(shape) + (tuple(value.shape) if is_array(value) else ())


def matrices(a, *args, **kwargs) -> int:
    """Factorizations of a stack of m x n matrices: at most (m + n)^2 elements each."""
    shape = shape_of(a)
    m, n = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, elements(a))
    return math.prod(shape[:-2]) * (m + n) ** 2


def matmul(a, b, *args, **kwargs) -> int:
    sa, sb = shape_of(a), shape_of(b)
    m, n = (sa[-2] if len(sa) > 1 else 1), (sb[-1] if len(sb) > 1 else 1)
    try:
        batch = math.prod(np.broadcast_shapes(sa[:-2], sb[:-2]))
    except ValueError:  # NumPy refuses these shapes itself
        batch = 1
    return batch * m * n + elements(a) + elements(b)


def dot(a, b, out=None) -> int:
    sa, sb = shape_of(a), shape_of(b)
    return math.prod(sa[:-1]) * math.prod(sb[:-2] + sb[-1:]) + elements(a) + elements(b)


def tensordot(a, b, axes=2) -> int:
    sa, sb = shape_of(a), shape_of(b)
    free_a: Sequence[int]
    free_b: Sequence[int]
    if isinstance(axes, int):
        free_a, free_b = sa[:len(sa) - axes], sb[axes:]
    else:
        ax_a, ax_b = (list(np.atleast_1d(x).tolist()) for x in axes)
        free_a = [d for i, d in enumerate(sa) if i not in {x % len(sa) for x in ax_a}]
        free_b = [d for i, d in enumerate(sb) if i not in {x % len(sb) for x in ax_b}]
    return math.prod(free_a) * math.prod(free_b) + elements(a) + elements(b)


def chain(arrays, *args, **kwargs) -> int:
    """multi_dot: each product in the chain is at most the largest dimension squared."""
    largest = max((max(shape_of(a), default=1) for a in arrays), default=1)
    return 2 * largest * largest + elements(arrays)


def lstsq(a, b, rcond=None) -> int:
    sa, sb = shape_of(a), shape_of(b)
    n, k = sa[-1], (sb[-1] if len(sb) > 1 else 1)
    return n * k + k + n + 1 + elements(a) + elements(b)


def fft(a, n=None, axis=-1, norm=None, out=None, s=None, axes=None) -> int:
    """The transforms' rules size them exactly; this holds for any n= or s= as well."""
    sizes = [abs(int(n))] if n is not None else []
    sizes += [abs(int(x)) for x in s] if s is not None else []
    return 2 * elements(a) * max(math.prod(sizes), 1) + 2


def windows(x, window_shape, axis=None, **kwargs) -> int:
    return elements(x) * math.prod(np.atleast_1d(window_shape).tolist())


def einsum(subscripts, *operands, **kwargs) -> int:
    """Each output dimension is a labelled dimension of some operand, or a broadcast one."""
    if not isinstance(subscripts, str):
        return product(*operands)
    sizes: dict = {}
    broadcast = 1
    inputs = subscripts.replace(" ", "").partition("->")[0].split(",")
    for term, operand in zip(inputs, operands):
        shape = shape_of(operand)
        head, dots, tail = term.partition("...")
        labelled = shape[:len(head)] + (shape[len(shape) - len(tail):] if tail else ())
        for label, size in zip(head + tail, labelled):
            sizes[label] = max(sizes.get(label, 1), size)
        if dots:  # the dimensions the ellipsis stands for
            broadcast *= math.prod(shape[len(head):len(shape) - len(tail)])
    return math.prod(sizes.values()) * broadcast + elements(operands)


def take(a, indices, axis=None, **kwargs) -> int:
    """Elements of `a` along `axis` picked by `indices`: the rest of `a` once per index."""
    if axis is None:
        return elements(indices)
    shape = shape_of(a)
    rest = math.prod(d for i, d in enumerate(shape) if i != int(axis) % max(len(shape), 1))
    return rest * elements(indices)


def tile(a, reps) -> int:
    return elements(a) * math.prod(abs(int(r)) for r in np.atleast_1d(reps).tolist())


def repeat(a, repeats, axis=None) -> int:
    if type(repeats) is Spec:
        raise TypeError("np.repeat: counts held in a tensor size the result from the data, "
                        "which cannot be bounded before it is made; mwrt.array_api.repeat "
                        "composes it from cumulative_sum, searchsorted and take")
    return elements(a) * max((abs(int(r)) for r in np.atleast_1d(repeats).tolist()), default=0)


def cumulative(x, axis=None, dtype=None, include_initial=False) -> int:
    return elements(x) + math.prod(max(d, 1) for d in shape_of(x))  # one more per lane


def broadcast_to(array, shape, **kwargs) -> int:
    return math.prod(np.atleast_1d(shape).tolist()) + elements(array)
