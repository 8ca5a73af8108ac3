"""Placement rules of shape ops and indexing: transposes, squeeze and reshape follow the
sharded axis, or regroup it (regroup.py); concatenate and stack join operands sharded alike
or replicated, and concatenate along the sharded axis regroups it; getitem and setitem take
basic indices (an int along the sharded axis is taken where it lies and broadcast; a slice
along it moves runs: slicing.py; a mesh value: setting.py); sort and argsort hold along an
unsharded axis, and sort (argsort, stable) merges blocks along a sharded one (sorting.py)."""

from __future__ import annotations

import numpy as np

from ...ops.meta_helpers import normalize_axes
from . import regroup, selecting, setting, slicing, sorting
from .moves import pick, redistribute
from .placement import REPLICATE, Shard, basic_index, local_box, sharded_axes
from .plan import Plan, Slot, is_partial, no_plan, no_rule, replicated_only

PERMUTING = {"transpose", "swapaxes", "moveaxis", "expand_dims"}


def permuting(name, operands, args, kwargs, spec, resolve) -> Plan:
    """transpose, swapaxes, moveaxis, expand_dims: the sharded axis goes where it goes."""
    t = operands[0]
    probe = np.empty(tuple(range(2, t.ndim + 2)), dtype=np.dtype([]))
    rest = list(args[1:])
    moved = getattr(np, name)(probe, *rest, **kwargs).shape
    where = {size - 2: i for i, size in enumerate(moved) if size >= 2}
    return Plan(tuple(Shard(where[p.axis]) if type(p) is Shard else p
                      for p in t._placements))


def squeeze(name, operands, args, kwargs, spec, resolve) -> Plan:
    """The sharded axis follows; a squeezed sharded axis (length 1) is a reshape whose result
    is sharded on another axis (regroup.py)."""
    t = operands[0]
    axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
    gone = (tuple(a for a, n in enumerate(t.shape) if n == 1) if axis is None
            else () if t.ndim == 0  # NumPy takes axis 0 or -1 of a 0-d array, as reductions do
            else normalize_axes(axis, t.ndim, "squeeze"))
    if any(type(p) is Shard and p.axis in gone for p in t._placements):
        return _regrouped(name, operands, spec, "squeezing the sharded axis")
    out = [Shard(p.axis - sum(a < p.axis for a in gone)) if type(p) is Shard else p
           for p in t._placements]

    def explicit(i, name, args, kwargs):
        return name, args[:1], {"axis": gone}
    return Plan(tuple(out), adjust=explicit)


def reshape(name, operands, args, kwargs, spec, resolve) -> Plan:
    """A reshape that keeps the sharded axis and those before it runs block by block (a
    view where NumPy's is); another in C order moves runs of elements (regroup.py)."""
    t = operands[0]
    new = spec.shape
    sharded = {p.axis for p in t._placements if type(p) is Shard}
    if not sharded or (name in ("flatten", "ravel") and t.ndim == 1):
        return Plan(t._placements)
    last = max(sharded)
    if tuple(new[:last + 1]) == tuple(t.shape[:last + 1]):
        if name != "reshape":  # flatten, ravel: blocks of their own lengths
            return Plan(t._placements)
        mesh = t._mesh

        def local_shape(i, name, args, kwargs):
            box = local_box(t.shape, t._placements, mesh.shape, mesh.coords[i])
            shape = list(new)
            for a in sharded:
                shape[a] = box[a][1] - box[a][0]
            return name, (args[0], tuple(shape)), kwargs
        return Plan(t._placements, adjust=local_shape)
    if kwargs or args[2 if name == "reshape" else 1:]:  # order="F": no plan
        raise no_rule(name, operands, f"a reshape in order F keeps the sharded axis {last} "
                      "and those before it; replicate first (t.replicate())")
    return _regrouped(name, operands, spec, f"a reshape ({t.shape} -> {new})")


