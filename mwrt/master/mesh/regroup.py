"""Reshapes and joins of sharded tensors, with the result sharded and no place gathering it.

- A reshape (flatten, ravel, a squeeze of a length-1 sharded axis) in C order whose sharded
  axis has as many elements before it as some axis of the result: each place reads its
  block as rows (the elements before the axis) of consecutive columns, runs of the result's
  columns; the result is sharded on that axis of its own (the longest such), and
  runs.exchange moves each place the columns of its block. A copy (NumPy's may view).
  Where no axis of the result lines up so ((4, 3) sharded on 1 -> (12,)), t is first
  sharded on an axis that does (redistribute's all-to-all along the same mesh dimension).
- concatenate along the sharded axis: each operand's blocks are runs of the result's axis
  at its offset (a replicated operand's, a run every place holds), moved by runs.exchange
  to the result's blocks, as np.array_split cuts its length.
- concatenate and stack along another axis, of operands sharded alike or replicated: each
  replicated one is cut at every place to the result's block, as a view; nothing moves.
"""

from __future__ import annotations

import math

from .. import issue
from . import runs
from .placement import REPLICATE, Shard, local_box


def _one_shard(t) -> tuple[tuple, int] | None:
    """(the mesh dimensions, axis) of t's one sharded axis (split by one dimension, or by
    several nested), its other dimensions Replicate; else None."""
    axes = {p.axis for p in t._placements if type(p) is Shard}
    if len(axes) != 1 or any(type(p) not in (Shard, type(REPLICATE)) for p in t._placements):
        return None
    axis = axes.pop()
    return tuple(d for d, p in enumerate(t._placements) if p == Shard(axis)), axis


def reshape_axis(t, new: tuple) -> int | None:
    """The result's axis that a C-order reshape of t to `new` keeps sharded (with as many
    elements before it as before t's sharded axis; the longest), where the exchange plan
    takes t; else None."""
    found = _one_shard(t)
    if found is None or not new:
        return None
    before = math.prod(t.shape[:found[1]])
    fits = [j for j in range(len(new)) if math.prod(new[:j]) == before]
    return max(fits, key=lambda j: new[j]) if fits else None


def exchange_axis(t, new: tuple) -> int | None:
    """Where no axis of the result has as many elements before it as t's sharded axis
    ((4, 3) sharded on 1 -> (12,)): the axis of t to shard instead (an all-to-all along the
    same mesh dimension, redistribute's exchange) whose reshape the exchange plan takes,
    the one that keeps the longest axis of the result sharded; None where there is none."""
    found = _one_shard(t)
    if found is None or not new:
        return None
    best = None  # (the result's axis length, t's axis)
    for a in range(t.ndim):
        before = math.prod(t.shape[:a])
        for j in range(len(new)):
            if math.prod(new[:j]) == before and (best is None or new[j] > best[0]):
                best = (new[j], a)
    return None if best is None else best[1]


def flattens(t) -> bool:
    """True if t.reshape(-1) keeps t sharded (one of the two plans above takes it)."""
    new = (math.prod(t.shape),)
    return reshape_axis(t, new) is not None or exchange_axis(t, new) is not None


def reshape(t, spec, j: int):
    """t reshaped to spec.shape (C order), sharded on the result's axis `j` (see above)."""
    mesh, new = t._mesh, tuple(spec.shape)
    dims, k = _one_shard(t)  # type: ignore[misc]  # reshape_axis found it
    placements = tuple(Shard(j) if d in dims else p for d, p in enumerate(t._placements))
    rows = math.prod(t.shape[:k])
    inner, inner_new = math.prod(t.shape[k + 1:]), math.prod(new[j + 1:])
    held, wanted, spans = [], [], []
    for i, coord in enumerate(mesh.coords):
        lo, hi = local_box(t.shape, t._placements, mesh.shape, coord)[k]
        flat = issue.call("reshape", t._locals[i], (rows, (hi - lo) * inner))
        held.append([(flat, lo * inner, hi * inner)])
        spans.append(local_box(new, placements, mesh.shape, coord)[j])
        wanted.append((spans[-1][0] * inner_new, spans[-1][1] * inner_new))
    joined = runs.exchange(mesh, dims, 1, held, wanted)
    blocks = [issue.call("reshape", block, new[:j] + (b - a,) + new[j + 1:])
              for block, (a, b) in zip(joined, spans)]
    return t.results.on_mesh(mesh, placements, blocks, spec)


