"""Advanced indices on mesh tensors: an int list (or a 1-d bool array) along one axis, and a
mesh bool mask of the tensor's shape, read (getitem) or written (setitem with a scalar).

- An int list along an unsharded axis: every place takes the same rows of its block.
- An int list along a sharded axis: the result stays sharded on it, its blocks as
  np.array_split cuts the list's length. Each place of a line (the places along the mesh
  dimensions that shard the axis) receives from every place of its line the rows it holds of
  the place's block of the result (one piece per pair, worker to worker), joins them and, if
  the list is not ascending there, puts them in the list's order.
- A mask: each place selects its own elements (C order within its block: consecutive runs
  of the result where only axis 0 is sharded), the places' counts come to the master (one
  round trip: the result's length depends on the data), and the runs move to the result's
  blocks (runs.py). A tensor sharded on another axis is sharded on axis 0 first (each
  place receives its new block: redistribute's all-to-all), and so is the mask.
- t[mask] = scalar: each place sets its block where its part of the mask holds; of an
  empty t, with a value of at most one element (NumPy's check), nothing. t[mask] = an
  array: a block is runs of t's C order (one per index of the axes before the last
  sharded one; one run where only axis 0 is sharded), the mask's count of each run comes to
  the master (one round trip), which numbers the runs of every block in t's C order, and
  each place sets its block from its runs of the array, sent inline.
"""

from __future__ import annotations

import numpy as np

from ...ops import Spec
from .. import issue, ordering
from . import fallback, runs
from .fetch import fetch_many
from .groups import carry
from .moves import redistribute
from .placement import Shard, local_box
from .plan import Plan, Slot


def getitem_plan(t, operands: list, index, resolve) -> Plan | None:
    """The plan of t[index] for one advanced item (the others full slices); None if none."""
    found = _advanced(t, index)
    if found is None:
        return None
    axis, item = found
    if type(item) is Slot:
        mask = operands[item.k]
        if axis or mask.dtype != np.bool_ or mask.shape != t.shape or ordering.capture or \
                not any(type(p) is Shard for x in (t, mask) for p in x._placements):
            return None  # a capture cannot wait for the counts
        for x in (t, mask):
            resolve(x)
        return Plan(None, whole=lambda: _masked(t, mask))
    if item.dtype == np.bool_:
        if item.ndim != 1:
            return None
        item = np.flatnonzero(item)
    if item.dtype.kind not in "iu":
        return None
    resolve(t)
    if not any(p == Shard(axis) for p in t._placements):
        shift = item.ndim - 1
        return Plan(tuple(Shard(p.axis + shift * (p.axis > axis)) if type(p) is Shard else p
                          for p in t._placements))
    if item.ndim != 1:
        return None
    return Plan(None, whole=lambda: take_rows(t, axis, item))


def _advanced(t, index):
    """(axis, item) of the one advanced item of `index` (an array or a Slot), the others
    full slices or one Ellipsis; None for any other index."""
    items = index if type(index) is tuple else (index,)
    advanced = [k for k, i in enumerate(items) if type(i) is Slot or isinstance(i, np.ndarray)]
    rest = [i for i in items if not (type(i) is Slot or isinstance(i, np.ndarray))]
    if len(advanced) != 1 or len(items) > t.ndim + 1 or sum(i is Ellipsis for i in rest) > 1 \
            or any(i is not Ellipsis and i != slice(None) for i in rest):
        return None
    k = advanced[0]
    if Ellipsis in items[:k]:
        k += t.ndim - len(items)  # the axes the Ellipsis stands for, less itself
    item = items[advanced[0]]
    if isinstance(item, np.ndarray) and item.dtype == np.bool_ and item.ndim > 1:
        return None
    return k, item


def take_rows(t, axis: int, index: np.ndarray):
    """t[..., index] along sharded `axis` (see the module's text)."""
    mesh, length = t._mesh, t.shape[axis]
    index = index % length if length else index
    shape = t.shape[:axis] + (len(index),) + t.shape[axis + 1:]
    dims = tuple(d for d, p in enumerate(t._placements) if p == Shard(axis))
    blocks: list = [None] * mesh.size
    for line in mesh.groups(dims):
        spans = [local_box(t.shape, t._placements, mesh.shape, mesh.coords[q])[axis]
                 for q in line]
        owner = np.searchsorted([hi for _, hi in spans], index, side="right")
        for p in line:
            a, b = local_box(shape, t._placements, mesh.shape, mesh.coords[p])[axis]
            blocks[p] = _rows_at(t, axis, line, spans, index[a:b], owner[a:b], p)
    return t.results.on_mesh(mesh, t._placements, blocks, Spec(shape, t.dtype))


def _rows_at(t, axis: int, line: list, spans: list, index, owner, p: int):
    """Place p's block of t[..., index]: the rows each place of its line holds, joined in
    the order of `index` (owner[j]: the place of the line holding index[j])."""
    node, device = t._mesh.places[p]
    lead = (slice(None),) * axis
    pieces, order = [], []
    for k, q in enumerate(line):
        chosen = np.flatnonzero(owner == k)
        if chosen.size:
            rows = index[chosen] - spans[k][0]
            pieces.append(carry(issue.call("getitem", t._locals[q], lead + (rows,)),
                                node, device))
            order.append(chosen)
    if not pieces:  # an empty block, of t's other lengths and dtype
        return issue.call("getitem", t._locals[p], lead + (np.zeros(0, np.intp),))
    block = pieces[0] if len(pieces) == 1 else issue.call("concatenate", pieces, axis=axis)
    joined = np.concatenate(order)
    if np.any(joined[1:] < joined[:-1]):
        block = issue.call("getitem", block, lead + (np.argsort(joined),))
    return block