def _regrouped(name, operands, spec, what: str) -> Plan:
    """The reshape of operands[0] to spec's shape that moves runs, where regroup takes it;
    to a 0-d result, its one element broadcast from the place that holds it."""
    t = operands[0]
    if not spec.shape:
        return Plan(None, whole=lambda: pick(t, (0,) * t.ndim, spec))
    axis = regroup.reshape_axis(t, tuple(spec.shape))
    if axis is None:
        other = regroup.exchange_axis(t, tuple(spec.shape))
        sharded = sorted(sharded_axes(t._placements))
        if other is None and len(sharded) > 1 and not is_partial(t):
            other = sharded[0]  # two axes sharded: one first (its nested shards), then as so
        if other is not None:  # shard another axis of t first: each place gets its block
            wanted = tuple(Shard(other) if type(p) is Shard else p for p in t._placements)
            return Plan(None, whole=lambda: _regrouped(
                name, [redistribute(t, wanted)], spec, what).whole())
        raise no_rule(name, operands, f"{what} moves elements between shards where no axis "
                      "of the result has as many elements before it as the sharded axis; "
                      "replicate first (t.replicate())")
    return Plan(None, whole=lambda: regroup.reshape(t, spec, axis))


def axiswise(name, operands, args, kwargs, spec, resolve) -> Plan:
    """sort, argsort: fine along an unsharded axis; along a sharded one they merge blocks
    between neighbours (sorting.py)."""
    t = operands[0]
    resolve(t)
    axis = kwargs.get("axis", args[1] if len(args) > 1 else -1)
    sharded = {p.axis for p in t._placements if type(p) is Shard}
    # axis=None sorts the flattened tensor (a 0-d one as 1-d): along every axis
    if sharded and (axis is None or axis % t.ndim in sharded):
        plan = _sorted(name, t, axis, args, kwargs, spec)
        if plan is not None:
            return plan
        raise no_rule(name, operands, f"{name} along the sharded axis: replicate first "
                      f"(t.replicate().{name}(...)) or shard another axis")
    return Plan(t._placements)


def _sorted(name, t, axis, args, kwargs, spec) -> Plan | None:
    """np.sort and np.argsort (of any kind: ties in the order of their positions, as
    kind="stable" orders them) along the sharded axis (of the flattened tensor for
    axis=None, where it stays sharded) by sorting.py's plan; None where it has none."""
    kind = kwargs.get("kind", args[2] if len(args) > 2 else None)
    if kwargs.get("order", args[3] if len(args) > 3 else None) is not None:
        return None
    if axis is None and t.ndim != 1:  # flattened by the reshape's plan (blocks that are not
        sort = np.sort if name == "sort" else np.argsort  # runs of t's C order move first)
        return Plan(None, whole=lambda: sort(t.reshape(-1), axis=0, kind=kind))
    axis = 0 if axis is None else axis % t.ndim
    dims = sorting.plannable(t, axis)
    return None if dims is None else Plan(None, whole=lambda: sorting.sort(
        t, axis, dims, spec, positions=name == "argsort"))


def getitem(name, operands, args, kwargs, spec, resolve) -> Plan:
    """Basic indices across the sharded axis keep it sharded; an int along it takes the row
    from the place that holds it and broadcasts it (worker to worker); a slice along it
    moves the selected runs to the result's blocks (slicing.py)."""
    t = operands[0]
    entries = basic_index(args[1], t.ndim)
    if entries is None:
        selected = selecting.getitem_plan(t, operands, args[1], resolve)
        if selected is not None:
            return selected
    if entries is None or len(operands) > 1:
        return replicated_only(name, operands, args, kwargs, spec, resolve)
    sliced = slicing.plannable(t, entries)
    if sliced is not None:
        return Plan(None, whole=lambda: slicing.take(t, entries, sliced, spec))
    sharded = {p.axis for p in t._placements if type(p) is Shard}
    where: dict[int, int] = {}  # sharded axis -> its axis in the result
    out_axis, takes_row = 0, False  # an int along a sharded axis: one place's row
    for entry in entries:
        if entry is None:
            out_axis += 1
            continue
        ax, item = entry
        if ax in sharded:
            if isinstance(item, slice) and item == slice(None):
                where[ax] = out_axis
            elif isinstance(item, (int, np.integer)):
                takes_row = True
            else:
                raise no_rule(name, operands, "a slice along the sharded axis: replicate "
                              "first (t.replicate()[...]) or index another axis")
        if not isinstance(item, (int, np.integer)):
            out_axis += 1
    if takes_row:
        return Plan(None, whole=lambda: pick(t, args[1], spec))
    return Plan(tuple(Shard(where[p.axis]) if type(p) is Shard else p
                      for p in t._placements))