def join_dim(operands: list, axis: int) -> tuple | None:
    """The mesh dimensions that shard `axis` (one, or several nested) where concatenating
    `operands` along it has the exchange plan (each operand sharded along all of them or
    replicated, along the other dimensions placed alike and not on `axis`); else None."""
    found = {tuple(d for d, p in enumerate(t._placements) if p == Shard(axis))
             for t in operands} - {()}
    if len(found) != 1:
        return None
    dims = found.pop()
    first = operands[0]._placements
    for t in operands:
        if {t._placements[d] for d in dims} not in ({Shard(axis)}, {REPLICATE}) or any(
                p != first[d] or type(p) not in (Shard, type(REPLICATE))
                for d, p in enumerate(t._placements) if d not in dims):
            return None
    return dims


def concatenate(operands: list, axis: int, dims: tuple, spec):
    """np.concatenate(operands, axis), sharded on `axis` along mesh dimensions `dims`."""
    mesh = operands[0]._mesh
    held: list = [[] for _ in range(mesh.size)]
    everywhere, offset = [], 0
    for t in operands:
        parts = [_as(block, spec.dtype) for block in t._locals]
        if t._placements[dims[0]] == REPLICATE:
            everywhere.append((parts, offset, offset + t.shape[axis]))
        else:
            for i, coord in enumerate(mesh.coords):
                lo, hi = local_box(t.shape, t._placements, mesh.shape, coord)[axis]
                held[i].append((parts[i], offset + lo, offset + hi))
        offset += t.shape[axis]
    placements = tuple(Shard(axis) if d in dims else p
                       for d, p in enumerate(operands[0]._placements))
    wanted = [local_box(spec.shape, placements, mesh.shape, coord)[axis]
              for coord in mesh.coords]
    blocks = runs.exchange(mesh, dims, axis, held, wanted, everywhere)
    return operands[0].results.on_mesh(mesh, placements, blocks, spec)


def _as(block, dtype):
    """block in the result's dtype: a place may receive pieces of one operand only."""
    return block if block.dtype == dtype else issue.call("astype", block, dtype.str)


def join_in_place(operands: list, axis: int, stack: bool, shape: tuple):
    """(the result's placements, {operand: its blocks cut}) of concatenate (stack, if
    `stack`) along `axis` of operands sharded alike on other axes or replicated, the
    result of `shape`; None where they are not so."""
    mesh = operands[0]._mesh
    out: list = []
    for d in range(mesh.ndim):
        shards = {t._placements[d] for t in operands} - {REPLICATE}
        if not shards:
            out.append(REPLICATE)
            continue
        p = shards.pop()
        if shards or type(p) is not Shard or (p.axis == axis and not stack):
            return None
        out.append(Shard(p.axis + (stack and p.axis >= axis)))
    views = {}
    for k, t in enumerate(operands):
        cut = []  # the result's sharded axes along which t is whole: cut to the block
        for a in {o.axis for o in out if type(o) is Shard}:
            mine = [t._placements[d] != REPLICATE for d, o in enumerate(out) if o == Shard(a)]
            if any(mine) and not all(mine):
                return None
            if not any(mine):
                cut.append(a)
        if cut:
            views[k] = [issue.call("getitem", t._locals[i], _box_index(
                local_box(shape, tuple(out), mesh.shape, coord), cut, axis, stack))
                for i, coord in enumerate(mesh.coords)]
    return tuple(out), views


def _box_index(box: tuple, cut: list, axis: int, stack: bool) -> tuple:
    """The index of an operand's part of a result block `box` along the result's axes
    `cut` (stack's new axis `axis` is not the operand's)."""
    index = [slice(None)] * (len(box) - stack)
    for a in cut:
        index[a - (stack and a > axis)] = slice(*box[a])
    return tuple(index)
