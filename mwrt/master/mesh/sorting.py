"""np.sort and np.argsort along a sharded axis: the result sharded there, each place
ending with its block of the sorted axis (as np.array_split cuts it), by odd-even
merge-split between neighbours.

Each place sorts its block. Then, for as many rounds as the line (the places along the mesh
dimension that shards the axis; along several, nested, in their row-major order) has
places, neighbours (k, k + 1), k of the round's parity, merge their blocks: the right
sends its block to the left, which sorts the union (two sorted runs: a stable sort merges
them in one pass), keeps the smaller part and sends the rest back. With blocks of one
size this sorts in that many rounds (Knuth, TAOCP 5.3.4, ex. 37; Baudet and Stevenson
1978). np.array_split's blocks differ by one: each counts as the
longest, the rest of it a virtual element larger than any (no value is ever made), so the
left keeps min(longest, both counts) of the union. The counts follow from the lengths alone,
so the master knows where the sorted runs end, and runs.exchange moves them to the blocks
of the result. Every fibre along the axis is sorted at once, as np.sort sorts them. A place
receives about the whole axis over the rounds (the places hold two blocks at most), where a
replicated sort has each receive all but its block and hold the whole.

np.median along the sharded axis takes the sorted axis's middle elements from where they lie;
over several axes, along the one they make when moved last and merged.

argsort carries each element's global position beside it (merged by the same order), so
ties keep the order of their positions: np.argsort's with kind="stable", whatever the kind
asked. NumPy's default kind ("quicksort", not stable) promises only indices that sort the
values; the order it gives ties is its vectorized sort's, which differs by CPU (AVX2,
AVX-512, none) and no merge reproduces. The stable order is one it allows, and the same
at any number of places: so every kind takes this plan. Without ties it is NumPy's.
"""

from __future__ import annotations

import math

import numpy as np

from .. import issue
from . import runs
from .groups import carry
from .placement import Shard, local_box


def plannable(t, axis: int) -> tuple | None:
    """The mesh dimensions that shard t's `axis` (one, or several nested), where this plan
    sorts along them; else None."""
    dims = tuple(d for d, p in enumerate(t._placements) if p == Shard(axis))
    if not dims or any(p.is_partial() for p in t._placements):
        return None
    return dims


def sort(t, axis: int, dims: tuple, spec, positions: bool = False):
    """np.sort(t, axis), or np.argsort(t, axis, kind="stable") if `positions`, sharded on
    `axis` as t is, along mesh dimensions `dims` (see the module's text)."""
    mesh = t._mesh
    parts = math.prod(mesh.shape[d] for d in dims)
    length = t.shape[axis]
    longest = math.ceil(length / parts) if parts else 0  # nested blocks hold no more
    boxes = [local_box(t.shape, t._placements, mesh.shape, coord)[axis]
             for coord in mesh.coords]
    counts = [hi - lo for lo, hi in boxes]
    last = t.ndim - 1  # the axis sorted along, contiguous: merges read it in order (2.5x
    # faster than along the first axis of a (2666, 500) float64 union)
    sorted_axis, axis = axis, last
    if positions:  # (values, positions) per place
        blocks = []
        for block, (lo, _) in zip(t._locals, boxes):
            block = _moved(block, sorted_axis, last)
            order = issue.call("argsort", block, axis, "stable")
            blocks.append((_take(block, order, axis), issue.call("add", order, lo)))
    else:
        blocks = [(issue.call("sort", _moved(block, sorted_axis, last), axis), None)
                  for block in t._locals]
    lines = mesh.groups(dims)
    for turn in range(parts):
        for line in lines:
            for k in range(turn % 2, parts - 1, 2):
                left, right = line[k], line[k + 1]
                both = counts[left] + counts[right]
                if not both:
                    continue
                keep = min(longest, both)
                blocks[left], blocks[right] = _merge(blocks[left], blocks[right], left, right,
                                                     mesh, axis, keep, both)
                counts[left], counts[right] = keep, both - keep
    line_of = {p: (line, k) for line in lines for k, p in enumerate(line)}
    held, wanted = [], []
    for i, coord in enumerate(mesh.coords):
        line, k = line_of[i]
        first = sum(counts[q] for q in line[:k])
        held.append([(_moved(blocks[i][1 if positions else 0], last, sorted_axis), first,
                      first + counts[i])])
        wanted.append(local_box(spec.shape, t._placements, mesh.shape, coord)[sorted_axis])
    result = runs.exchange(mesh, dims, sorted_axis, held, wanted)
    return t.results.on_mesh(mesh, t._placements, result, spec)


