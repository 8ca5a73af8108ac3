"""Moving bytes: master to worker (dist_send), worker to master (numpy), between places (to)."""

from __future__ import annotations

import numpy as np

from . import config, context, wire
from .arrays import as_dtype
from .cluster import current
from .ops import Spec

_PUT, _GET = wire.code(wire.Put), wire.code(wire.Get)


def put(array, node: int | None = None, device: int | None = None):
    """Copy a NumPy array from the master to (node, device); returns its DistributedTensor."""
    from .tensor import DistributedTensor

    if not isinstance(array, (np.ndarray, np.generic)):
        raise TypeError(f"dist_send: expected a NumPy array (got {type(array).__name__}); "
                        "wrap data with np.asarray first")
    array = np.asarray(array, order="C")  # keeps 0-d arrays 0-d
    as_dtype(array.dtype)
    target = current().node(context.current_node() if node is None else node)
    device = context.current_device() if device is None else device
    stream = context.stream_for(target.index, device)
    tensor = DistributedTensor(target, device, next(target.ids), Spec(array.shape, array.dtype),
                               stream)
    payload = array.reshape(-1).view(np.uint8) if array.size else b""
    target.issue((_PUT, next(target.ids), stream, tensor._id, array.shape, array.dtype.str,
                  device, -1), frame=payload)
    if array.nbytes > config.get("inline_bytes"):
        target.wait_sent(config.get("sync_timeout"))  # the caller may reuse its array at once
    return tensor


def fetch(tensor) -> np.ndarray:
    """Copy a tensor's contents to the master; a sync point of its stream."""
    node = tensor._node
    reply, frames = node.request((_GET, next(node.ids), tensor._streams[0], tensor._id),
                                 f"numpy() of tensor {tensor._id}")
    shape, dtype = tuple(reply.shape), np.dtype(reply.dtype)
    if tensor._spec is None:
        tensor._spec = Spec(shape, dtype)
    return np.frombuffer(frames[0], dtype=dtype).reshape(shape).copy()


def move(tensor, node_index: int, device: int):
    """`tensor` on (node_index, device): same place is itself; else a copy made there."""
    if node_index == tensor._node.index and device == tensor._device:
        return tensor
    if node_index == tensor._node.index:
        return _to_device(tensor, device)
    # Between nodes: through the master until the data channel carries it directly.
    return put(fetch(tensor), node_index, device)


def _to_device(tensor, device: int):
    """A copy on another device of the same node, made on the destination device's stream."""
    from .tensor import DistributedTensor

    node = tensor._node
    stream = context.stream_for(node.index, device)
    out = DistributedTensor(node, device, next(node.ids), tensor.spec, stream)
    node.issue((wire.code(wire.Call), next(node.ids), stream, (out._id,), "to_device",
                (wire.Ref(tensor._id), device), {}))
    return out
