"""Moving mesh tensors' data: Partial resolved by all_reduce (or, where a Shard is wanted,
reduce_scatter), shards gathered (all_gather) or cut (local slices) by redistribute(), an
int index broadcast from the place that holds it, and the whole value gathered to the
master, every shard straight and at once.

Each runs along a mesh dimension's groups of places by groups.py's collectives.
"""

from __future__ import annotations

import weakref

import numpy as np

from ...errors import MwrtError
from .. import issue, ordering
from ..handle import Handle
from .fetch import fetch_many, settle
from .groups import (
    all_gather_group,
    all_reduce_group,
    broadcast_group,
    carry,
    reduce_scatter_group,
)
from .placement import (
    REPLICATE,
    Partial,
    Placement,
    Shard,
    basic_index,
    bounds,
    describe,
    local_box,
    local_shape,
    sharded_axes,
)
from .plan import PlacementError, no_plan


def resolve(t) -> None:
    """Make a Partial tensor real (all_reduce along its Partial dimensions), in place: a view
    through its base, whose all_reduce makes every view of it real. Inside a graph capture, a
    tensor made before it is made real now, once: the graph would combine its parts again at
    every replay."""
    if not any(type(p) is Partial for p in t._placements):
        return
    base = t if t._base is None else t._base
    graph = ordering.capture[-1] if ordering.capture else None
    if graph is not None and not graph.makes(base._locals[0]):
        with graph.paused():
            place(base, _all_reduce_dims(base._mesh, base._locals, base._placements))
        return
    place(base, _all_reduce_dims(base._mesh, base._locals, base._placements))


def place(t, placements: tuple) -> None:
    """Set t's placements; its views' follow (along the mesh dimensions that shard neither,
    a view is placed as its base: Partial, or Replicate once the base is real)."""
    t._placements = placements
    for ref in t._storage.views or ():
        view = ref()
        if view is not None:
            view._placements = tuple(v if type(v) is Shard else p
                                     for v, p in zip(view._placements, placements))


# View ops whose result is always a view of the operand's storage, as NumPy makes them: a
# view of a Partial tensor shares its base's all_reduce. The others of ordering.VIEWS may
# copy (a reshape of a transpose), so their Partial operand is made real first.
SURE_VIEWS = frozenset({"getitem", "transpose", "swapaxes", "moveaxis", "expand_dims",
                        "squeeze", "broadcast_to", "flip", "diagonal", "atleast_1d",
                        "atleast_2d"})


def before_view(name: str, t, args: tuple) -> None:
    """Before view op `name` on `t`: a Partial t is made real unless the result surely
    views it (a getitem of ints alone copies, as NumPy's scalars do)."""
    if not any(type(p) is Partial for p in t._placements):
        return
    if name == "getitem":
        index = args[1] if len(args) > 1 else ()
        items = index if isinstance(index, tuple) else (index,)
        entries = basic_index(index, t.ndim)
        if entries is not None and any(not isinstance(i, (int, np.integer)) for i in items):
            return
    elif name in SURE_VIEWS:
        return
    resolve(t)


def share(view, t) -> None:
    """`view`, made from t by a view op, holds t's base and its record, which lists it among
    the views made real with the base (a Partial view, or one of a base a graph makes anew
    at each replay)."""
    base = t if t._base is None else t._base
    view._base, found = base, base._storage
    view._storage = found
    if found.views is None and not any(type(p) is Partial for p in view._placements):
        return
    views = [r for r in found.views or () if r() is not None]  # the dead dropped
    found.views = (*views, weakref.ref(view))


def _all_reduce_dims(mesh, locals_: list, placements: tuple) -> tuple:
    """all_reduce along each Partial dimension, in place; the placements then (Replicate)."""
    after = list(placements)
    for d, p in enumerate(placements):
        if type(p) is Partial:
            for group in mesh.groups(d):
                all_reduce_group(mesh, locals_, group, p.op)
            after[d] = REPLICATE
    return tuple(after)


