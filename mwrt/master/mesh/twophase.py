"""Reductions with a second moment or an index over a sharded axis, in two phases: each
place reduces its block, then the places combine (an all_reduce of a small result).

- var, std: the mean (a Partial sum, made real as the deviations take it), then the sum of
  squared deviations (a Partial sum) over n - ddof: no place ever holds another's block.
- argmax, argmin: the extreme (a Partial max or min, made real as the comparison takes it),
  then the least global position where a block holds it (a Partial min): NumPy's first
  occurrence, NaN first where there is one. With no axis, of the flattened tensor: the
  position is each element's in C order, a sum of the aranges of its axes (each sharded as
  its axis), so no block moves.
- cumsum, cumprod: each place scans its block and reduces it (its total, the identity for
  an empty block); the totals, one element along the axis per place, are all_gathered along
  the mesh dimension (or the several that shard the axis nested); each place combines those
  of the places before it (an exclusive scan) into its scan. Integers wrap as NumPy's do
  (in any order); floats round in another order than NumPy's one pass.

Each is written with mesh ops on the operand where it can be, so every step takes its
placement rule.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...ops import Spec
from .. import issue
from . import regroup
from .moves import redistribute
from .placement import REPLICATE, Shard, local_box

MOMENTS = {"var", "std"}
INDEXES = {"argmax", "argmin"}
SCANS = {"cumsum": ("sum", "add"), "cumprod": ("prod", "multiply")}  # total, combine
_PLAIN = {"axis", "keepdims", "ddof", "dtype"}  # arguments these plans take; others: none


def plan(name: str, t, args: tuple, kwargs: dict, axes: tuple):
    """The two-phase computation of `name` over `axes` as a function of nothing, or None
    where it has none (other arguments, an index over empty axes)."""
    if len(args) > 2 or set(kwargs) - _PLAIN or not axes or (
            "dtype" in kwargs and name not in SCANS):
        return None
    keepdims = bool(kwargs.get("keepdims", False))
    if name in MOMENTS:
        return lambda: _moment(name, t, axes, int(kwargs.get("ddof", 0)), keepdims)
    if name in SCANS:
        return _scan_plan(name, t, args, kwargs)
    if name not in INDEXES or "ddof" in kwargs or t.dtype.kind not in "biufc" or \
            not math.prod(t.shape[a] for a in axes):
        return None
    if kwargs.get("axis", args[1] if len(args) > 1 else None) is not None and len(axes) > 1:
        return None
    return lambda: _index(name, t, axes, keepdims)  # no axis: of the flattened tensor


def _moment(name: str, t, axes: tuple, ddof: int, keepdims: bool):
    mean = t.mean(axis=axes, keepdims=True)
    deviation = t - mean
    # |d|**2: a complex tensor's variance is real
    squares = np.absolute(deviation) ** 2 if t.dtype.kind == "c" else deviation * deviation
    count = math.prod(t.shape[a] for a in axes)
    var = squares.sum(axis=axes, keepdims=keepdims) / max(count - ddof, 0)
    return np.sqrt(var) if name == "std" else var


def _index(name: str, t, axes: tuple, keepdims: bool):
    length = math.prod(t.shape[a] for a in axes)
    extreme = (t.max if name == "argmax" else t.min)(axis=axes, keepdims=True)
    hit = t == extreme
    if t.dtype.kind in "fc":  # NaN is the extreme wherever there is one, as NumPy's
        hit = hit | (t != t)
    positions = None  # each element's position in the C order of `axes`, where it lies
    for a in reversed(axes):
        stride = math.prod(t.shape[b] for b in axes if b > a)
        along = _positions(t, a).reshape((t.shape[a],) + (1,) * (t.ndim - 1 - a))
        along = along * stride if stride != 1 else along
        positions = along if positions is None else along + positions
    first: Any = np.where(hit, positions, length)  # mesh tensors: np.where dispatches
    return first.min(axis=axes, keepdims=keepdims)


def _positions(t, axis: int):
    """The global positions along t's `axis`, a 1-d int64 tensor sharded as that axis is:
    each place makes its block's range."""
    mesh, dtype = t._mesh, np.dtype(np.int64)
    blocks = []
    for coord, block in zip(mesh.coords, t._locals):
        lo, hi = local_box(t.shape, t._placements, mesh.shape, coord)[axis]
        blocks.append(issue.create(block.results, "arange", (hi - lo,), dtype, block._node,
                                   block._device, (lo, hi, 1)))
    placements = tuple(Shard(0) if p == Shard(axis) else REPLICATE for p in t._placements)
    return t.results.on_mesh(mesh, placements, blocks, Spec((t.shape[axis],), dtype))


def _scan_plan(name: str, t, args: tuple, kwargs: dict):
    """The two-phase scan along t's axis that one mesh dimension shards (its other
    dimensions not on it, none Partial), as a function of nothing; None otherwise."""
    axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
    if "keepdims" in kwargs or "ddof" in kwargs or isinstance(axis, tuple):
        return None
    extra = {"dtype": kwargs["dtype"]} if kwargs.get("dtype") is not None else {}
    if axis is None and t.ndim != 1:  # of the flattened tensor, where it stays sharded
        if not t.ndim or not regroup.flattens(t):
            return None
        return lambda: getattr(t.reshape(-1), name)(axis=0, **extra)
    axis = 0 if axis is None else axis
    axis %= t.ndim
    dims = tuple(d for d, p in enumerate(t._placements) if p == Shard(axis))
    if not dims or any(p.is_partial() for p in t._placements):
        return None
    return lambda: _scan(name, t, axis, dims, extra)


def _scan(name: str, t, axis: int, dims: tuple, extra: dict):
    """The scan along `axis`, sharded along mesh dimensions `dims` (nested: a place's rank
    along them is its block's order along the axis)."""
    total, combine = SCANS[name]
    mesh = t._mesh
    rank = {p: k for line in mesh.groups(dims) for k, p in enumerate(line)}
    scans = [issue.call(name, block, axis=axis, **extra) for block in t._locals]
    totals = [issue.call(total, block, axis=axis, keepdims=True, **extra)
              for block in t._locals]
    shape = t.shape[:axis] + (math.prod(mesh.shape[d] for d in dims),) + t.shape[axis + 1:]
    spread = t.results.on_mesh(mesh, t._placements, totals,
                               Spec(shape, np.dtype(scans[0].dtype)))
    whole = redistribute(spread, tuple(REPLICATE if d in dims else p
                                       for d, p in enumerate(t._placements)))
    blocks = []
    for i in range(mesh.size):
        k = rank[i]  # the places before this one along the line
        if k == 0:
            blocks.append(scans[i])
            continue
        before = issue.call("getitem", whole._locals[i], (slice(None),) * axis + (slice(0, k),))
        blocks.append(issue.call(combine, scans[i], issue.call(
            total, before, axis=axis, keepdims=True, **extra)))
    return t.results.on_mesh(mesh, t._placements, blocks,
                             Spec(t.shape, np.dtype(scans[0].dtype)))