def join(name, operands, args, kwargs, spec, resolve) -> Plan:
    """concatenate, stack: operands sharded alike or replicated, joined along an axis none
    shards (a replicated one cut to each block); concatenate along the sharded axis moves
    runs to the result's blocks (regroup.py)."""
    for t in operands:
        resolve(t)
    if len(args) < 1 or type(args[0]) is not tuple or len(operands) != len(args[0]) or \
            set(kwargs) - {"axis"} or len(args) > 2:
        return replicated_only(name, operands, args, kwargs, spec, resolve)
    axis = kwargs.get("axis", args[1] if len(args) > 1 else 0)
    if axis is None:  # of the flattened operands, where they stay sharded
        if name == "stack" or any(not regroup.flattens(t)
                                  for t in operands if t.ndim != 1 and sharded_axes(
                                      t._placements)):
            return replicated_only(name, operands, args, kwargs, spec, resolve)
        return Plan(None, whole=lambda: np.concatenate([t.reshape(-1) for t in operands]))
    stack = name == "stack"
    axis %= operands[0].ndim + stack
    placed = regroup.join_in_place(operands, axis, stack, tuple(spec.shape))
    if placed is not None:
        return Plan(placed[0], placed[1])
    dims = None if stack else regroup.join_dim(operands, axis)
    if dims is not None:
        return Plan(None, whole=lambda: regroup.concatenate(operands, axis, dims, spec))
    lead = next(t for t in operands if sharded_axes(t._placements))
    if all(t._placements == lead._placements for t in operands if sharded_axes(t._placements)):
        raise no_rule(name, operands, f"{name} of operands sharded on different axes: "
                      "redistribute them alike (t.redistribute(...)) or replicate first")

    def alike():  # the others' blocks exchanged to the first sharded one's placements
        return (np.stack if stack else np.concatenate)(
            [t if not sharded_axes(t._placements) or t._placements == lead._placements
             else redistribute(t, lead._placements) for t in operands], axis=axis)
    return Plan(None, whole=alike)


