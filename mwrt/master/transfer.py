"""Moving bytes: master to worker (send, for dist_send), worker to master (numpy), between
places (to).

Arrays up to `MWRT_INLINE_BYTES` ride beside the command as ZeroMQ frames. Larger ones
go over the session's data channel: straight into a preallocated array on the other
side, and between two workers directly, the master only sending the two commands.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import os
import socket
from typing import Any

import numpy as np

from .. import config, staging
from ..arrays import HOST
from ..channels import Work, segments
from ..errors import ChannelError, WorkerLostError
from ..ops import Spec, torchspec
from ..protocol import values, wire
from . import context, inplace, ordering
from .cluster import current
from .sites import issue_site
from .waits import uninterrupted

_TAGS = itertools.count(1)  # the low bits of transfer tags, in the space wire.TRANSFER_TAGS

def send(tensor, array: np.ndarray) -> None:
    """Copy NumPy `array` (C-contiguous) from the master into the new one-place `tensor`,
    made for it by the caller (dist_send) with its shape and dtype."""
    target, device, stream = tensor._node, tensor._device, ordering.made_on(tensor)
    payload = array.reshape(-1).view(np.uint8) if array.size else b""
    if wire.rides_inline(array.nbytes):
        target.issue(wire.Put(id=next(target.ids), stream=stream, out=tensor._id,
                              shape=array.shape, dtype=array.dtype.str, device=device, frame=-1),
                     frame=payload)
        return
    cluster = current()
    tag = staging.tag_for(wire.TRANSFER_TAGS | next(_TAGS), array.nbytes, device != HOST)
    post = wire.RecvFrom(id=next(target.ids), stream=stream, out=tensor._id, shape=array.shape,
                         dtype=array.dtype.str, device=device, peer=cluster.master_rank,
                         tag=tag, token=next(target.tokens))
    # On a helper thread: a Ctrl-C must not leave a receive posted for bytes never sent, or
    # half of them, which would stall the worker's stream until the channel timeout.
    uninterrupted(_deliver, target, post, issue_site(), cluster.channel(), array, payload)


def _deliver(target, post: wire.RecvFrom, site, channel, array, payload) -> None:
    """Have the worker post its receive, then send the bytes: both, or neither."""
    target.issue(post, site=site)
    target.wait(post.token, "posting a receive for dist_send")
    with _naming_the_node(target):
        if staging.chunked(post.tag):  # to a GPU: chunks, which it copies as the next comes
            staging.send_array(channel, array, target.index, post.tag)
        else:
            channel.send(payload, target.index, post.tag)  # returns: `array` reusable


# The value that came with the last shape asked of a small data-dependent result: (tensor
# id, the command id drawn then, bytes, Spec). It serves the read that follows, if no
# command was issued in between (none could have changed it).
_READ_AHEAD: list = [None]


def keep_read_ahead(tensor, frame, spec: Spec) -> None:
    """Keep `tensor`'s value, which came with its shape, for the read that may follow."""
    _READ_AHEAD[0] = (tensor._id, next(tensor._node.ids), frame, spec)


def read_ahead(tensor) -> np.ndarray | None:
    """The value of `tensor` that came with its shape, if nothing was issued since; once."""
    kept = _READ_AHEAD[0]
    if kept is None or kept[0] != tensor._id:
        return None
    _READ_AHEAD[0] = None
    if next(tensor._node.ids) != kept[1] + 1:
        return None
    return np.frombuffer(kept[2], dtype=kept[3].dtype).reshape(kept[3].shape).copy()


