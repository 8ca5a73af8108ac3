"""Placement rules of matmul and dot: Shard(row) @ Replicate -> Shard(row); Replicate @
Shard(col) -> Shard(col); Shard(contraction) @ Shard(contraction) -> Partial(sum), and so
with either side replicated (each place cuts it to the other's block of the contraction);
stacks sharded on a batch axis (both alike, along the same mesh dimensions, or one with the
other replicated and broadcast along it) keep it. Operands sharded otherwise (Shard(0) @
Shard(1): A @ A.T of a row-sharded A) take the first two rules after the smaller operand is
replicated (its all_gather, worker to worker): each place then holds its rows (or columns)
of the product. Any other pair (Shard(2) @ Shard(0) of stacks: the contracted axis and a
batch axis) has one operand redistributed to the placements that pair with the other's (an
all-to-all where it is sharded), whichever moves fewer bytes: a local product then follows.
np.dot of two stacks, whose result has the left's axes but its last and then the right's
but its second-to-last (no batch axes), keeps a sharded kept axis of one beside the other
replicated, and otherwise replicates the smaller operand.

np.kron(A, B) with A sharded along one axis and B whole at every place (replicated, or a
master array): each place's kron of its block is a run of the result's axis (its rows
times B's length there), moved to the result's blocks (runs.exchange, worker to worker);
with B sharded and A whole, a run for each of A's rows along that axis (64 at most).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...ops import Spec
from ..issue import call
from . import runs
from .fallback import replicated
from .moves import redistribute, resolve
from .placement import REPLICATE, Partial, Placement, Shard, local_box
from .plan import Plan, Slot, no_rule


def _getitem(local, index):
    return call("getitem", local, index)


def matmul(name, operands, args, kwargs, spec, resolve) -> Plan:
    for t in operands:
        resolve(t)
    a, b = args[0], args[1]
    scalar = _scalar_dot(name, operands, args, kwargs)
    if scalar is not None:
        return scalar
    if type(a) is not Slot or type(b) is not Slot:
        return _one_side(name, operands, args, spec)
    ta, tb = operands[a.k], operands[b.k]
    if name == "dot" and min(ta.ndim, tb.ndim) >= 2 and max(ta.ndim, tb.ndim) > 2:
        return _dot_stacks(ta, tb, a.k, b.k, args, kwargs)
    paired = _pairing(ta, tb, ta._placements, tb._placements, len(spec.shape))
    if paired is None:
        moved = _gathering(name, ta, tb, args, kwargs) or _exchanging(name, ta, tb, args, kwargs,
                                                                     spec)
        if moved is not None:
            return moved
        raise no_rule(name, [ta, tb], "matmul shards rows of the left (Shard(0) @ "
                      "Replicate), columns of the right (Replicate @ Shard(1)), the "
                      "contracted axis of either (Shard(1) @ Shard(0), or Replicate) or a "
                      "batch axis; redistribute one, e.g. t.replicate()")
    placed, cuts, contracted = paired
    ka, kb = ta.ndim - 1, tb.ndim - 2 if tb.ndim >= 2 else 0  # the contracted axes
    views = {(a.k, b.k)[side]: _cut(operands[(a.k, b.k)[side]], own, axis, spec.shape, placed)
             for side, (own, axis) in cuts.items()}
    for side in contracted:
        whole, sharded = ((ta, tb), (tb, ta))[side]
        views[(a.k, b.k)[side]] = _cut_to(whole, (ka, kb)[side], sharded, (kb, ka)[side])
    return Plan(placed, views)


def _pairing(ta, tb, pas: tuple, pbs: tuple, r: int):
    """(the result's placements, {side: its batch axis cut to each place's block}, {the side
    whose contracted axis is cut to the other's blocks}) of ta @ tb placed `pas` and `pbs`,
    the result of `r` axes; None where a mesh dimension pairs them by no rule."""
    na, nb = ta.ndim, tb.ndim
    row = na - 2 if na >= 2 else None
    col = nb - 1 if nb >= 2 else None
    row_out = r - 2 if nb >= 2 else r - 1
    out: list[Placement] = []
    cuts: dict = {}  # operand side -> its batch axis cut to each place's block
    ka, kb = na - 1, nb - 2 if nb >= 2 else 0  # the contracted axes
    contracted: set = set()  # the side whose contracted axis is cut to the other's blocks
    for pa, pb in zip(pas, pbs):
        if pa == REPLICATE and pb == REPLICATE:
            out.append(REPLICATE)
        elif row is not None and pa == Shard(row) and pb == REPLICATE:
            out.append(Shard(row_out))
        elif col is not None and pa == REPLICATE and pb == Shard(col):
            out.append(Shard(r - 1))
        elif pa == Shard(ka) and pb == Shard(kb):
            out.append(Partial("sum"))
        elif (side := _contracted(pas, pbs, pa, pb, ka, kb)) is not None:
            contracted.add(side)  # Shard(1) @ Replicate: each place its rows of the right
            out.append(Partial("sum"))
        elif (batch := _batch(ta, tb, pa, pb, r - (na >= 2) - (nb >= 2), cuts)) is not None:
            out.append(Shard(batch))
        else:
            return None
    if len(contracted) > 1 or contracted & set(cuts):
        return None  # one operand is cut to the other's blocks, along one axis
    if not _nested_alike(ta, tb, pas, pbs, out, r - (na >= 2) - (nb >= 2)):
        return None
    return tuple(out), cuts, contracted


def _nested_alike(ta, tb, pas, pbs, out: list, batches: int) -> bool:
    """True if each operand holds each sharded batch axis of the result as the result's
    blocks: sharded along every mesh dimension that shards it there, or along none (whole
    at every place: cut, or broadcast)."""
    for axis in {p.axis for p in out if type(p) is Shard and p.axis < batches}:
        dims = [d for d, p in enumerate(out) if p == Shard(axis)]
        for t, placed in ((ta, pas), (tb, pbs)):
            own = axis - (batches - max(t.ndim - 2, 0))
            if not 0 <= own < t.ndim - 2:
                continue  # it has no such axis: broadcast
            held = [placed[d] == Shard(own) for d in dims]
            if any(held) and not all(held):
                return False
    return True


def _dot_stacks(ta, tb, ka_slot: int, kb_slot: int, args, kwargs) -> Plan:
    """np.dot of stacks: the result's axes are the left's but its last, then the right's
    but its second-to-last (no batch axes). Where the operands' placements pair (_dotted),
    each place multiplies its blocks; else the smaller operand that pairs once replicated
    is replicated first (its all_gather, worker to worker)."""
    found = _dotted(ta, tb, ta._placements, tb._placements)
    if found is None:
        whole = (REPLICATE,) * ta._mesh.ndim
        sides = sorted((t.nbytes, side) for side, t in enumerate((ta, tb)) if _dotted(
            ta, tb, *((whole, tb._placements) if side == 0 else (ta._placements, whole))))
        if not sides or len(args) != 2 or kwargs:
            raise no_rule("dot", [ta, tb], "dot of stacks shards the left's axes but its "
                          "last, the right's but its second-to-last, or the contracted axis "
                          "of both; redistribute one, e.g. t.replicate()")
        side = sides[0][1]
        return Plan(None, whole=lambda: np.dot(replicated(ta), tb) if side == 0 else
                    np.dot(ta, replicated(tb)))
    placed, contracted = found
    ka, kb = ta.ndim - 1, tb.ndim - 2
    views = {}
    for side in contracted:  # its contracted axis cut to the other's blocks of it
        whole_t, sharded = ((ta, tb), (tb, ta))[side]
        views[(ka_slot, kb_slot)[side]] = _cut_to(whole_t, (ka, kb)[side], sharded,
                                                  (kb, ka)[side])
    return Plan(placed, views)


def _dotted(ta, tb, pas: tuple, pbs: tuple):
    """(the placements of np.dot(ta, tb) placed `pas` and `pbs`, {the side whose contracted
    axis is cut to the other's blocks}), or None where a mesh dimension pairs them by no
    rule: a kept axis of one beside the other replicated, or the contracted axes."""
    ka, kb = ta.ndim - 1, tb.ndim - 2
    out: list[Placement] = []
    contracted: set = set()
    for pa, pb in zip(pas, pbs):
        if pa == REPLICATE and pb == REPLICATE:
            out.append(REPLICATE)
        elif pa == Shard(ka) and pb == Shard(kb):
            out.append(Partial("sum"))
        elif (side := _contracted(pas, pbs, pa, pb, ka, kb)) is not None:
            contracted.add(side)
            out.append(Partial("sum"))
        elif type(pa) is Shard and pb == REPLICATE and pa.axis != ka:
            out.append(pa)  # the left's axes lead the result's
        elif pa == REPLICATE and type(pb) is Shard and pb.axis != kb:
            out.append(Shard(ka + pb.axis - (pb.axis > kb)))
        else:
            return None
    return None if len(contracted) > 1 else (tuple(out), contracted)


def _scalar_dot(name, operands, args, kwargs) -> Plan | None:
    """np.dot with a 0-d operand, NumPy's multiply: by multiply's plan; else None."""
    if name != "dot" or len(args) != 2 or kwargs:
        return None
    values = [operands[x.k] if type(x) is Slot else x for x in args]
    if all(v.ndim if type(x) is Slot else np.ndim(v) for x, v in zip(args, values)):
        return None
    return Plan(None, whole=lambda: np.multiply(*values))


def _gathering(name, ta, tb, args, kwargs) -> Plan | None:
    """The product with one operand replicated first where the other then keeps its rows
    (Shard(row) @ Replicate) or columns (Replicate @ Shard(col)): the smaller one, where
    either would; None where neither would."""
    if len(args) != 2 or kwargs:
        return None
    row = ta.ndim - 2 if ta.ndim >= 2 else None
    col = tb.ndim - 1 if tb.ndim >= 2 else None
    rows = all(p == REPLICATE or (row is not None and p == Shard(row)) for p in ta._placements)
    cols = all(p == REPLICATE or (col is not None and p == Shard(col)) for p in tb._placements)
    if not (rows or cols):
        return None
    product = np.matmul if name == "matmul" else np.dot
    if rows and (not cols or tb.nbytes <= ta.nbytes):
        return Plan(None, whole=lambda: product(ta, replicated(tb)))
    return Plan(None, whole=lambda: product(replicated(ta), tb))


def _exchanging(name, ta, tb, args, kwargs, spec) -> Plan | None:
    """Stacks sharded where no rule pairs them (the contracted axis of one, a batch axis of
    the other: Shard(2) @ Shard(0)): one operand is redistributed to the placements that
    pair with the other's, worker to worker (an all-to-all where it is sharded already),
    then the product runs by a rule: the other's batch shards kept, or its contracted axis
    met (a local product, then a Partial sum, as DTensor's). Of the two, the one that moves
    fewer bytes, counting a Partial result's all_reduce; None where neither pairs."""
    if len(args) != 2 or kwargs:  # (dot of two stacks, whose axes differ: _dot_stacks)
        return None
    r, options = len(spec.shape), []
    for side, (t, other) in enumerate(((ta, tb), (tb, ta))):
        partners = [_partner(t, side, other, p, r) for p in other._placements]
        kept = tuple(q if p == REPLICATE else w  # beside a replicated other: as it is, if
                     for p, q, w in zip(other._placements, t._placements, partners))
        for wanted in dict.fromkeys((kept, tuple(partners))):  # that pairs
            pas, pbs = (wanted, tb._placements) if side == 0 else (ta._placements, wanted)
            paired = _pairing(ta, tb, pas, pbs, r)
            if paired is not None:
                break
        if paired is None or wanted == t._placements:
            continue
        partial = any(type(p) is Partial for p in paired[0])
        cost = _moving(t, wanted) + (2 * math.prod(spec.shape) * spec.dtype.itemsize
                                     if partial else 0)
        options.append((cost, side, wanted))
    if not options:
        return None
    _, side, wanted = min(options)
    product = np.matmul if name == "matmul" else np.dot

    def whole():
        if side == 0:
            return product(redistribute(ta, wanted), tb)
        return product(ta, redistribute(tb, wanted))
    return Plan(None, whole=whole)


def _partner(t, side: int, other, p, r: int) -> Placement:
    """The placement of operand `t` (side 0: the left) that pairs with the other's `p` along
    a mesh dimension with no cut: its contracted axis with the other's, its batch axis
    with the other's (replicated where it broadcasts along it), else replicated."""
    if type(p) is not Shard:
        return REPLICATE
    kt = (t.ndim - 1) if side == 0 else (t.ndim - 2 if t.ndim >= 2 else 0)
    ko = (other.ndim - 2 if other.ndim >= 2 else 0) if side == 0 else other.ndim - 1
    if p.axis == ko:
        return Shard(kt)
    batches = r - (t.ndim >= 2) - (other.ndim >= 2)
    if p.axis >= other.ndim - 2:  # the other's rows or columns: t is needed whole
        return REPLICATE
    axis = p.axis + batches - (other.ndim - 2)  # the result's batch axis
    own = axis - (batches - max(t.ndim - 2, 0))
    if 0 <= own < t.ndim - 2 and t.shape[own] == other.shape[p.axis]:
        return Shard(own)
    return REPLICATE


def _moving(t, wanted: tuple) -> int:
    """About the bytes that redistributing t to `wanted` moves between places: an all_gather
    along a mesh dimension of n places n - 1 times its size, an all-to-all its size, a
    cut none."""
    shape, moved = t._mesh.shape, 0
    for d, (p, w) in enumerate(zip(t._placements, wanted)):
        if p != w and type(p) is Shard:
            moved += t.nbytes * ((shape[d] - 1) if w == REPLICATE else 1)
    return moved


def _contracted(pas, pbs, pa, pb, ka: int, kb: int):
    """The side (0: the left) whose whole contracted axis each place cuts to the other's
    block of it, where the other shards it here and this one is replicated; else None."""
    if pa == Shard(ka) and pb == REPLICATE and Shard(kb) not in pbs:
        return 1
    if pa == REPLICATE and pb == Shard(kb) and Shard(ka) not in pas:
        return 0
    return None


def _cut_to(t, own: int, other, axis: int) -> list:
    """Per place, t's block cut along its axis `own` to `other`'s block of its `axis`."""
    mesh = t._mesh
    return [_getitem(t._locals[i], (slice(None),) * own + (slice(*local_box(
        other.shape, other._placements, mesh.shape, coord)[axis]),))
        for i, coord in enumerate(mesh.coords)]


def _batch(ta, tb, pa, pb, batches: int, cuts: dict):
    """The result's axis where a matmul of stacks keeps a sharded batch axis: both operands
    sharded on it alike, or one sharded and the other replicated (absent or of length 1:
    broadcast; else cut to each place's block: cuts[0 or 1] = (its axis, the result's)); else
    None."""
    axes = {p.axis + batches - (t.ndim - 2) for t, p in ((ta, pa), (tb, pb))
            if type(p) is Shard and p.axis < t.ndim - 2}
    if len(axes) != 1:
        return None
    axis = axes.pop()
    longest = max(t.shape[own] for t in (ta, tb)
                  if 0 <= (own := axis - (batches - max(t.ndim - 2, 0))) < t.ndim - 2)
    for side, (t, p) in enumerate(((ta, pa), (tb, pb))):
        own = axis - (batches - max(t.ndim - 2, 0))  # its axis of the result's batch axis
        if type(p) is Shard and p.axis == own:
            if t.shape[own] != longest:  # of length 1, broadcast: some places hold none
                return None
            continue
        if p != REPLICATE:
            return None
        if 0 <= own < t.ndim - 2 and t.shape[own] != 1:
            if cuts.get(side, (own, axis)) != (own, axis):
                return None  # cut along two axes: none of these plans
            cuts[side] = (own, axis)
    return axis


def _cut(t, own: int, axis: int, shape: tuple, out: tuple) -> list:
    """Per place, replicated `t` cut along its axis `own` to the block of the result's
    `axis` there."""
    mesh = t._mesh
    views = []
    for i, coord in enumerate(mesh.coords):
        lo, hi = local_box(shape, out, mesh.shape, coord)[axis]
        views.append(_getitem(t._locals[i], (slice(None),) * own + (slice(lo, hi),)))
    return views


def _one_side(name, operands, args, spec) -> Plan:
    """matmul with a master array on one side: only a replicated mesh tensor joins it."""
    t = operands[0]
    if any(p != REPLICATE for p in t._placements):
        raise no_rule(name, operands, "the other operand is not on the mesh: send it there "
                      "(mwrt.dist_send(x, mesh=m)) or replicate this one (t.replicate())")
    return Plan(t._placements)


__all__ = ["matmul"]


def kron(operands: list, args: tuple, kwargs: dict, count):
    """np.kron(A, B) by its plan (see the module's text), one of A and B sharded along one
    axis and the other whole at every place; None where the operands lie otherwise."""
    if kwargs or len(args) != 2 or not all(type(v) is Slot or isinstance(v, np.ndarray)
                                           for v in args):
        return None
    for t in operands:
        resolve(t)
    values: list[Any] = [operands[v.k] if type(v) is Slot else v for v in args]
    axes = [{p.axis for p in v._placements if type(p) is Shard} if type(u) is Slot else set()
            for u, v in zip(args, values)]
    side = 0 if axes[0] else 1  # the sharded operand; the other must be whole everywhere
    other = values[1 - side]
    if len(axes[side]) != 1 or axes[1 - side] or (type(args[1 - side]) is Slot and any(
            p != REPLICATE for p in other._placements)):
        return None
    t, axis, n = values[side], axes[side].pop(), max(values[0].ndim, values[1].ndim)
    r = axis + n - t.ndim  # its axis in the result's
    ones = (1,) * n
    sa, sb = (ones[v.ndim:] + tuple(v.shape) for v in values)
    if side and not 0 < sa[r] <= 64:  # as many runs of the result per place as A's rows
        return None
    spec = Spec(tuple(x * y for x, y in zip(sa, sb)), np.result_type(*[v.dtype for v in values]))
    mesh = t._mesh
    out = tuple(Shard(r) if type(p) is Shard else REPLICATE for p in t._placements)
    held, wanted = [], []
    for i, coord in enumerate(mesh.coords):
        lo, hi = local_box(t.shape, t._placements, mesh.shape, coord)[axis]
        local = [v._locals[i] if type(u) is Slot else v for u, v in zip(args, values)]
        part = call("numpy", "kron", count, *local)
        if not side:  # A's rows lo..hi: one run of the result, B's length each
            held.append([(part, lo * sb[r], hi * sb[r])])
        else:  # B's rows lo..hi under each of A's: a run per row of A
            k = hi - lo
            held.append([(_getitem(part, (slice(None),) * r + (slice(j * k, j * k + k),)),
                          j * sb[r] + lo, j * sb[r] + hi) for j in range(sa[r])])
        wanted.append(local_box(spec.shape, out, mesh.shape, coord)[r])
    dims = tuple(d for d, p in enumerate(t._placements) if type(p) is Shard)
    return t.results.on_mesh(mesh, out, runs.exchange(mesh, dims, r, held, wanted), spec)
