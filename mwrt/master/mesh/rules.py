"""Placement rules: for an op on mesh tensors, the result's placements and what each place
computes. A rule sees the operands (ShardedTensors), the op's arguments with the operands
marked, and the result's global Spec; it returns a Plan, or raises PlacementError naming the
placements and the redistribute() call that fixes them. No rule ever gathers data silently.

- elementwise (ufuncs, where, clip, astype, in-place forms): operands sharded on one result
  axis per mesh dimension; a replicated operand joins, sliced to each place's block; a
  Partial(sum) operand stays Partial under a scalar multiply/divide or a sum with its like.
- reductions: over unsharded axes keep the shards; over a sharded axis give Partial(sum, max,
  min, prod) (mean: a sum scaled by the global count).
- matmul: Shard(row) @ Replicate -> Shard(row); Replicate @ Shard(col) -> Shard(col);
  Shard(contraction) @ Shard(contraction) -> Partial(sum).
- shape ops (transpose, swapaxes, moveaxis, expand_dims, squeeze, reshape keeping the sharded
  axis and those before it) follow the sharded axis; getitem/setitem with basic indices.
- anything else runs on replicated operands only.
"""

from __future__ import annotations

import numpy as np

from ...ops import Spec
from ...ops._meta import normalize_axes
from ...ops.elementwise import UFUNCS
from ...ops.reductions import REDUCTIONS
from .placement import REPLICATE, Partial, Shard, bounds, describe, local_box


class PlacementError(ValueError):
    """An op whose operands' placements have no rule; redistribute one of them first."""