def fetch(tensor) -> np.ndarray:
    """Copy a tensor's contents to the master; a sync point of the stream that made it."""
    node = tensor._node
    spec = tensor._spec
    if spec is None or math.prod(spec.shape) * spec.dtype.itemsize <= node.inline_bytes:
        if _READ_AHEAD[0] is not None and (ahead := read_ahead(tensor)) is not None:
            return ahead
        stream = ordering.read_stream(tensor)  # its events first: ids rise in issue order
        token = next(node.tokens)
        # The op that made it, still in the batch, answers with the value: one command. Not
        # while a graph captures, which refuses the read (a Get) by name.
        if not (node.batch and not ordering.capture
                and node.send_with_read(tensor._id, stream, token)):
            node.issue(wire.Get(id=next(node.ids), stream=stream, ref=tensor._id, token=token))
        reply, frames = node.wait(token, f"numpy() of tensor {tensor._id}")
        shape, dtype = tuple(reply.shape), values.dtype_of(reply.dtype)
        if tensor._spec is None:
            tensor._spec = Spec(shape, dtype)
        return np.frombuffer(frames[0], dtype=dtype).reshape(shape).copy()
    node.check_lost()
    if tensor._device == HOST and tensor.nbytes <= config.get("max_tensor_bytes"):
        got = inplace.read(tensor, ordering.read_stream(tensor))  # a worker on this host
        if got is not None:
            return got
    cluster = current()
    tag = staging.tag_for(wire.TRANSFER_TAGS | next(_TAGS), tensor.nbytes,
                          tensor._device != HOST)
    work: staging.Receive | Work
    with _naming_the_node(node):
        if tensor.nbytes > config.get("max_tensor_bytes"):  # never made: the worker says why
            out = None
        elif staging.chunked(tag):  # from a GPU: every chunk's receive posted into `out`
            work = staging.Receive(cluster.channel(), tensor.shape, tensor.dtype, HOST,
                                   node.index, tag)
            out = work.out
        else:  # post the receive first, so the bytes land in `out`, not in a stash
            out = np.empty(tensor.shape, tensor.dtype)
            work = cluster.channel().irecv(out.reshape(-1).view(np.uint8), node.index, tag)
        try:
            # The worker answers before it sends: an error (a failed op) comes instead of bytes.
            stream = ordering.read_stream(tensor)
            send = wire.SendTo(id=next(node.ids), stream=stream, ref=tensor._id,
                               peer=cluster.master_rank, tag=tag, token=next(node.tokens))
            node.request(send, f"numpy() of tensor {tensor._id}")
        except KeyboardInterrupt:
            raise  # the bytes may be on their way: the posted receive takes them, then goes
        except BaseException:
            if out is not None:
                work.cancel()  # nothing will come
            raise
        if out is None:
            out = np.empty(tensor.shape, tensor.dtype)
            cluster.channel().recv(out.reshape(-1).view(np.uint8), node.index, tag)
        elif isinstance(work, staging.Receive):  # from a GPU, in chunks
            work.finish()
        else:
            work.wait()
    return out


