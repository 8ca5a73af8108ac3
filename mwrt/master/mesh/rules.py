"""Placement rules: for an op on mesh tensors, the result's placements and what each place
computes. A rule sees the operands (ShardedTensors), the op's arguments with the operands
marked, and the result's global Spec; it returns a Plan, or raises PlacementError naming the
placements and the redistribute() call that fixes them. No rule ever gathers data silently.

- elementwise (ufuncs, where, clip, astype, real, imag, in-place forms): operands sharded on
  one result axis per mesh dimension (one sharded otherwise exchanged to the first's blocks,
  an all-to-all); a replicated operand joins, sliced to each place's block; a
  Partial(sum) operand stays Partial under a scalar multiply/divide or a sum with its like;
  one that joins a sharded result is reduce_scattered to its blocks, others all_reduced.
- reductions: over unsharded axes keep the shards; over a sharded axis give Partial(sum, max,
  min, prod) (mean: a sum scaled by the global count); var, std, argmax, argmin, cumsum and
  cumprod over it run in two phases (twophase.py); median takes the sort's plan (sorting.py),
  and over an empty axis runs at every place on its block (all of that axis).
- matmul, dot: products.py (and np.kron of a sharded operand and a whole one, which
  arrayfunc.py asks it for).
- shape ops (transpose, swapaxes, moveaxis, expand_dims, squeeze, reshape keeping the sharded
  axis and those before it) follow the sharded axis; other reshapes, and concatenate along
  it, regroup it between the places (regroup.py); getitem/setitem with basic indices
  (shapes.py), int lists and masks (selecting.py).
- anything else runs on replicated operands only.
"""

from __future__ import annotations

import cmath
import math
import warnings

import numpy as np

from ...ops.elementwise import UFUNCS
from ...ops.meta_helpers import normalize_axes
from ...ops.reductions import REDUCTIONS
from ..issue import call
from . import moves, products, shapes, sorting, twophase
from .placement import REPLICATE, Partial, Shard, describe, local_box
from .plan import (
    PlacementError,
    Plan,
    Slot,
    all_sum,
    fix_text,
    is_partial,
    no_rule,
    replicated_only,
)

_SCALAR_UFUNCS = {n for n in UFUNCS if getattr(np, n).signature is None}  # not matmul, vecdot
ELEMENTWISE = _SCALAR_UFUNCS | {"where", "clip", "round", "astype", "copy", "ascontiguousarray",
                                "real", "imag"}
IN_PLACE = {f"{n}_" for n in _SCALAR_UFUNCS} | {"copy_", "fill_"}
_LINEAR_SCALAR = {"multiply", "true_divide", "negative", "positive", "multiply_",
                  "true_divide_"}
_LINEAR_SUM = {"add", "subtract", "add_", "subtract_"}
PARTIAL_OF = {"sum": "sum", "nansum": "sum", "count_nonzero": "sum", "mean": "sum",
              "prod": "prod", "nanprod": "prod", "min": "min", "nanmin": "min", "max": "max",
              "nanmax": "max", "any": "max", "all": "min"}
_SCANS = ("cumsum", "cumprod")  # their result keeps the input's axes


# -- elementwise ---------------------------------------------------------------------------

def elementwise(name, operands, args, kwargs, spec, resolve) -> Plan:
    inplace = name in IN_PLACE
    target = operands[0] if inplace else None
    shape = target.shape if target is not None else (
        spec[0] if type(spec) is tuple else spec).shape
    moved = _unbroadcast(operands, shape)  # {operand index: its new tensor}
    placed = [moved.get(k, t) for k, t in enumerate(operands)]
    if target is not None and is_partial(target) and not _stays_partial(name, placed, args):
        resolve(target)  # made real (replicated) first: the others then take its placements
    aligned = _aligned(name, placed, target, shape)
    if aligned:
        moved.update(aligned)
        placed = [moved.get(k, t) for k, t in enumerate(operands)]
    scattered: dict = dict(moved)
    if any(is_partial(t) for t in placed):
        if _stays_partial(name, placed, args):
            return Plan(None if inplace else operands[0]._placements)
        scattered.update(_resolve_partials(placed, target, _agreed(name, placed, len(shape)),
                                           shape, resolve))
    out = _agreed(name, placed, len(shape))
    if target is not None and out != target._placements:
        wanted = target._placements
        raise no_rule(name, operands, f"an in-place result keeps its target's placements "
                      f"{describe(wanted)}: redistribute the other operand ({fix_text(wanted)}) "
                      "or the target")
    views = {}
    for k, t in enumerate(placed):
        t = scattered.get(k, t)
        v = _joined(name, t, operands, out, shape)
        if v is not None or k in scattered:
            views[k] = t._locals if v is None else v
    return Plan(None if inplace else out, views, adjust=_cut_arrays(args, out, shape,
                                                                    operands[0]._mesh))


