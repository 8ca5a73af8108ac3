"""The stream commands over the session's data channel: SendTo and RecvFrom (a tensor to or
from another rank) and Collective (a collective over a group of the session's ranks, on the
GPU's own library where it has one). The channel and its groups are the session's (data.py).
"""

from __future__ import annotations

import math

import numpy as np

from .. import arrays, staging
from ..channels.nccl import NcclUnsupportedError
from ..collective import api as collectives
from ..collective.reduce_ops import ReduceOp
from ..errors import ChannelError
from ..protocol import wire
from .data import SessionData
from .tensors import PoisonedInput, check_size, resolve, store


def _abort(group) -> None:
    """This node cannot take part: run a different collective in its place, so the other
    nodes' agreement check fails at once, naming this node, instead of waiting out the
    channel timeout for data that will never come."""
    try:
        collectives.barrier(group)
    except Exception:  # noqa: BLE001, S110 - the mismatch it provokes is the point; our
        pass  # own error is raised


def _data(ex) -> SessionData:
    data = ex.session.data
    if data is None:
        raise ChannelError(f"node {ex.session.node}: this session has no data channel (the "
                           "master sent no Join)")
    return data


def send_to(ex, cmd, frames):
    if cmd.token >= 0 and ex.raise_sticky(cmd.token):
        return  # the master asked (numpy()): it gets the stream's error instead of bytes
    try:
        if ex.error is not None:
            raise PoisonedInput(ex.error)
        array = resolve(ex, wire.Ref(cmd.ref))
        staged = type(array) is not np.ndarray or staging.chunked(cmd.tag)
        if not staged:
            array = np.asarray(arrays.to_host(array), order="C")
    except Exception:  # a poisoned input, or one never made here (its op failed and a sync
        # cleared the stream's error): another worker waits, so tell it now that nothing comes
        if cmd.token < 0:
            _data(ex).get_channel().send(b"", cmd.peer, cmd.tag)
        raise
    if cmd.token >= 0:
        ex.reply(wire.Done(cmd.token, None))  # the master posts its receive on this answer
    # Counted as it leaves, not after: its receiver may read the totals once the bytes arrive.
    ex.bytes_out += array.nbytes
    if staged:  # from a GPU (or to one): chunks that overlap their copies, via pinned memory
        staging.send_array(_data(ex).get_channel(), array, cmd.peer, cmd.tag,
                           getattr(ex, "cuda_stream", None))
    else:
        _data(ex).get_channel().send(array.reshape(-1).view(np.uint8), cmd.peer, cmd.tag)


def recv_from(ex, cmd, frames):
    data = _data(ex)
    posted = data.posted.pop(cmd.id, None)
    if staging.staged(cmd):
        value = _recv_staged(ex, cmd, data, posted)
        ex.bytes_in += value.nbytes
        store(ex, cmd.out, value)
        return
    try:
        if isinstance(posted, tuple):  # its receive was posted as the command arrived
            host, work = posted
            work.wait(data.get_channel().timeout)
        else:
            dtype = np.dtype(cmd.dtype)
            check_size(cmd.shape, dtype, "recv", ex.session.tensors)
            host = data.pool.empty(cmd.shape, dtype)
            data.get_channel().recv(host.reshape(-1).view(np.uint8), cmd.peer, cmd.tag)
        ex.bytes_in += host.nbytes
    except ChannelError as exc:
        raise _nothing_sent(ex, cmd, exc) from None
    store(ex, cmd.out, host if ex.device == arrays.HOST else ex.xp.asarray(host))


def _recv_staged(ex, cmd, data, posted):
    """A RecvFrom with a GPU at one end: its chunks, copied to the device as they come."""
    channel = data.get_channel()
    try:
        if posted is None:
            check_size(cmd.shape, np.dtype(cmd.dtype), "recv", ex.session.tensors, cmd.device)
            posted = staging.Receive(channel, cmd.shape, cmd.dtype, cmd.device, cmd.peer,
                                     cmd.tag)
        return posted.finish(ex.xp, getattr(ex, "cuda_stream", None), channel.timeout)
    except ChannelError as exc:
        raise _nothing_sent(ex, cmd, exc) from None


def _nothing_sent(ex, cmd, exc: ChannelError) -> ChannelError:
    """A receive that got an empty message where bytes were due: the sender's op failed."""
    if "got 0 bytes" in str(exc) and math.prod(cmd.shape):
        return ChannelError(f"node {ex.session.node}: rank {cmd.peer} sent nothing for tag "
                            f"{cmd.tag}: the op that made the tensor failed there, and its "
                            "error is raised at that node's next sync point")
    return exc


_IN_PLACE = {"all_reduce": collectives.all_reduce, "broadcast": collectives.broadcast,
             "reduce": collectives.reduce}


