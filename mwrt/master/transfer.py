"""Moving bytes: master to worker (dist_send), worker to master (numpy), between places (to).

Arrays up to `MWRT_INLINE_BYTES` ride beside the command as ZeroMQ frames. Larger ones
go over the session's data channel: straight into a preallocated array on the other
side, and between two workers directly, the master only sending the two commands.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np

from .. import config
from ..arrays import as_dtype
from ..errors import ChannelError, WorkerLostError
from ..ops import Spec
from ..protocol import wire
from . import context
from .cluster import current

_PUT, _GET, _CALL = wire.code(wire.Put), wire.code(wire.Get), wire.code(wire.Call)
_SEND, _RECV = wire.code(wire.SendTo), wire.code(wire.RecvFrom)
_TRANSFER_SPACE = 3 << 56  # channel tags of transfers; collectives use spaces 0-2
_TAGS = itertools.count(1)


def put(array, node: int | None = None, device: int | None = None):
    """Copy a NumPy array from the master to (node, device); returns its DistributedTensor."""
    from .tensor import DistributedTensor

    if not isinstance(array, (np.ndarray, np.generic)):
        raise TypeError(f"dist_send: expected a NumPy array (got {type(array).__name__}); "
                        "wrap data with np.asarray first")
    array = np.asarray(array, order="C")  # keeps 0-d arrays 0-d
    as_dtype(array.dtype)
    cluster = current()
    target = cluster.node(context.current_node() if node is None else node)
    device = context.current_device() if device is None else device
    stream = context.stream_for(target.index, device)
    tensor = DistributedTensor(target, device, next(target.ids), Spec(array.shape, array.dtype),
                               stream)
    payload = array.reshape(-1).view(np.uint8) if array.size else b""
    if array.nbytes <= config.get("inline_bytes"):
        target.issue((_PUT, next(target.ids), stream, tensor._id, array.shape,
                      array.dtype.str, device, -1), frame=payload)
        return tensor
    tag = _TRANSFER_SPACE | next(_TAGS)
    target.request((_RECV, next(target.ids), stream, tensor._id, array.shape, array.dtype.str,
                    device, cluster.master_rank, tag), "posting a receive for dist_send")
    with _naming_the_node(target):
        cluster.channel().send(payload, target.index, tag)  # returns when `array` is reusable
    return tensor


def fetch(tensor) -> np.ndarray:
    """Copy a tensor's contents to the master; a sync point of the stream that made it."""
    node = tensor._node
    if tensor._spec is None or tensor.nbytes <= config.get("inline_bytes"):
        reply, frames = node.request((_GET, next(node.ids), tensor._streams[0], tensor._id),
                                     f"numpy() of tensor {tensor._id}")
        shape, dtype = tuple(reply.shape), np.dtype(reply.dtype)
        if tensor._spec is None:
            tensor._spec = Spec(shape, dtype)
        return np.frombuffer(frames[0], dtype=dtype).reshape(shape).copy()
    cluster = current()
    tag = _TRANSFER_SPACE | next(_TAGS)
    node.check_lost()
    with _naming_the_node(node):
        if tensor.nbytes > config.get("max_tensor_bytes"):  # never made: the worker says why
            out = None
        else:  # post the receive first, so the bytes land in `out`, not in a stash
            out = np.empty(tensor.shape, tensor.dtype)
            work = cluster.channel().irecv(out.reshape(-1).view(np.uint8), node.index, tag)
        try:
            # The worker answers before it sends: an error (a failed op) comes instead of bytes.
            node.request((_SEND, next(node.ids), tensor._streams[0], tensor._id,
                          cluster.master_rank, tag), f"numpy() of tensor {tensor._id}")
        except BaseException:
            if out is not None:
                work.cancel()
            raise
        if out is None:
            out = np.empty(tensor.shape, tensor.dtype)
            cluster.channel().recv(out.reshape(-1).view(np.uint8), node.index, tag)
        else:
            work.wait()
    return out


@contextlib.contextmanager
def _naming_the_node(node):
    """A broken transfer is reported as the loss of the worker, by node, not by channel rank."""
    try:
        yield
    except ChannelError as exc:
        raise WorkerLostError(f"{node}: the data channel to it broke during a transfer ({exc}); "
                              "the worker died or was stopped", node=node.index,
                              address=node.address) from exc


def move(tensor, node_index: int, device: int):
    """`tensor` on (node_index, device): same place is itself; else a copy made there."""
    from .tensor import DistributedTensor

    target = current().node(node_index)
    target.check_device(device)
    if node_index == tensor._node.index and device == tensor._device:
        return tensor
    source = tensor._node
    if node_index == source.index:
        return _to_device(tensor, device)
    stream = context.stream_for(target.index, device)
    out = DistributedTensor(target, device, next(target.ids), tensor.spec, stream)
    tag = _TRANSFER_SPACE | next(_TAGS)
    # Worker to worker over the data channel: the master only sends the two commands. A large
    # receive is posted before the send is issued, so the bytes land in place, not a stash.
    recv = (_RECV, next(target.ids), stream, out._id, tensor.shape, tensor.dtype.str, device,
            source.index, tag)
    if tensor.nbytes > config.get("inline_bytes"):
        target.request(recv, f"posting a receive for .to(node={node_index})")
    else:
        target.issue(recv + (-1,))
    source.issue((_SEND, next(source.ids), tensor._streams[0], tensor._id, target.index, tag,
                  -1))
    return out


def _to_device(tensor, device: int):
    """A copy on another device of the same node, made on the destination device's stream."""
    from .tensor import DistributedTensor

    node = tensor._node
    stream = context.stream_for(node.index, device)
    out = DistributedTensor(node, device, next(node.ids), tensor.spec, stream)
    node.issue((_CALL, next(node.ids), stream, (out._id,), "to_device", (tensor._ref, device),
                {}))
    return out