def _unbroadcast(operands, shape) -> dict:
    """Operands sharded along an axis they broadcast along (length 1, the result's longer)
    replicated along it (and made real), as each place needs that axis's one element and
    some places' blocks of it are empty: {operand index: the new tensor}."""
    moved: dict = {}
    for k, t in enumerate(operands):
        off = len(shape) - t.ndim
        spread = [type(p) is Shard and t.shape[p.axis] == 1 and shape[p.axis + off] != 1
                  for p in t._placements]
        if any(spread):
            moved[k] = moves.redistribute(t, tuple(
                REPLICATE if wide or type(p) is Partial else p
                for p, wide in zip(t._placements, spread)))
    return moved


def _aligned(name, operands, target, shape) -> dict:
    """Operands sharded on other axes than the first sharded one (an in-place op's target)
    exchanged to its blocks, each place receiving only its block (all-to-all): {operand
    index: the new tensor}; {} where they agree already, or one is Partial."""
    sharded = [t for t in operands if any(type(p) is Shard for p in t._placements)]
    if not sharded or any(is_partial(t) for t in operands):
        return {}
    lead = target if target is not None else sharded[0]
    lead_off = len(shape) - lead.ndim
    moved = {}
    for k, t in enumerate(operands):
        off = len(shape) - t.ndim
        wanted = []
        for p in lead._placements:
            ax = p.axis + lead_off - off if type(p) is Shard else -1
            wanted.append(Shard(ax) if ax >= 0 and t.shape[ax] == shape[ax + off] else REPLICATE)
        pairs = list(zip(t._placements, wanted))
        if t is not lead and (any(type(p) is Shard and p != w for p, w in pairs) or any(
                p == REPLICATE and w in t._placements for p, w in pairs if type(w) is Shard)):
            # sharded otherwise, or along fewer of the dimensions that nest the lead's axis
            moved[k] = moves.redistribute(t, tuple(wanted))
    return moved


def _resolve_partials(operands, target, out, shape, resolve) -> dict:
    """Make the Partial operands real: one that joins a result sharded along its axes takes
    only the blocks it needs, by reduce_scatter ({operand index: that new tensor}, the
    operand left Partial); the others (and an in-place target) are all_reduced in place."""
    scattered: dict = {}
    made: dict = {}  # one reduce_scatter for an operand that appears twice
    for k, t in enumerate(operands):
        if not is_partial(t) or t is target:
            resolve(t)
            continue
        if id(t) not in made:
            made[id(t)] = moves.scatter_for(t, out, shape)
        if made[id(t)] is None:
            resolve(t)
        else:
            scattered[k] = made[id(t)]
    return scattered