def collective(ex, cmd, frames):
    data = _data(ex)
    group = data.gpu_group(cmd.group, cmd.ranks, ex.device) or data.group(cmd.group, cmd.ranks)
    before = getattr(group, "current", None)  # the call it is in, once it begins
    try:
        _collective(ex, cmd, data, group)
    except Exception:
        if getattr(group, "current", None) is before:
            # It failed here before its call began (a poisoned stream, a size over quota, a
            # bad buffer): its peers wait in that call, so fail them now.
            _abort(group)
        raise


def _collective(ex, cmd, data, group) -> None:
    if ex.error is not None:
        raise PoisonedInput(ex.error)
    array = resolve(ex, wire.Ref(cmd.ref)) if cmd.ref >= 0 else None
    if cmd.out >= 0:  # an oversized result fails here, and its peers at once
        check_size(cmd.out_shape, np.dtype(cmd.args.get("dtype")), cmd.kind,
                   ex.session.tensors, ex.device)
    args = dict(cmd.args)
    if "op" in args:
        args["op"] = ReduceOp[args["op"]]
    kind = cmd.kind
    in_place = _IN_PLACE.get(kind)
    if array is not None:  # the payload, for `mwrt status` (the algorithm's traffic varies)
        ex.bytes_out += array.nbytes
    if in_place is not None:
        work = _c_order(array, writes=True)
        try:
            in_place(group, work, **args)
        except NcclUnsupportedError:  # on every node alike, after the call check: together,
            in_place(data.group(cmd.group, cmd.ranks), work, **args)  # stage through host
        if work is not array and array is not None:  # a strided view (a block's columns)
            array[...] = work
        ex.bytes_in += array.nbytes if array is not None else 0
        return
    dtype = args.pop("dtype")
    xp = ex.xp if group.device_buffers else np  # nccl: results stay on the GPU
    out = _warm(ex, xp, cmd.out_shape, dtype) if cmd.out >= 0 else None
    if kind == "all_gather":
        collectives.all_gather(group, out, _c_order(array))
    elif kind == "gather":
        collectives.gather(group, _c_order(array), out, **args)
    elif kind == "scatter":
        collectives.scatter(group, out, _c_order(array), **args)
    elif kind == "reduce_scatter":
        try:
            out = _reduce_scatter(ex, group, array, out, xp, args["op"])
        except NcclUnsupportedError:  # every node alike, after the call check: host staging
            host = np.empty(cmd.out_shape, dtype)
            out = _reduce_scatter(ex, data.group(cmd.group, cmd.ranks), array, host, np,
                                  args["op"])
    else:
        raise ValueError(f"collective: unknown kind {kind!r}")
    if out is not None:
        ex.bytes_in += out.nbytes
        if ex.device != arrays.HOST and type(out) is np.ndarray:  # staged through the host
            out = ex.xp.asarray(out)
        store(ex, cmd.out, out)


def _c_order(array, writes: bool = False):
    """`array` where it is C-contiguous (the collectives move flat buffers), else a
    C-contiguous copy; one that `writes` must be writable, as the result goes back in it."""
    flags = getattr(array, "flags", None)
    if flags is None or flags.c_contiguous:  # None: no array; torch's tensors are checked
        return array  # by the collective
    if writes and not flags.writeable:
        raise ValueError(f"collective: array is read-only (shape {array.shape}): a "
                         "broadcast_to view, or NumPy's own read-only memory; pass a copy "
                         "(t.copy())")
    return array.copy(order="C")  # NumPy's and CuPy's


def _reduce_scatter(ex, group, array, out, xp, op):
    """`array` (n rows) combined over the group into `out`, this rank's part of the rows as
    np.array_split cuts them. Uneven parts travel padded to the longest (part p at row
    p * ceil(n / size), its missing rows zero), so a native collective serves them too."""
    size, n = group.size, array.shape[0]
    top = -(-n // size)
    whole, source = out, array
    if n != top * size or not array.flags.c_contiguous:  # uneven, or a strided view (moveaxis)
        source = _warm(ex, ex.xp, (top * size, *array.shape[1:]), array.dtype)
        for p in range(size):
            lo = p * (n // size) + min(p, n % size)  # np.array_split's bounds
            hi = lo + n // size + (p < n % size)
            source[p * top:p * top + hi - lo] = array[lo:hi]
            source[p * top + hi - lo:(p + 1) * top] = 0
        if n != top * size:
            whole = _warm(ex, xp, (top, *out.shape[1:]), out.dtype)
    collectives.reduce_scatter(group, whole, source, op)
    return whole if whole is out else whole[:out.shape[0]]


def _warm(ex, xp, shape, dtype):
    """An empty array of `xp`: in host memory, from the session's warm pool (a fresh one
    faults on every page as it is first written)."""
    return _data(ex).pool.empty(shape, dtype) if xp is np else xp.empty(shape, dtype)