def _masked(t, mask):
    """t[mask] for a bool mesh tensor of t's shape (see the module's text)."""
    mesh = t._mesh
    if any(type(p) is Shard and p.axis for p in t._placements):  # runs would cross places
        t = redistribute(t, tuple(Shard(0) if type(p) is Shard else p for p in t._placements))
    if mask._placements != t._placements:
        mask = redistribute(mask, t._placements)
    counts = [int(n) for n in fetch_many([issue.call("count_nonzero", m)
                                          for m in mask._locals])]
    parts = [issue.call("getitem", x, m) for x, m in zip(t._locals, mask._locals)]
    for part, n in zip(parts, counts):  # the master knows their shapes now: none is asked
        part._spec = Spec((n,), t.dtype)
    dims = tuple(d for d, p in enumerate(t._placements) if p == Shard(0))
    line = mesh.groups(dims)[0]
    spec = Spec((sum(counts[q] for q in line),), t.dtype)
    if not dims:
        return t.results.on_mesh(mesh, t._placements, parts, spec)
    held: list = [None] * mesh.size
    for line in mesh.groups(dims):
        first = 0
        for q in line:
            held[q] = [(parts[q], first, first + counts[q])]
            first += counts[q]
    wanted = [local_box(spec.shape, t._placements, mesh.shape, c)[0] for c in mesh.coords]
    blocks = runs.exchange(mesh, dims, 0, held, wanted)
    return t.results.on_mesh(mesh, t._placements, blocks, spec)


def setitem_plan(t, operands: list, args: tuple, resolve) -> Plan | None:
    """t[mask] = value, a scalar or one element (a mesh tensor's too), with mask a bool mesh
    tensor of t's shape: the mask placed as t, each place sets its block; None for any other
    index or value."""
    if len(args) != 3:
        return None
    index, value = args[1], args[2]
    one = operands[value.k] if type(value) is Slot else None  # a mesh tensor of one element
    if type(index) is Slot and t.size == 0 and operands[index.k].shape == t.shape and \
            operands[index.k].dtype == np.bool_ and (one.size if one is not None else
                                                     np.size(value)) <= 1:
        return Plan(None, skip=frozenset(range(t._mesh.size)))  # no element to set
    if type(index) is Slot and type(value) is np.ndarray and value.ndim == 1 and \
            value.size != 1 and operands[index.k].dtype == np.bool_ and \
            operands[index.k].shape == t.shape and not ordering.capture:
        mask = operands[index.k]
        for x in (t, mask):
            resolve(x)
        return Plan(None, whole=lambda: _set_runs(t, mask, value))
    if type(index) is not Slot or isinstance(value, (list, tuple)) or (
            isinstance(value, np.ndarray) and value.size != 1) or (
            one is not None and (one.ndim > 1 or one.size != 1 or one is t)):
        return None
    mask = operands[index.k]
    if mask.dtype != np.bool_ or mask.shape != t.shape:
        return None
    for x in (t, mask):
        resolve(x)
    views = {index.k: mask._locals}
    if mask._placements != t._placements:
        views[index.k] = redistribute(mask, t._placements)._locals
    if one is not None:  # every place sets it: whole at every place
        views[value.k] = fallback.replicated(one)._locals
    return Plan(None, views=views)


def _boxes(t) -> list:
    mesh = t._mesh
    return [local_box(t.shape, t._placements, mesh.shape, c) for c in mesh.coords]


def _set_runs(t, mask, values: np.ndarray) -> None:
    """t[mask] = values (see the module's text): the runs of each block are the indices of
    the axes before the last sharded one, each over the block's part of that axis and all
    of those after it; ordered by their first element, they are t's C order."""
    if mask._placements != t._placements:
        mask = redistribute(mask, t._placements)
    last = max((p.axis for p in t._placements if type(p) is Shard), default=0)
    boxes = _boxes(t)
    first: dict = {}  # each distinct block -> the first place that holds it
    for i, box in enumerate(boxes):
        first.setdefault(box, i)
    inner = tuple(range(last, t.ndim))
    counts = [np.asarray(n, np.int64).reshape(-1) for n in fetch_many(
        [issue.call("count_nonzero", mask._locals[i], axis=inner) for i in first.values()])]
    total = int(sum(int(c.sum()) for c in counts))
    if total != len(values):
        raise ValueError(f"NumPy boolean array indexing assignment cannot assign "
                         f"{len(values)} input values to the {total} output values "
                         "where the mask is true")
    keys = [_run_keys(box, t.shape, last) for box in first]
    order = np.argsort(np.concatenate(keys), kind="stable")
    starts = np.empty(len(order), np.int64)
    starts[order] = np.cumsum(np.concatenate(counts)[order]) - np.concatenate(counts)[order]
    taken, at = {}, 0
    for box, n in zip(first, counts):
        mine = starts[at:at + len(n)]
        at += len(n)
        taken[box] = values[np.repeat(mine - np.cumsum(n) + n, n) + np.arange(n.sum())]
    for i, box in enumerate(boxes):
        issue.call("setitem", t._locals[i], mask._locals[i], taken[box])


def _run_keys(box: tuple, shape: tuple, last: int) -> np.ndarray:
    """Where each run of a block (the indices of axes before `last`, in C order) begins in
    t's C order: its outer index flattened, then its start along `last`."""
    if not last:
        return np.full(1, box[0][0] if shape else 0, np.int64)
    outer = np.indices([hi - lo for lo, hi in box[:last]]).reshape(last, -1)
    at = np.ravel_multi_index(tuple(o + lo for o, (lo, _) in zip(outer, box[:last])),
                              shape[:last])
    return at * (shape[last] + 1) + box[last][0]


__all__ = ["getitem_plan", "setitem_plan", "take_rows"]