def _cut_arrays(args, out, shape, mesh):
    """A master array operand spanning a sharded axis goes to each place as its block (cut
    on the master, sent inline with the op); None if there is none."""
    cut = [pos for pos, a in enumerate(args) if isinstance(a, np.ndarray) and any(
        type(p) is Shard and p.axis - (len(shape) - a.ndim) >= 0 and
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
        # a scalar that is not finite, or a zero divisor, makes infinities of the parts
        # whose sum is nan (inf + -inf) where the whole's is not: combined first
        scalars = all(isinstance(a, (int, float, complex)) and cmath.isfinite(a) and not (
            a == 0 and name.startswith("true_divide")) for a in args if type(a) is not Slot)
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
    return call("getitem", local, index)


# -- reductions ----------------------------------------------------------------------------

def reduction(name, operands, args, kwargs, spec, resolve) -> Plan:
    t = operands[0]
    axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
    keepdims = bool(kwargs.get("keepdims", False))
    if is_partial(t) and not (name in ("sum", "mean") and all_sum(t)):
        resolve(t)
    scan = name in _SCANS
    if scan and axis is None:
        axes = tuple(range(t.ndim))
    else:
        axes = normalize_axes(axis, t.ndim, name) if not isinstance(axis, Slot) else ()
    if (name in twophase.MOMENTS or name in twophase.INDEXES or name in twophase.SCANS or
            name == "median") and any(type(p) is Shard and p.axis in axes
                                      for p in t._placements):
        whole = sorting.median_plan(t, args, kwargs, axes) if name == "median" else \
            twophase.plan(name, t, args, kwargs, axes)
        if whole is not None:
            return Plan(None, whole=whole)
    # median over an empty axis: each place's block holds all of it (none), so its own
    # median (NumPy's nan, with its warnings) is the whole's, for its block of the rest
    empty = name == "median" and not math.prod(t.shape[a] for a in axes)
    out, scaled = [], False
    for p in t._placements:
        if type(p) is not Shard:
            out.append(p)
        elif p.axis in axes and empty:
            out.append(REPLICATE)
        elif p.axis in axes:
            if name not in PARTIAL_OF:
                raise no_rule(name, operands, f"{name} along a sharded axis: replicate it "
                              f"first (t.replicate().{name}(...)) or shard another axis")
            out.append(Partial(PARTIAL_OF[name]))
            scaled = scaled or name == "mean"
        else:
            kept = keepdims or scan
            out.append(Shard(p.axis if kept else p.axis - sum(a < p.axis for a in axes)))
    if name in _NEEDS_INITIAL and any(type(p) is Partial for p in out):
        return _with_initial(name, t, axes, tuple(out))
    if not scaled:
        return Plan(tuple(out))
    count = int(np.prod([t.shape[a] for a in axes]))
    dtype = spec.dtype
    if count == 0:  # the places divide 0 by 0, quietly: NumPy's warning is raised here
        warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=4)

    def as_sum(i, name, args, kwargs):
        return "sum", args, kwargs

    def scale(i, local):  # as NumPy's mean: the sum divided by the count
        local = call("true_divide", local, count)
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
    identity: complex | bool
    if kind.kind == "f":
        identity = float("inf") * _NEEDS_INITIAL[name]
    elif kind.kind == "c":  # ordered by real part, then imaginary
        big = float("inf") * _NEEDS_INITIAL[name]
        identity = complex(big, big)
    elif kind.kind in "iu":
        info = np.iinfo(kind)
        identity = int(info.max if _NEEDS_INITIAL[name] > 0 else info.min)
    else:
        identity = _NEEDS_INITIAL[name] > 0

    def initial(i, name, args, kwargs):
        return name, args, (dict(kwargs, initial=identity) if i in empty else kwargs)
    return Plan(out, adjust=initial)


# -- shapes and indexing -------------------------------------------------------------------

def find(name: str):
    """The rule for op `name`."""
    if name in ELEMENTWISE or name in IN_PLACE:
        return elementwise
    if name in REDUCTIONS:
        return reduction
    if name in ("matmul", "dot"):
        return products.matmul
    if name in shapes.PERMUTING:
        return shapes.permuting
    if name in ("sort", "argsort"):
        return shapes.axiswise
    return {"squeeze": shapes.squeeze, "reshape": shapes.reshape, "flatten": shapes.reshape,
            "ravel": shapes.reshape, "getitem": shapes.getitem,
            "setitem": shapes.setitem, "concatenate": shapes.join,
            "stack": shapes.join}.get(name, replicated_only)


__all__ = ["PlacementError", "Plan", "Slot", "find"]