class Slot:
    """Where operand `k` stands among an op's arguments."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k


class Plan:
    """What each place computes: the op on local operands (some replaced by `views`),
    `adjust(i, name, args, kwargs)` per place, `post(i, result)` after; `skip` places
    run nothing; `whole()`, when given, does the op itself (it moves data between places)."""

    __slots__ = ("adjust", "placements", "post", "skip", "views", "whole")

    def __init__(self, placements, views=None, adjust=None, post=None, skip=(), whole=None):
        self.placements, self.views = placements, views or {}
        self.adjust, self.post, self.skip, self.whole = adjust, post, skip, whole


_SCALAR_UFUNCS = {n for n in UFUNCS if getattr(np, n).signature is None}  # not matmul, vecdot
ELEMENTWISE = _SCALAR_UFUNCS | {"where", "clip", "round", "astype", "copy", "ascontiguousarray"}
IN_PLACE = {f"{n}_" for n in _SCALAR_UFUNCS} | {"copy_", "fill_"}
_LINEAR_SCALAR = {"multiply", "true_divide", "negative", "positive", "multiply_",
                  "true_divide_"}
_LINEAR_SUM = {"add", "subtract", "add_", "subtract_"}
PARTIAL_OF = {"sum": "sum", "nansum": "sum", "count_nonzero": "sum", "mean": "sum",
              "prod": "prod", "nanprod": "prod", "min": "min", "nanmin": "min", "max": "max",
              "nanmax": "max", "any": "max", "all": "min"}
_PERMUTING = {"transpose", "swapaxes", "moveaxis", "expand_dims"}


def fix_text(placements: tuple) -> str:
    """The redistribute() call that puts a tensor at `placements`."""
    if all(p == REPLICATE for p in placements):
        return "t.replicate()"
    if len(set(placements)) == 1 and type(placements[0]) is Shard:
        return f"t.redistribute(shard={placements[0].axis})"
    return "t.redistribute(" + ", ".join(map(repr, placements)) + ")"


def no_rule(name: str, operands, fix: str) -> PlacementError:
    placed = " and ".join(describe(t._placements) for t in operands)
    return PlacementError(f"{name}: no placement rule for operands placed {placed} on "
                          f"{operands[0]._mesh!r}; {fix} (mwrt never gathers a tensor "
                          "silently)")


def is_partial(t) -> bool:
    return any(type(p) is Partial for p in t._placements)


def all_sum(t) -> bool:
    return all(p.op == "sum" for p in t._placements if type(p) is Partial)


# -- elementwise ---------------------------------------------------------------------------

def elementwise(name, operands, args, kwargs, spec, resolve) -> Plan:
    inplace = name in IN_PLACE
    target = operands[0] if inplace else None
    if any(is_partial(t) for t in operands):
        if _stays_partial(name, operands, args):
            return Plan(None if inplace else operands[0]._placements)
        for t in operands:
            resolve(t)
    shape = target.shape if inplace else (spec[0] if type(spec) is tuple else spec).shape
    out = _agreed(name, operands, len(shape))
    if inplace and out != target._placements:
        wanted = target._placements
        raise no_rule(name, operands, f"an in-place result keeps its target's placements "
                      f"{describe(wanted)}: redistribute the other operand ({fix_text(wanted)}) "
                      "or the target")
    views = {k: v for k, t in enumerate(operands)
             if (v := _joined(name, t, operands, out, shape)) is not None}
    return Plan(None if inplace else out, views, adjust=_cut_arrays(args, out, shape,
                                                                    operands[0]._mesh))


def _cut_arrays(args, out, shape, mesh):
    """A master array operand spanning a sharded axis goes to each place as its block (cut
    on the master, sent inline with the op); None if there is none."""
    cut = [pos for pos, a in enumerate(args) if isinstance(a, np.ndarray) and any(
        type(p) is Shard and 0 <= p.axis - (len(shape) - a.ndim) and
        a.shape[p.axis - (len(shape) - a.ndim)] != 1 for p in out)]
    if not cut:
        return None

    def block(i, name, largs, kwargs):
        box = local_box(shape, out, mesh.shape, mesh.coords[i])
        largs = list(largs)
        for pos in cut:
            a = largs[pos]
            off = len(shape) - a.ndim
            largs[pos] = a[tuple(slice(*box[ax + off]) if a.shape[ax] != 1 else slice(None)
                                 for ax in range(a.ndim))]
        return name, tuple(largs), kwargs
    return block


def _stays_partial(name, operands, args) -> bool:
    if not all(all_sum(t) for t in operands):
        return False
    if name in _LINEAR_SCALAR:
        scalars = all(isinstance(a, (int, float, complex)) for a in args if type(a) is not Slot)
        first = type(args[0]) is Slot
        return len(operands) == 1 and scalars and (first or name.startswith("multiply"))
    if name in _LINEAR_SUM:
        return (len(operands) == len(args) and
                len({t._placements for t in operands}) == 1 and
                len({t.shape for t in operands}) == 1)
    return False


def _agreed(name, operands, ndim: int) -> tuple:
    """One placement per mesh dimension on which every operand agrees (in result axes)."""
    out = []
    for d in range(operands[0]._mesh.ndim):
        axes = {p.axis + ndim - t.ndim for t in operands
                if type(p := t._placements[d]) is Shard}
        if len(axes) > 1:
            first = next(t for t in operands if type(t._placements[d]) is Shard)
            raise no_rule(name, operands, "operands sharded on different axes: redistribute "
                          f"one like the other ({fix_text(first._placements)})")
        out.append(Shard(axes.pop()) if axes else REPLICATE)
    return tuple(out)


def _joined(name, t, operands, out, shape):
    """Per place, operand `t` sliced to the place's block where it is replicated and the
    result sharded; None if it needs no slicing."""
    off = len(shape) - t.ndim
    cuts = []
    for a in {p.axis for p in out if type(p) is Shard}:
        ax, dims = a - off, [d for d, p in enumerate(out) if p == Shard(a)]
        mine = [d for d in dims if t._placements[d] == Shard(ax)] if ax >= 0 else []
        if ax < 0 or (t.shape[ax] == 1 and shape[a] != 1 and not mine):
            continue  # broadcast along the sharded axis: every place uses it whole
        if len(mine) == len(dims):
            continue
        if mine or t.shape[ax] != shape[a]:
            raise no_rule(name, operands, f"redistribute the operands alike "
                          f"({fix_text(out)})")
        cuts.append((ax, a))
    if not cuts:
        return None
    mesh = t._mesh
    views = []
    for i, coord in enumerate(mesh.coords):
        box = local_box(shape, out, mesh.shape, coord)
        index = [slice(None)] * t.ndim
        for ax, a in cuts:
            index[ax] = slice(*box[a])
        views.append(_getitem(t._locals[i], tuple(index)))
    return views


def _getitem(local, index):
    from ..issue import call

    return call("getitem", local, index)


# -- reductions ----------------------------------------------------------------------------

def reduction(name, operands, args, kwargs, spec, resolve) -> Plan:
    t = operands[0]
    axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
    keepdims = bool(kwargs.get("keepdims", False))
    if is_partial(t) and not (name in ("sum", "mean") and all_sum(t)):
        resolve(t)
    if name in ("cumsum", "cumprod") and axis is None:
        axes = tuple(range(t.ndim))
    else:
        axes = normalize_axes(axis, t.ndim, name) if not isinstance(axis, Slot) else ()
    out, scaled = [], False
    for p in t._placements:
        if type(p) is not Shard:
            out.append(p)
        elif p.axis in axes:
            if name not in PARTIAL_OF:
                raise no_rule(name, operands, f"{name} along a sharded axis: replicate it "
                              f"first (t.replicate().{name}(...)) or shard another axis")
            out.append(Partial(PARTIAL_OF[name]))
            scaled = scaled or name == "mean"
        else:
            out.append(Shard(p.axis if keepdims else p.axis - sum(a < p.axis for a in axes)))
    if name in _NEEDS_INITIAL and any(type(p) is Partial for p in out):
        return _with_initial(name, t, axes, tuple(out))
    if not scaled:
        return Plan(tuple(out))
    count = int(np.prod([t.shape[a] for a in axes]))
    dtype = spec.dtype

    def as_sum(i, name, args, kwargs):
        return "sum", args, kwargs

    def scale(i, local):
        from ..issue import call

        local = call("multiply", local, 1.0 / count)
        return local if local.dtype == dtype else call("astype", local, dtype.str)
    return Plan(tuple(out), adjust=as_sum, post=scale)


_NEEDS_INITIAL = {"min": 1, "max": -1, "nanmin": 1, "nanmax": -1}  # identity: +-largest


def _with_initial(name, t, axes, out) -> Plan:
    """min/max over a sharded axis where a place's block is empty (more places than rows):
    that place reduces with NumPy's `initial=`, the identity of the op for the dtype."""
    mesh = t._mesh
    empty = {i for i, c in enumerate(mesh.coords)
             if any(hi == lo for a, (lo, hi) in
                    enumerate(local_box(t.shape, t._placements, mesh.shape, c)) if a in axes)}
    if not empty:
        return Plan(out)
    kind = t.dtype
    if kind.kind == "f":
        identity = float("inf") * _NEEDS_INITIAL[name]
    elif kind.kind in "iu":
        info = np.iinfo(kind)
        identity = int(info.max if _NEEDS_INITIAL[name] > 0 else info.min)
    else:
        identity = _NEEDS_INITIAL[name] > 0

    def initial(i, name, args, kwargs):
        return name, args, (dict(kwargs, initial=identity) if i in empty else kwargs)
    return Plan(out, adjust=initial)