def redistribute(t, wanted: tuple):
    """A new tensor with placements `wanted`, moved worker to worker."""
    if any(type(p) is Partial for p in wanted):
        raise PlacementError(f"redistribute: Partial is made by reductions, not asked for "
                             f"(got {describe(wanted)}); use Shard or Replicate")
    mesh, spec = t._mesh, t.spec
    scattered = _scatter_dims(t._placements, wanted)
    if scattered:  # t stays Partial: each place receives only its reduced block
        current, locals_ = _reduce_scatter_dims(t, scattered, wanted)
        fresh = True
    else:
        resolve(t)
        current, locals_, fresh = list(t._placements), list(t._locals), False
    # Shard(a) -> Shard(b) along one dimension: each place receives only its new block
    for d in range(mesh.ndim):
        if _exchangeable(current, wanted, d):
            locals_ = _exchange_dim(mesh, spec, tuple(current), locals_, d, wanted[d].axis)
            current[d], fresh = wanted[d], True
    # gather, innermost dimension first: an outer dimension's block is whole only then (and
    # an inner one that stays, where an outer one cuts its axis anew: it splits the outer's)
    for d in reversed(range(mesh.ndim)):
        if type(current[d]) is Shard and (current[d] != wanted[d] or any(
                current[d] in (current[e], wanted[e]) and current[e] != wanted[e]
                for e in range(d))):
            locals_ = _gather_dim(mesh, spec, tuple(current), locals_, d)
            current[d], fresh = REPLICATE, True
    # cut, outermost first, as local_box splits
    for d in range(mesh.ndim):
        if wanted[d] != current[d]:
            axis = wanted[d].axis
            cuts = []
            for i, coord in enumerate(mesh.coords):
                lo, hi = local_box(spec.shape, tuple(current), mesh.shape, coord)[axis]
                a, b = bounds(hi - lo, mesh.shape[d], coord[d])
                index = (slice(None),) * axis + (slice(a, b),)
                cuts.append(issue.call("getitem", locals_[i], index))
            locals_ = cuts
            current[d] = wanted[d]
    if not fresh:  # views of t's blocks: a new tensor, as DTensor's redistribute makes
        locals_ = [issue.call("copy", x) for x in locals_]
    return t.results.on_mesh(mesh, tuple(current), locals_, spec)


def scatter_for(t, out: tuple, shape: tuple):
    """Partial t redistributed to the blocks of a result placed `out` of `shape` that it
    joins (broadcast axes whole), if a reduce_scatter takes it there; else None."""
    off = len(shape) - t.ndim
    wanted: list[Placement] = []
    for p, o in zip(t._placements, out):
        ax = o.axis - off if type(o) is Shard else -1
        if ax >= 0 and t.shape[ax] == shape[o.axis]:
            wanted.append(Shard(ax))
        else:
            wanted.append(REPLICATE if type(p) is Partial else p)
    target = tuple(wanted)
    return redistribute(t, target) if _scatter_dims(t._placements, target) else None


def _scatter_dims(placements: tuple, wanted: tuple) -> list[int]:
    """The mesh dimensions that go Partial -> Shard(axis) by reduce_scatter, in order: each
    one splits its axis inside the blocks of the dimensions before it, as local_box nests
    them, so none may follow a dimension that shards the axis differently before and after,
    nor precede one that shards it already. Mixed Partial ops: none (all_reduce in order)."""
    if len({p.op for p in placements if type(p) is Partial}) != 1:
        return []
    now, dims = list(placements), []
    for d, (p, w) in enumerate(zip(placements, wanted)):
        if type(p) is not Partial or type(w) is not Shard:
            continue
        axis = Shard(w.axis)
        if axis in placements[d + 1:] or any(
                axis in (now[e], wanted[e]) and now[e] != wanted[e] for e in range(d)):
            continue
        now[d] = w
        dims.append(d)
    return dims


def _reduce_scatter_dims(t, dims: list, wanted: tuple) -> tuple[list, list]:
    """New blocks of t: reduce_scatter along `dims`, then all_reduce along its other Partial
    dimensions (on the smaller blocks); their placements then."""
    mesh, current, locals_ = t._mesh, list(t._placements), list(t._locals)
    for d in dims:
        out = [None] * mesh.size
        for group in mesh.groups(d):
            parts = reduce_scatter_group(mesh, [locals_[i] for i in group], group,
                                         current[d].op, wanted[d].axis)
            for i, part in zip(group, parts):
                out[i] = part
        locals_, current[d] = out, wanted[d]
    return list(_all_reduce_dims(mesh, locals_, tuple(current))), locals_