def share(tensor) -> np.ndarray:
    """A read-only view of a tensor's value in shared memory its worker filled: no copy on
    the master, for a worker on this host; the memory goes when the array (and every view
    of it) does. A sync point of the stream that made it, as fetch()."""
    node = tensor._node
    here = socket.gethostname()
    if node.info is not None and node.info.hostname != here:
        raise ValueError(_NOT_SHARED.format(node=node.index, host=node.info.hostname,
                                            here=here))
    stream = ordering.read_stream(tensor)
    command = wire.Share(id=next(node.ids), stream=stream, ref=tensor._id,
                         token=next(node.tokens))
    reply, _ = node.request(command, f"numpy(copy=False) of tensor {tensor._id}")
    shape, dtype = tuple(reply.value["shape"]), np.dtype(reply.value["dtype"])
    path = os.path.join(segments.DIR, reply.value["name"])
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # the worker's /dev/shm is not ours (its session ends it)
        raise ValueError(_NOT_SHARED.format(node=node.index, host=node.info.hostname
                                            if node.info else "?", here=here)) from None
    try:
        os.unlink(path)  # mapped from here on: nothing stays in /dev/shm
        count = math.prod(shape)
        mapped = mmap.mmap(fd, max(count * dtype.itemsize, 1), flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    if tensor._spec is None:
        tensor._spec = Spec(shape, dtype)
    return np.frombuffer(mapped, dtype=dtype, count=count).reshape(shape)


_NOT_SHARED = ("numpy(copy=False): node {node} shares no memory with this master (its worker "
               "is on {host}, this master on {here}); read it with .numpy(), which copies")


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
    target = current().node(node_index)
    target.check_device(device)
    if node_index == tensor._node.index and device == tensor._device:
        return tensor
    source = tensor._node
    if node_index == source.index:
        return _to_device(tensor, device)
    source.check_open()  # before the receive is posted: it would wait for bytes never sent
    with current().pairing:  # the receive and the send in one order on every node
        return _move(tensor, source, target, device)


def _move(tensor, source, target, device: int):
    """move() between nodes: a receive on `target`, then the send on `source`."""
    stream = context.stream_for(target.index, device)
    out = tensor.results(target, device, next(target.ids), tensor.spec, stream)
    tag = staging.tag_for(wire.TRANSFER_TAGS | next(_TAGS), tensor.nbytes,
                          device != HOST or tensor._device != HOST)
    # Worker to worker over the data channel: the master only sends the two commands. A large
    # receive is posted before the send is issued, so the bytes land in place, not a stash.
    large = not wire.rides_inline(tensor.nbytes)
    recv = wire.RecvFrom(id=next(target.ids), stream=stream, out=out._id, shape=tensor.shape,
                         dtype=tensor.dtype.str, device=device, peer=source.index, tag=tag,
                         token=next(target.tokens) if large else -1)
    if large:
        target.request(recv, f"posting a receive for .to(node={target.index})")
    else:
        target.issue(recv)
    now = next(source.ids)
    writer = ordering.writer(tensor)  # sent from the stream that last wrote it
    ordering.use(tensor, writer, now)
    source.issue(wire.SendTo(id=now, stream=writer, ref=tensor._id,
                             peer=target.index, tag=tag, token=-1))
    return out


def _to_device(tensor, device: int):
    """A copy on another device of the same node, made on the destination device's stream."""
    node = tensor._node
    stream = context.stream_for(node.index, device)
    out = tensor.results(node, device, next(node.ids), tensor.spec, stream)
    now = next(node.ids)
    ordering.use(tensor, stream, now)
    node.issue(wire.Call(id=now, stream=stream, outs=(out._id,), op="to_device",
                         args=(tensor._ref, device), kwargs={}))
    return out


def host_array(array) -> np.ndarray:
    """A NumPy view of a host tensor of another library (torch's CPU tensors, through
    DLPack, with no copy); a TypeError naming what to pass otherwise."""
    if hasattr(array, "__dlpack__") and not hasattr(array, "__cuda_array_interface__"):
        try:
            return np.from_dlpack(array.detach() if hasattr(array, "detach") else array)
        except (TypeError, BufferError, RuntimeError) as exc:
            raise TypeError(f"dist_send: cannot view this {type(array).__name__} as a NumPy "
                            f"array ({exc}); pass it through np.asarray first") from None
    raise TypeError(f"dist_send: expected a NumPy array or a CPU tensor (got "
                    f"{type(array).__name__}); wrap data with np.asarray first, and move GPU "
                    "tensors to the host (.cpu())")


def asked_spec(tensor) -> Spec:
    """The shape and dtype of a one-place tensor, asked of its worker."""
    node = tensor._node
    meta = wire.Meta(id=next(node.ids), stream=ordering.read_stream(tensor), ref=tensor._id,
                     token=next(node.tokens))
    reply, frames = node.request(meta, f"shape of tensor {tensor._id}")
    if type(reply) is wire.Data:  # small: its bytes came too, for a read next
        spec = Spec(tuple(reply.shape), np.dtype(reply.dtype))
        keep_read_ahead(tensor, frames[0], spec)
        return spec
    if "stride" in reply.value:  # a torch tensor's metadata
        torch_spec: Any = torchspec.spec_from(reply.value)  # a torch handle's
        return torch_spec
    return Spec(tuple(reply.value["shape"]), np.dtype(reply.value["dtype"]))
