"""Collectives the master issues over DistributedTensors that live on several nodes.

`mwrt.all_reduce([t0, t1, ...])` sends one command to each tensor's node; the workers
then run the process-group algorithm (mwrt.collectives) among themselves over the
session's data channel, on each tensor's current stream, like any op. The master never
touches the data; it checks what it can see (one tensor per node, same shape and dtype,
a valid op) at issue time, so mistakes are raised here, naming the nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..collective.reduce_ops import ReduceOp, reduce_op
from ..ops import Spec
from ..protocol import wire
from . import context, ordering
from .client import Node
from .cluster import current
from .handle import Handle
from .mesh.placement import bounds
from .sites import issue_site
from .waits import uninterrupted

Tensors = Sequence[Handle]
Sends = list[tuple[Node, wire.Collective, tuple | None]]  # (node, its part, the user's line)


def _check(tensors, what: str) -> list:
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, Handle) and t._mesh is None for t in tensors):
        raise TypeError(f"{what}: expected a non-empty list of DistributedTensors, one per node")
    nodes = [t.get_node() for t in tensors]
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"{what}: each tensor must be on its own node (got nodes {nodes})")
    first = tensors[0]
    for t in tensors[1:]:
        if (t.shape, t.dtype) != (first.shape, first.dtype):
            raise ValueError(f"{what}: tensors disagree (node {first.get_node()}: "
                             f"{first.dtype}{list(first.shape)}, node {t.get_node()}: "
                             f"{t.dtype}{list(t.shape)}); every node needs the same shape and "
                             "dtype")
    return tensors


def _group_id(placements) -> int:
    """One process group per set of (node, stream) pairs, numbered by the master for every
    worker alike: a group's collectives then run in one order on every node (its streams'),
    and collectives on other streams, running beside them, never share its sequence."""
    key = tuple((node, context.stream_for(node, device)) for node, device in placements)
    groups = current().__dict__.setdefault("collective_groups", {})
    return groups.setdefault(key, len(groups) + 1)


def _issue(sends: Sends, kind: str, tensor, node, device, ranks, group, args, out_spec=None,
           write: bool = True, like=None):
    """Make one node's command of the collective, for _send(); the new tensor it makes, if
    any, of the class of `like` (else of `tensor`). `write`: the collective writes `tensor`
    (False: it only reads it)."""
    stream = context.stream_for(node.index, device)
    out = None
    if out_spec is not None:
        out = (tensor if like is None else like).results(node, device, next(node.ids), out_spec,
                                                         stream)
    now = next(node.ids)
    if tensor is not None:  # most write their tensor in place: after all its uses
        ordering.use(tensor, stream, now, write=write)
    sends.append((node, wire.Collective(
        id=now, stream=stream, kind=kind, group=group, ranks=ranks, args=args,
        ref=-1 if tensor is None else tensor._id, out=-1 if out is None else out._id,
        out_shape=() if out_spec is None else out_spec.shape), issue_site()))
    return out


def _send(sends: Sends) -> None:
    """Send every node its part now, not with a later batch (its peers may already wait in
    it), and all of them: on a helper thread, so that a Ctrl-C (or a node's backpressure
    wait it falls in) never leaves the nodes that got theirs waiting for the others."""
    for node, _, _ in sends:  # a node lost, or of an ended session, refuses it before any
        node.check_open()  # peer waits in it
    if ordering.capture:  # a graph records them (on this thread), nothing is sent
        for node, command, _ in sends:
            node.issue(command)
        return

    def send_all():
        with current().pairing:  # every node queues the collectives of a group in one order
            for node, command, site in sends:
                node.issue(command, site=site)
                node.flush()

    uninterrupted(send_all)


def all_reduce(tensors: Tensors, op: ReduceOp | str = ReduceOp.SUM
               ) -> list[Handle]:
    """Combine the tensors with `op`, in place: every node ends with the same result."""
    tensors = _check(tensors, "all_reduce")
    op = reduce_op(op, tensors[0].dtype, "all_reduce")
    ranks, group = _placed(tensors)
    sends: Sends = []
    for t in tensors:
        _issue(sends, "all_reduce", t, t._node, t._device, ranks, group, {"op": op.name})
    _send(sends)
    return tensors


def broadcast(tensors: Tensors, src: int = 0) -> list[Handle]:
    """Copy tensors[src] into every other tensor, in place."""
    tensors = _check(tensors, "broadcast")
    _check_index(src, tensors, "broadcast", "src")
    ranks, group = _placed(tensors)
    sends: Sends = []
    for t in tensors:
        _issue(sends, "broadcast", t, t._node, t._device, ranks, group, {"root": src})
    _send(sends)
    return tensors


def reduce(tensors: Tensors, dst: int = 0, op: ReduceOp | str = ReduceOp.SUM
           ) -> Handle:
    """Combine the tensors with `op` into tensors[dst] (the others are scratch space)."""
    tensors = _check(tensors, "reduce")
    _check_index(dst, tensors, "reduce", "dst")
    op = reduce_op(op, tensors[0].dtype, "reduce")
    ranks, group = _placed(tensors)
    sends: Sends = []
    for t in tensors:
        _issue(sends, "reduce", t, t._node, t._device, ranks, group,
               {"root": dst, "op": op.name})
    _send(sends)
    return tensors[dst]


def all_gather(tensors: Tensors) -> list[Handle]:
    """On every node, a new tensor stacking all the tensors: shape (len(tensors), *shape)."""
    tensors = _check(tensors, "all_gather")
    ranks, group = _placed(tensors)
    spec = Spec((len(tensors), *tensors[0].shape), tensors[0].dtype)
    sends: Sends = []
    outs = [_issue(sends, "all_gather", t, t._node, t._device, ranks, group,
                   {"dtype": spec.dtype.str}, spec) for t in tensors]
    _send(sends)
    return outs


def reduce_scatter(tensors: Tensors, op: ReduceOp | str = ReduceOp.SUM
                   ) -> list[Handle]:
    """Combine the tensors with `op` and split the result along axis 0 as np.array_split
    does: on node i (tensors[i]'s), a new tensor holding part i (uneven lengths: the first
    parts one row longer; a part may be empty). The tensors themselves are left intact."""
    tensors = _check(tensors, "reduce_scatter")
    first = tensors[0]
    if first.ndim == 0:
        raise ValueError(f"reduce_scatter: 0-d tensors have no axis 0 to split (nodes "
                         f"{[t.get_node() for t in tensors]}); reshape them to (1,) or use "
                         "all_reduce")
    op = reduce_op(op, first.dtype, "reduce_scatter")
    ranks, group = _placed(tensors)
    rows, rest, outs = first.shape[0], first.shape[1:], []
    sends: Sends = []
    for i, t in enumerate(tensors):
        start, stop = bounds(rows, len(tensors), i)
        spec = Spec((stop - start, *rest), first.dtype)
        outs.append(_issue(sends, "reduce_scatter", t, t._node, t._device, ranks, group,
                           {"op": op.name, "dtype": spec.dtype.str}, spec, write=False))
    _send(sends)
    return outs


def gather(tensors: Tensors, dst: int = 0) -> Handle:
    """A new tensor on tensors[dst]'s node stacking all the tensors."""
    tensors = _check(tensors, "gather")
    _check_index(dst, tensors, "gather", "dst")
    ranks, group = _placed(tensors)
    spec = Spec((len(tensors), *tensors[0].shape), tensors[0].dtype)
    sends: Sends = []
    made = [_issue(sends, "gather", t, t._node, t._device, ranks, group,
                   {"root": dst, "dtype": spec.dtype.str}, spec if i == dst else None)
            for i, t in enumerate(tensors)]
    _send(sends)
    return made[dst]