def _exchangeable(current: list, wanted: tuple, d: int) -> bool:
    """Whether dimension d goes Shard(a) -> Shard(b) with neither axis split by another
    dimension."""
    now, then = current[d], wanted[d]
    if type(now) is not Shard or type(then) is not Shard or now == then:
        return False
    others = [p for e, p in enumerate(current) if e != d] + \
        [p for e, p in enumerate(wanted) if e != d]
    return not any(type(p) is Shard and p.axis in (now.axis, then.axis) for p in others)


def _exchange_dim(mesh, spec, placements, locals_, d, new_axis) -> list:
    """All-to-all along mesh dimension d, pairwise: place p takes from every place q of its
    line the part of q's block in p's range of `new_axis` (moved worker to worker) and joins
    the parts along the old axis. Each worker holds only its new block, never the whole."""
    old_axis = placements[d].axis
    length, parts = spec.shape[new_axis], mesh.shape[d]
    out = [None] * mesh.size
    for line in mesh.groups(d):
        for k, p in enumerate(line):
            node, device = mesh.places[p]
            cut = (slice(None),) * new_axis + (slice(*bounds(length, parts, k)),)
            pieces = [carry(issue.call("getitem", locals_[q], cut), node, device)
                      for q in line]
            out[p] = issue.call("concatenate", pieces, axis=old_axis)
    return out


def _gather_dim(mesh, spec, placements, locals_, d) -> list:
    """Shard(axis) along mesh dimension d made whole at every place (all_gather)."""
    axis = placements[d].axis
    out = [None] * mesh.size
    for group in mesh.groups(d):
        sizes = [_length(spec, placements, mesh, i, axis) for i in group]
        top = max(sizes)
        parts = []
        for i, n in zip(group, sizes):  # uneven: pad to the longest, cut after
            part = locals_[i]
            if n != top:
                shape = list(part.shape)
                shape[axis] = top
                padded = issue.create(part.results, "zeros", tuple(shape), part.dtype,
                                      part._node, part._device)
                issue.call("setitem", padded, (slice(None),) * axis + (slice(0, n),), part)
                part = padded
            parts.append(part)
        gathered = all_gather_group(mesh, parts, group)
        for i, g in zip(group, gathered):
            out[i] = _unpadded(g, sizes, top, axis)
    return out


def _unpadded(g, sizes: list, top: int, axis: int):
    """The gathered blocks g (stacked on a new axis 0, each padded to `top` along `axis`)
    joined along `axis` without the padding: np.array_split's blocks, `top` long and then
    one shorter, by two slices; other lengths by an index (inline: 8 bytes a row)."""
    long = sizes.count(top)
    if long == len(sizes):
        return _joined(g, axis)
    if sizes == [top] * long + [top - 1] * (len(sizes) - long):
        short = issue.call("getitem", g, (slice(long, None),) + (slice(None),) * axis +
                           (slice(0, top - 1),))
        return issue.call("concatenate", [
            _joined(issue.call("getitem", g, (slice(0, long),)), axis),
            _joined(short, axis)], axis=axis)
    keep = np.concatenate([np.arange(n) + k * top for k, n in enumerate(sizes)])
    return issue.call("getitem", _joined(g, axis), (slice(None),) * axis + (keep,))


def _joined(g, axis: int):
    """Blocks stacked on a new axis 0 joined along `axis`."""
    whole = issue.call("moveaxis", g, 0, axis)
    shape = list(whole.shape)
    shape[axis:axis + 2] = [shape[axis] * shape[axis + 1]]
    return issue.call("reshape", whole, tuple(shape))


def _length(spec, placements, mesh, i, axis) -> int:
    lo, hi = local_box(spec.shape, placements, mesh.shape, mesh.coords[i])[axis]
    return hi - lo


