"""Mesh tensors from the constructors (mesh=, shard=) and from the master (dist_send), and
the one-place blocks they are made of."""

from __future__ import annotations

import numpy as np

from ...arrays import as_dtype
from ...ops import Spec
from ...protocol import wire
from .. import context, issue, ordering, transfer
from ..tensor import DistributedTensor
from .device_mesh import Mesh
from .groups import broadcast_group
from .placement import REPLICATE, local_box, shard_arg


def create_at(kind: str, shape: tuple, dtype: np.dtype, target, device: int, args=()):
    """A constructor's tensor of `shape` at one place (node `target`, `device`)."""
    return issue.create(DistributedTensor, kind, shape, dtype, target, device, args)


def put_at(array: np.ndarray, target, device: int):
    """A copy of the master's C-contiguous `array` at one place (node `target`, `device`)."""
    stream = context.stream_for(target.index, device)
    tensor = DistributedTensor(target, device, next(target.ids), Spec(array.shape, array.dtype),
                               stream)
    transfer.send(tensor, array)
    return tensor


def create(kind: str, shape: tuple, dtype, mesh: Mesh, shard, args=()):
    """A constructor's tensor of global `shape` laid over `mesh` as `shard` asks."""
    dtype = as_dtype(dtype)
    placements = shard_arg(shard, len(shape), mesh.ndim, kind)
    counter = mesh.shared_ids()
    if counter is not None and not ordering.capture:  # one id for every place's block
        return _create_everywhere(kind, shape, dtype, mesh, placements, args, counter)
    locals_ = []
    for node, (_, device), coord in zip(mesh.nodes, mesh.places, mesh.coords):
        box = local_box(shape, placements, mesh.shape, coord)
        local_shape = tuple(hi - lo for lo, hi in box)
        local_args = _local_args(kind, args, box, placements)
        locals_.append(create_at(kind, local_shape, dtype, node, device, local_args))
    return DistributedTensor.on_mesh(mesh, placements, locals_, Spec(shape, dtype))


def _create_everywhere(kind, shape, dtype, mesh, placements, args, counter):
    """The tensor, each place's block named by one id (mesh ops then encode one command for
    all): one record for all where every place makes its block on one stream."""
    tensor_id, now = next(counter), next(counter)
    devices = mesh.place_devices
    streams = [context.stream_for(node.index, d) for node, d in zip(mesh.nodes, devices)]
    boxes = [local_box(shape, placements, mesh.shape, c) for c in mesh.coords]
    shapes = [tuple(hi - lo for lo, hi in box) for box in boxes]
    spec = Spec(shape, dtype)
    if all(s == streams[0] for s in streams):
        made = DistributedTensor.everywhere(mesh, placements, spec, tensor_id, streams[0])
    else:
        made = DistributedTensor.on_mesh(mesh, placements, DistributedTensor.at_places(
            mesh.nodes, devices, tensor_id, [Spec(s, dtype) for s in shapes], streams), spec)
    for node, device, stream, box, local_shape in zip(mesh.nodes, devices, streams, boxes,
                                                      shapes):
        node.issue(wire.Create(id=now, stream=stream, out=tensor_id, kind=kind,
                               shape=local_shape, dtype=dtype.str, device=device,
                               args=tuple(_local_args(kind, args, box, placements))))
    return made


def _local_args(kind: str, args: tuple, box: tuple, placements: tuple) -> tuple:
    if kind in ("rand", "randn") and any(p != REPLICATE for p in placements):
        # each block its own stream of samples; replicas of one block the same
        return ((args[0] + hash(box)) % (1 << 63),)
    if kind == "arange" and box:
        start, _, step = args
        lo, hi = box[0]
        first = start + lo * step
        exact = all(isinstance(v, (int, np.integer)) for v in args)
        # float steps: a stop half a step past the last value gives exactly hi - lo values
        return (first, start + hi * step if exact else first + (hi - lo - 0.5) * step, step)
    return args


def put(array: np.ndarray, mesh: Mesh, shard):
    """dist_send(array, mesh=, shard=): each place gets its block from the master; a large
    replicated array goes to one place and is broadcast from there, worker to worker."""
    array = np.asarray(array, order="C")
    placements = shard_arg(shard, array.ndim, mesh.ndim, "dist_send")
    spec = Spec(array.shape, array.dtype)
    whole = all(p == REPLICATE for p in placements)
    nodes = [n for n, _ in mesh.places]
    if whole and not wire.rides_inline(array.nbytes) and len(set(nodes)) == len(nodes) > 1:
        first = put_at(array, mesh.nodes[0], mesh.places[0][1])
        rest = [create_at("empty", array.shape, array.dtype, n, d)
                for n, (_, d) in zip(mesh.nodes[1:], mesh.places[1:])]
        locals_ = [first, *rest]
        broadcast_group(mesh, locals_, 0)
        return DistributedTensor.on_mesh(mesh, placements, locals_, spec)
    locals_ = []
    for node, (_, device), coord in zip(mesh.nodes, mesh.places, mesh.coords):
        box = local_box(array.shape, placements, mesh.shape, coord)
        block = array[tuple(slice(lo, hi) for lo, hi in box)]
        # np.asarray, not np.ascontiguousarray: that makes a 0-d block 1-d
        locals_.append(put_at(np.asarray(block, order="C"), node, device))
    return DistributedTensor.on_mesh(mesh, placements, locals_, spec)