# -- matmul --------------------------------------------------------------------------------

def matmul(name, operands, args, kwargs, spec, resolve) -> Plan:
    for t in operands:
        resolve(t)
    a, b = args[0], args[1]
    if type(a) is not Slot or type(b) is not Slot:
        return _one_side(name, operands, args, spec)
    ta, tb = operands[a.k], operands[b.k]
    na, nb, r = ta.ndim, tb.ndim, len(spec.shape)
    row = na - 2 if na >= 2 else None
    col = nb - 1 if nb >= 2 else None
    row_out = r - 2 if nb >= 2 else r - 1
    out = []
    for pa, pb in zip(ta._placements, tb._placements):
        if pa == REPLICATE and pb == REPLICATE:
            out.append(REPLICATE)
        elif row is not None and pa == Shard(row) and pb == REPLICATE:
            out.append(Shard(row_out))
        elif col is not None and pa == REPLICATE and pb == Shard(col):
            out.append(Shard(r - 1))
        elif pa == Shard(na - 1) and pb == Shard(nb - 2 if nb >= 2 else 0):
            out.append(Partial("sum"))
        else:
            raise no_rule(name, [ta, tb], "matmul shards rows of the left (Shard(0) @ "
                          "Replicate), columns of the right (Replicate @ Shard(1)), or the "
                          "contracted axis of both (Shard(1) @ Shard(0)); redistribute one, "
                          "e.g. t.replicate()")
    return Plan(tuple(out))