def median_plan(t, args: tuple, kwargs: dict, axes: tuple):
    """np.median over the sharded axis as a function of nothing (the sort's plan, then the
    middle elements taken where they lie and broadcast; over several axes, of them merged),
    or None where it has none (other arguments; an empty axis has no middle:
    rules.reduction runs it locally)."""
    if len(args) > 2 or set(kwargs) - {"axis", "keepdims"} or not math.prod(
            t.shape[a] for a in axes):
        return None
    keepdims = bool(kwargs.get("keepdims", False))
    if len(axes) == t.ndim > 1:  # of the flattened tensor (a reshape that may move blocks)
        return lambda: _median(t.reshape(-1), 0, False).reshape(
            (1,) * t.ndim if keepdims else ())
    if len(axes) != 1:
        return lambda: _median_over(t, axes, keepdims)
    axis = axes[0]
    if plannable(t, axis) is None:
        return None
    return lambda: _median(t, axis, keepdims)


def _median_over(t, axes: tuple, keepdims: bool):
    """np.median over several axes, not all: of the tensor with them moved last and merged
    into one (the reshape's plan moves blocks where it merges the sharded axis), as NumPy
    takes it."""
    kept = [a for a in range(t.ndim) if a not in axes]
    merged = np.moveaxis(t, axes, range(len(kept), t.ndim)).reshape(
        tuple(t.shape[a] for a in kept) + (-1,))
    middle = np.median(merged, axis=-1)
    return np.expand_dims(middle, axes) if keepdims else middle


def _median(t, axis: int, keepdims: bool):
    """The mean of the one or two middle elements of the sorted axis, as NumPy's median
    (NaN where the axis holds one: sorted last)."""
    n = t.shape[axis]
    ordered = np.sort(t, axis=axis)

    def at(k):
        return ordered[(slice(None),) * axis + (k,)]
    low = at((n - 1) // 2)
    if t.dtype.kind in "biu":  # NumPy's mean of them: in float64
        low = low.astype(np.float64)
    middle = low if n % 2 else (low + (at(n // 2).astype(low.dtype))) / 2
    if t.dtype.kind in "fc":
        middle = np.where(np.isnan(at(n - 1)), np.nan, middle)
    return np.expand_dims(middle, axis) if keepdims else middle


def _merge(a, b, left: int, right: int, mesh, axis: int, keep: int, both: int):
    """The sorted union of blocks a and b (each (values, positions or None)) merged at place
    `left`: its first `keep` there, positions [keep, both) sent to place `right`."""
    node, device = mesh.places[left]
    union = issue.call("concatenate", [a[0], carry(b[0], node, device)], axis=axis)
    if a[1] is None:
        merged = (issue.call("sort", union, axis, "stable"), None)  # two sorted runs: one pass
    else:
        order = issue.call("argsort", union, axis, "stable")
        at = issue.call("concatenate", [a[1], carry(b[1], node, device)], axis=axis)
        merged = (_take(union, order, axis), _take(at, order, axis))
    node, device = mesh.places[right]
    return (tuple(None if m is None else _cut(m, axis, 0, keep) for m in merged),
            tuple(None if m is None else carry(_cut(m, axis, keep, both), node, device)
                  for m in merged))


def _moved(block, source: int, destination: int):
    """block with its axis `source` moved to `destination`, contiguous."""
    if source == destination:
        return block
    return issue.call("ascontiguousarray", issue.call("moveaxis", block, source, destination))


def _take(values, order, axis: int):
    return issue.call("numpy", "take_along_axis", -1, values, order, axis)


def _cut(part, axis: int, lo: int, hi: int):
    return issue.call("getitem", part, (slice(None),) * axis + (slice(lo, hi),))


__all__ = ["median_plan", "plannable", "sort"]