def scatter(tensor: Handle, nodes: Sequence[int]) -> list[Handle]:
    """Split `tensor` (shape (len(nodes), *rest)) along axis 0: part i goes to nodes[i]."""
    if not isinstance(tensor, Handle) or tensor._mesh is not None:
        raise TypeError(f"scatter: expected a DistributedTensor (got {type(tensor).__name__})")
    places = [current().node(n) for n in nodes]
    ranks = tuple(n.index for n in places)
    if len(set(ranks)) != len(ranks) or tensor.get_node() not in ranks:
        raise ValueError(f"scatter: nodes must be distinct and include the tensor's node "
                         f"{tensor.get_node()} (got {list(ranks)})")
    if not tensor.shape or tensor.shape[0] != len(places):
        raise ValueError(f"scatter: the tensor's first axis must have one part per node (got "
                         f"shape {tensor.shape}, expected ({len(places)}, ...))")
    root = ranks.index(tensor.get_node())
    spec = Spec(tensor.shape[1:], tensor.dtype)
    group = _group_id([(n, tensor._device) for n in ranks])
    sends: Sends = []
    outs = [_issue(sends, "scatter", tensor if node is tensor._node else None, node,
                   tensor._device, ranks, group, {"root": root, "dtype": spec.dtype.str}, spec,
                   like=tensor)
            for node in places]
    _send(sends)
    return outs


def _placed(tensors) -> tuple[tuple, int]:
    """The tensors' nodes, and the process group of their nodes and streams."""
    return (tuple(t.get_node() for t in tensors),
            _group_id([(t.get_node(), t._device) for t in tensors]))


def _check_index(index, tensors, what: str, name: str) -> None:
    if not isinstance(index, (int, np.integer)) or not 0 <= index < len(tensors):
        raise ValueError(f"{what}: {name} must index the tensors list, in [0, {len(tensors)}) "
                         f"(got {index!r})")