def _one_side(name, operands, args, spec) -> Plan:
    """matmul with a master array on one side: only a replicated mesh tensor joins it."""
    t = operands[0]
    if any(p != REPLICATE for p in t._placements):
        raise no_rule(name, operands, "the other operand is not on the mesh: send it there "
                      "(mwrt.dist_send(x, mesh=m)) or replicate this one (t.replicate())")
    return Plan(t._placements)


# -- shapes and indexing -------------------------------------------------------------------

def permuting(name, operands, args, kwargs, spec, resolve) -> Plan:
    """transpose, swapaxes, moveaxis, expand_dims: the sharded axis goes where it goes."""
    t = operands[0]
    probe = np.empty(tuple(range(2, t.ndim + 2)), dtype=np.dtype([]))
    rest = [a for a in args[1:]]
    moved = getattr(np, name)(probe, *rest, **kwargs).shape
    where = {size - 2: i for i, size in enumerate(moved) if size >= 2}
    return Plan(tuple(Shard(where[p.axis]) if type(p) is Shard else p
                      for p in t._placements))


def squeeze(name, operands, args, kwargs, spec, resolve) -> Plan:
    t = operands[0]
    axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
    gone = (tuple(a for a, n in enumerate(t.shape) if n == 1) if axis is None
            else normalize_axes(axis, t.ndim, "squeeze"))
    out = []
    for p in t._placements:
        if type(p) is Shard and p.axis in gone:
            raise no_rule(name, operands, "squeezing the sharded axis: replicate first "
                          "(t.replicate())")
        out.append(Shard(p.axis - sum(a < p.axis for a in gone)) if type(p) is Shard else p)

    def explicit(i, name, args, kwargs):
        return name, args[:1], {"axis": gone}
    return Plan(tuple(out), adjust=explicit)


def reshape(name, operands, args, kwargs, spec, resolve) -> Plan:
    t = operands[0]
    new = spec.shape
    sharded = {p.axis for p in t._placements if type(p) is Shard}
    if name in ("flatten", "ravel") and t.ndim == 1:
        return Plan(t._placements)
    if not sharded:
        return Plan(t._placements)
    last = max(sharded)
    if name != "reshape" or tuple(new[:last + 1]) != tuple(t.shape[:last + 1]):
        raise no_rule(name, operands, f"a reshape keeps the sharded axis {last} and those "
                      f"before it (got {t.shape} -> {new}); replicate first (t.replicate()) "
                      "or shard axis 0")
    mesh = t._mesh

    def local_shape(i, name, args, kwargs):
        box = local_box(t.shape, t._placements, mesh.shape, mesh.coords[i])
        shape = list(new)
        for a in sharded:
            shape[a] = box[a][1] - box[a][0]
        return name, (args[0], tuple(shape)), {}
    return Plan(t._placements, adjust=local_shape)


def axiswise(name, operands, args, kwargs, spec, resolve) -> Plan:
    """sort, argsort: fine along an unsharded axis."""
    t = operands[0]
    resolve(t)
    axis = kwargs.get("axis", args[1] if len(args) > 1 else -1)
    if any(p == Shard(axis % t.ndim) for p in t._placements):
        raise no_rule(name, operands, f"{name} along the sharded axis: replicate first "
                      f"(t.replicate().{name}(...)) or shard another axis")
    return Plan(t._placements)


def getitem(name, operands, args, kwargs, spec, resolve) -> Plan:
    """Basic indices across the sharded axis keep it sharded; an int along it takes the row
    from the place that holds it and broadcasts it (worker to worker)."""
    t = operands[0]
    entries = _basic(args[1], t.ndim)
    if entries is None or len(operands) > 1:
        return replicated_only(name, operands, args, kwargs, spec, resolve)
    sharded = {p.axis for p in t._placements if type(p) is Shard}
    where, out_axis = {}, 0
    for entry in entries:
        if entry is None:
            out_axis += 1
            continue
        ax, item = entry
        if ax in sharded:
            if isinstance(item, slice) and item == slice(None):
                where[ax] = out_axis
            elif isinstance(item, (int, np.integer)):
                where[ax] = "int"
            else:
                raise no_rule(name, operands, "a slice along the sharded axis: replicate "
                              "first (t.replicate()[...]) or index another axis")
        if not isinstance(item, (int, np.integer)):
            out_axis += 1
    if "int" in where.values():
        from .moves import pick

        return Plan(None, whole=lambda: pick(t, args[1], spec))
    return Plan(tuple(Shard(where[p.axis]) if type(p) is Shard else p
                      for p in t._placements))


