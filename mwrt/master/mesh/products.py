"""Placement rules of matmul and dot: Shard(row) @ Replicate -> Shard(row); Replicate @
Shard(col) -> Shard(col); Shard(contraction) @ Shard(contraction) -> Partial(sum), and so
with either side replicated (each place cuts it to the other's block of the contraction);
stacks sharded on a batch axis (both alike, or one with the other replicated and broadcast
along it) keep it. Operands sharded otherwise (Shard(0) @ Shard(1): A @ A.T of a row-sharded
A) take the first two rules after the smaller operand is replicated (its all_gather, worker
to worker): each place then holds its rows (or columns) of the product.
"""

from __future__ import annotations

import numpy as np

from ..issue import call
from .fallback import replicated
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
    na, nb, r = ta.ndim, tb.ndim, len(spec.shape)
    row = na - 2 if na >= 2 else None
    col = nb - 1 if nb >= 2 else None
    row_out = r - 2 if nb >= 2 else r - 1
    out: list[Placement] = []
    cuts: dict = {}  # operand side -> its batch axis cut to each place's block
    ka, kb = na - 1, nb - 2 if nb >= 2 else 0  # the contracted axes
    contracted: set = set()  # the side whose contracted axis is cut to the other's blocks
    for pa, pb in zip(ta._placements, tb._placements):
        if pa == REPLICATE and pb == REPLICATE:
            out.append(REPLICATE)
        elif row is not None and pa == Shard(row) and pb == REPLICATE:
            out.append(Shard(row_out))
        elif col is not None and pa == REPLICATE and pb == Shard(col):
            out.append(Shard(r - 1))
        elif pa == Shard(ka) and pb == Shard(kb):
            out.append(Partial("sum"))
        elif (side := _contracted(ta, tb, pa, pb, ka, kb)) is not None:
            contracted.add(side)  # Shard(1) @ Replicate: each place its rows of the right
            out.append(Partial("sum"))
        elif (batch := _batch(ta, tb, pa, pb, r - (na >= 2) - (nb >= 2), cuts)) is not None:
            out.append(Shard(batch))
        else:
            gathered = _gathering(name, ta, tb, row, col, args, kwargs)
            if gathered is not None:
                return gathered
            raise no_rule(name, [ta, tb], "matmul shards rows of the left (Shard(0) @ "
                          "Replicate), columns of the right (Replicate @ Shard(1)), or the "
                          "contracted axis of either (Shard(1) @ Shard(0), or Replicate); "
                          "redistribute one, e.g. t.replicate()")
    placed = tuple(out)
    if len(contracted) > 1 or contracted & set(cuts):
        raise no_rule(name, [ta, tb], "matmul cuts one operand to the other's blocks, along "
                      "one axis; redistribute one, e.g. t.replicate()")
    views = {(a.k, b.k)[side]: _cut(operands[(a.k, b.k)[side]], own, axis, spec.shape, placed)
             for side, (own, axis) in cuts.items()}
    for side in contracted:
        whole, sharded = ((ta, tb), (tb, ta))[side]
        views[(a.k, b.k)[side]] = _cut_to(whole, (ka, kb)[side], sharded, (kb, ka)[side])
    return Plan(placed, views)


def _scalar_dot(name, operands, args, kwargs) -> Plan | None:
    """np.dot with a 0-d operand, NumPy's multiply: by multiply's plan; else None."""
    if name != "dot" or len(args) != 2 or kwargs:
        return None
    values = [operands[x.k] if type(x) is Slot else x for x in args]
    if all(v.ndim if type(x) is Slot else np.ndim(v) for x, v in zip(args, values)):
        return None
    return Plan(None, whole=lambda: np.multiply(*values))


def _gathering(name, ta, tb, row, col, args, kwargs) -> Plan | None:
    """The product with one operand replicated first where the other then keeps its rows
    (Shard(row) @ Replicate) or columns (Replicate @ Shard(col)): the smaller one, where
    either would; None where neither would."""
    if len(args) != 2 or kwargs:
        return None
    rows = all(p == REPLICATE or (row is not None and p == Shard(row)) for p in ta._placements)
    cols = all(p == REPLICATE or (col is not None and p == Shard(col)) for p in tb._placements)
    if not (rows or cols):
        return None
    product = np.matmul if name == "matmul" else np.dot
    if rows and (not cols or tb.nbytes <= ta.nbytes):
        return Plan(None, whole=lambda: product(ta, replicated(tb)))
    return Plan(None, whole=lambda: product(replicated(ta), tb))


def _contracted(ta, tb, pa, pb, ka: int, kb: int):
    """The side (0: the left) whose whole contracted axis each place cuts to the other's
    block of it, where the other shards it here and this one is replicated; else None."""
    if pa == Shard(ka) and pb == REPLICATE and Shard(kb) not in tb._placements:
        return 1
    if pa == REPLICATE and pb == Shard(kb) and Shard(ka) not in ta._placements:
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
    for side, (t, p) in enumerate(((ta, pa), (tb, pb))):
        own = axis - (batches - max(t.ndim - 2, 0))  # its axis of the result's batch axis
        if type(p) is Shard and p.axis == own:
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