def setitem(name, operands, args, kwargs, spec, resolve) -> Plan:
    """t[index] = value (a scalar, a master array, or a mesh tensor): each place writes the
    part of `index` in its block, from its part of `value` (setting.py moves a sharded mesh
    value's runs to the places that write them)."""
    t = operands[0]
    masked = selecting.setitem_plan(t, operands, args, resolve)
    if masked is not None:
        return masked
    resolve(t)
    entries = basic_index(args[1], t.ndim)
    sharded = {p.axis for p in t._placements if type(p) is Shard}
    mesh_value = len(operands) == 2 and type(args[2]) is Slot and args[2].k == 1
    if not sharded:
        if mesh_value and any(p != REPLICATE for p in operands[1]._placements):
            # every place writes all of V: V's blocks gathered (and parts summed) there
            whole = redistribute(operands[1], (REPLICATE,) * t._mesh.ndim)
            return Plan(None, views={1: whole._locals})
        return replicated_only(name, operands, args, kwargs, spec, resolve)
    if entries is None or (len(operands) > 1 and not mesh_value) or None in entries:
        raise no_rule(name, operands, "setting through a sharded tensor takes basic indices "
                      "and a scalar, an array or a mesh tensor; replicate first "
                      "(t.replicate()) or set each shard (t.shards())")
    extra = operands[1].ndim - sum(isinstance(item, slice) for _, item in entries) \
        if mesh_value else 0
    if extra > 0 and all(n == 1 for n in operands[1].shape[:extra]):
        # V's leading length-1 axes go, as NumPy's: a reshape of V (a copy where it moves
        # blocks, so t[0] = t reads no block it writes), then this plan
        squeezed = operands[1].reshape(operands[1].shape[extra:])
        return Plan(None, whole=lambda: t.__setitem__(args[1], squeezed))
    skip, local_index, cuts = _local_parts(t, entries, sharded)
    if mesh_value:
        parts = setting.values(t, operands[1], entries, cuts, skip, resolve)
        wanted = None if parts is not None else setting.matching(t, operands[1], entries)
        if wanted is not None:  # V sharded otherwise: each place receives its part of V
            parts = setting.values(t, redistribute(operands[1], wanted), entries, cuts, skip,
                                   resolve)
        if parts is None:
            raise no_rule(name, operands, "a mesh value sharded where the target is not, "
                          "or along two mesh dimensions: redistribute it (t.replicate())")
    else:
        value = args[2]
        if isinstance(value, (tuple, list)):
            value = np.asarray(value)
        parts = {i: _part(value, cut) for i, cut in cuts.items()}

    def local(i, name, args, kwargs):
        return name, (args[0], local_index[i], parts[i], *args[3:]), kwargs
    return Plan(None, adjust=local, skip=skip)


def _local_parts(t, entries: list, sharded: set) -> tuple:
    """(the places that write nothing, {place: its part of the index, in its block},
    {place: per axis of t[index], the positions of its part there})."""
    mesh, skip, local_index, cuts = t._mesh, set(), {}, {}
    for i, coord in enumerate(mesh.coords):
        box = local_box(t.shape, t._placements, mesh.shape, coord)
        index, cut = [], []
        for ax, item in entries:
            mine = item
            if ax in sharded:
                mine = _localize(item, t.shape[ax], *box[ax])
                if mine is None:
                    skip.add(i)
                    break
            if isinstance(item, slice):
                cut.append(_positions(item, t.shape[ax], mine, box[ax][0])
                           if ax in sharded else slice(None))
            index.append(mine)
        else:
            local_index[i], cuts[i] = tuple(index), cut
    return skip, local_index, cuts


def _positions(item: slice, length: int, local: slice, lo: int) -> slice:
    """Where the elements that slice `local` of a block starting at `lo` takes stand among
    those global slice `item` takes."""
    start, _, step = item.indices(length)
    first = (local.start + lo - start) // step
    return slice(first, first + len(range(local.start, local.stop, local.step)))


def _part(value, cut: list):
    """The part of `value` (broadcast to t[index], whose axes `cut` slices) one place sets;
    an axis along which it broadcasts is kept whole."""
    if not isinstance(value, np.ndarray) or value.ndim == 0:
        return value
    off = len(cut) - value.ndim
    return value[tuple(cut[a + off] if value.shape[a] != 1 and a + off >= 0 else slice(None)
                       for a in range(value.ndim))]


def _localize(item, length, lo, hi):
    """`item` (an int or slice of an axis of `length`) within block [lo, hi), in block
    coordinates; None if it misses the block."""
    if isinstance(item, (int, np.integer)):
        i = int(item) % length
        return i - lo if lo <= i < hi else None
    start, stop, step = item.indices(length)
    if step < 0:
        raise no_plan("setitem: a negative step along the sharded axis; use a positive one")
    first = max(start, lo + (start - lo) % step if start < lo else start)
    if first >= min(stop, hi):
        return None
    return slice(first - lo, min(stop, hi) - lo, step)
