"""Collectives along a mesh dimension's groups of places (mesh.groups(d)): where the places
of a group are on distinct nodes, the master-issued collectives (master/collectives.py: one
command per node, the data worker to worker); where some share a node (its GPUs), moves
between their devices and the op on one of them. And one place's tensor carried to another
place, inside a graph capture too.
"""

from __future__ import annotations

from .. import collectives, issue, ordering
from ..cluster import current
from .placement import bounds

_OPS = {"sum": ("add", "SUM"), "max": ("maximum", "MAX"), "min": ("minimum", "MIN"),
        "prod": ("multiply", "PRODUCT")}


def _distinct(mesh, group) -> bool:
    return len({mesh.places[i][0] for i in group}) == len(group)


def all_reduce_group(mesh, locals_: list, group: list, op: str) -> None:
    """Combine locals_[group] with `op`, in place at every place of the group."""
    if len(group) == 1:
        return
    ufunc, name = _OPS[op]
    tensors = [locals_[i] for i in group]
    if _distinct(mesh, group):
        collectives.all_reduce(tensors, op=name)
        return
    first = tensors[0]
    total = first.copy()
    for t in tensors[1:]:  # same node, other devices: moves between them
        issue.call(f"{ufunc}_", total, t.to(first.get_node(), first.get_device()))
    for t in tensors:
        t.copy_(total.to(t.get_node(), t.get_device()))


def all_gather_group(mesh, tensors: list, group: list) -> list:
    """At each place of the group, a new tensor stacking the group's tensors (same shape)."""
    if _distinct(mesh, group):
        return collectives.all_gather(tensors)
    stacked = []
    for t in tensors:
        parts = [p.to(t.get_node(), t.get_device()) for p in tensors]
        stacked.append(issue.call("stack", parts))
    return stacked


def reduce_scatter_group(mesh, tensors: list, group: list, op: str, axis: int) -> list:
    """At place k of the group, a new tensor: part k (as np.array_split cuts `axis`) of the
    `op` of the group's tensors, which are left intact."""
    if len(group) == 1:
        return [issue.call("copy", tensors[0])]
    ufunc, name = _OPS[op]
    if _distinct(mesh, group):
        if axis == 0:
            return collectives.reduce_scatter(tensors, op=name)
        # the collective splits axis 0: the parts come back with the axis where it was, and
        # contiguous (an all_reduce along another mesh dimension may take them next)
        fronts = [issue.call("moveaxis", t, axis, 0) for t in tensors]
        return [issue.call("ascontiguousarray", issue.call("moveaxis", p, 0, axis))
                for p in collectives.reduce_scatter(fronts, op=name)]
    first = tensors[0]
    home = (first.get_node(), first.get_device())
    total = first.copy()
    for t in tensors[1:]:  # same node, other devices: moves between them
        issue.call(f"{ufunc}_", total, t.to(*home))
    parts = []
    for k, t in enumerate(tensors):
        cut = (slice(None),) * axis + (slice(*bounds(total.shape[axis], len(tensors), k)),)
        part = issue.call("getitem", total, cut)
        place = (t.get_node(), t.get_device())
        parts.append(issue.call("copy", part) if place == home else part.to(*place))
    return parts


def broadcast_group(mesh, tensors: list, root: int) -> None:
    """tensors[root] copied into the others, in place."""
    if len({t.get_node() for t in tensors}) == len(tensors):
        collectives.broadcast(tensors, src=root)
        return
    source = tensors[root]
    for t in tensors:
        if t is not source:
            t.copy_(source.to(t.get_node(), t.get_device()))


def carry(t, node: int, device: int):
    """t (one place's tensor) at (node, device): t.to(), worker to worker; inside a graph
    capture, which records no moves between nodes, a broadcast from t's node over the two
    (a collective, which it records) into a tensor made there."""
    if not ordering.capture or t.get_node() == node:
        return t.to(node=node, device=device)
    target = current().node(node)
    out = issue.create(t.results, "zeros", t.shape, t.dtype, target, device)
    collectives.broadcast([issue.call("ascontiguousarray", t), out], src=0)
    return out