def _basic(index, ndim):
    """[(axis, item) or None (a new axis)] for a basic index; None for any other index."""
    items = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice))
               for i in items) or sum(i is Ellipsis for i in items) > 1:
        return None
    real = sum(i is not None and i is not Ellipsis for i in items)
    out, ax = [], 0
    for i in items:
        if i is Ellipsis:
            for _ in range(ndim - real):
                out.append((ax, slice(None)))
                ax += 1
        elif i is None:
            out.append(None)
        else:
            out.append((ax, i))
            ax += 1
    out += [(a, slice(None)) for a in range(ax, ndim)]
    return out


def setitem(name, operands, args, kwargs, spec, resolve) -> Plan:
    """t[index] = scalar: each place writes the part of `index` in its block."""
    t = operands[0]
    resolve(t)
    entries = _basic(args[1], t.ndim)
    sharded = {p.axis for p in t._placements if type(p) is Shard}
    if not sharded:
        return replicated_only(name, operands, args, kwargs, spec, resolve)
    if entries is None or len(operands) > 1 or None in entries:
        raise no_rule(name, operands, "setting through a sharded tensor takes basic indices "
                      "and a scalar; replicate first (t.replicate()) or set each shard "
                      "(t.shards())")
    mesh, skip, local_index = t._mesh, [], {}
    for i, coord in enumerate(mesh.coords):
        box = local_box(t.shape, t._placements, mesh.shape, coord)
        index = []
        for ax, item in entries:
            if ax in sharded:
                item = _localize(item, t.shape[ax], *box[ax])
                if item is None:
                    skip.append(i)
                    break
            index.append(item)
        local_index[i] = tuple(index)

    def local(i, name, args, kwargs):
        return name, (args[0], local_index[i], *args[2:]), kwargs
    return Plan(None, adjust=local, skip=set(skip))


def _localize(item, length, lo, hi):
    """`item` (an int or slice of an axis of `length`) within block [lo, hi), in block
    coordinates; None if it misses the block."""
    if isinstance(item, (int, np.integer)):
        i = int(item) % length
        return i - lo if lo <= i < hi else None
    start, stop, step = item.indices(length)
    if step < 0:
        raise PlacementError("setitem: a negative step along the sharded axis; use a positive "
                             "one")
    first = max(start, lo + (start - lo) % step if start < lo else start)
    if first >= min(stop, hi):
        return None
    return slice(first - lo, min(stop, hi) - lo, step)


def replicated_only(name, operands, args, kwargs, spec, resolve) -> Plan:
    """Any other op: at every place, on replicated operands."""
    for t in operands:
        resolve(t)
    if any(p != REPLICATE for t in operands for p in t._placements):
        raise no_rule(name, operands, f"{name} has no rule for sharded operands: replicate "
                      "them first (t.replicate())")
    return Plan(operands[0]._placements)


def find(name: str):
    """The rule for op `name`."""
    if name in ELEMENTWISE or name in IN_PLACE:
        return elementwise
    if name in REDUCTIONS:
        return reduction
    if name in ("matmul", "dot"):
        return matmul
    if name in _PERMUTING:
        return permuting
    if name in ("sort", "argsort"):
        return axiswise
    return {"squeeze": squeeze, "reshape": reshape, "flatten": reshape, "ravel": reshape,
            "getitem": getitem, "setitem": setitem}.get(name, replicated_only)


def local_spec(spec: Spec, placements, mesh, i) -> tuple:
    """The shape of place `i`'s block of a tensor of global `spec`."""
    box = local_box(spec.shape, placements, mesh.shape, mesh.coords[i])
    return tuple(hi - lo for lo, hi in box)


__all__ = ["PlacementError", "Plan", "Slot", "bounds", "find"]