def pick(t, index, spec):
    """t[index] with an int along a sharded axis: taken where it lies, broadcast along the
    mesh dimensions that shard the axes the ints pick (another sharded axis, whole in the
    index, stays sharded)."""
    resolve(t)
    mesh = t._mesh
    entries = basic_index(index, t.ndim)
    items = dict(e for e in entries if e is not None)
    out_axis, kept = 0, {}  # t's axis -> the result's
    for entry in entries:
        if entry is None or not isinstance(entry[1], (int, np.integer)):
            if entry is not None:
                kept[entry[0]] = out_axis
            out_axis += 1
    picked = tuple(d for d, p in enumerate(t._placements)
                   if type(p) is Shard and p.axis not in kept)
    out = tuple(REPLICATE if d in picked else Shard(kept[p.axis]) if type(p) is Shard else p
                for d, p in enumerate(t._placements))
    if any(type(p) is Shard and p.axis in kept and items[p.axis] != slice(None)
           for p in t._placements):
        raise no_plan(f"getitem: an int along one sharded axis and a slice along another of "
                      f"a tensor placed {describe(t._placements)}; replicate first "
                      "(t.replicate()[...])")
    locals_, holders = [], set()
    for i, coord in enumerate(mesh.coords):
        box = local_box(t.shape, t._placements, mesh.shape, coord)
        at = {ax: int(item) % t.shape[ax] for ax, item in items.items()
              if isinstance(item, (int, np.integer)) and ax in sharded_axes(t._placements)}
        local = t._locals[i]
        if all(box[ax][0] <= k < box[ax][1] for ax, k in at.items()):
            local_index = tuple(None if e is None else at[e[0]] - box[e[0]][0]
                                if e[0] in at else e[1] for e in entries)
            locals_.append(issue.call("getitem", local, local_index))
            holders.add(i)
        else:
            locals_.append(issue.create(local.results, "empty", local_shape(
                spec.shape, out, mesh.shape, coord), spec.dtype, local._node, local._device))
    for group in mesh.groups(picked) if len(picked) else ():
        holder = next(i for i in group if i in holders)
        broadcast_group(mesh, [locals_[i] for i in group], group.index(holder))
    return t.results.on_mesh(mesh, out, locals_, spec)


def per_place(label: str, operands: list, fn, keep: bool = False):
    """fn(local operands) at every place; on replicated operands (or, with `keep`, any that
    are placed alike), the results placed as the operands are."""
    for t in operands:
        resolve(t)
    placements = operands[0]._placements if operands else None
    if not keep and any(p != REPLICATE for t in operands for p in t._placements):
        raise no_plan(f"{label}: no placement rule for sharded operands ("
                             + " and ".join(describe(t._placements) for t in operands)
                             + "); replicate them first (t.replicate()), or run it on each "
                             "shard with mwrt.remote(fn)")
    mesh = operands[0]._mesh
    results = [fn([t._locals[i] for t in operands]) for i in range(mesh.size)]
    first = results[0]
    make = operands[0].results.on_mesh
    if isinstance(first, Handle):
        return make(mesh, placements, results, None if keep else first._spec)
    if isinstance(first, tuple) and first and isinstance(first[0], Handle):
        return tuple(make(mesh, placements, [r[j] for r in results],
                          None if keep else first[j]._spec)
                     for j in range(len(first)))
    return first  # a value computed on the master (a shape query): the same at every place


def gather_to_master(t) -> np.ndarray:
    """The whole value on the master; each distinct block fetched from one place, all at
    once (the requests go out to every node before the first reply is read). A failure is
    raised once: every place's stream reports its own error of the same ops meanwhile."""
    try:
        return _gather(t)
    except MwrtError:
        settle(t._locals)
        raise


def _gather(t) -> np.ndarray:
    resolve(t)
    mesh, spec = t._mesh, t.spec
    wanted, boxes = [], []
    seen = set()
    for i, coord in enumerate(mesh.coords):
        box = local_box(spec.shape, t._placements, mesh.shape, coord)
        if box not in seen:
            seen.add(box)
            wanted.append(t._locals[i])
            boxes.append(box)
    if len(wanted) == 1:
        return fetch_many(wanted)[0]
    out = np.empty(spec.shape, spec.dtype)
    for box, block in zip(boxes, fetch_many(wanted)):
        out[tuple(slice(lo, hi) for lo, hi in box)] = block
    return out
