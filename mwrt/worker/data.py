"""The session's data channel on a worker: transfers to and from other ranks, and collectives.

Node i is channel rank i and the master is the last rank. The channel is made when the
master's Join arrives, on a thread of its own (a store that cannot be reached must not
stall the daemon's socket thread, nor its other masters): it connects to the master's
store, listens on the address that routes to it, publishes that, and answers the Join,
so a master learns at init, by name, what a worker could not reach. Only ranks holding
the cluster's HMAC key (the worker's key file) can connect.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading

import numpy as np

from .. import arrays, channels, staging
from ..channels.nccl import NcclUnsupportedError
from ..collective import api as collectives
from ..collective.group import ProcessGroup
from ..collective.reduce_ops import ReduceOp
from ..errors import ChannelError, ChannelTimeoutError, QuotaError
from ..netaddr import split_host_port
from ..protocol import wire
from ..store import TCPStore
from .pool import ReceivePool
from .tensors import PoisonedInput, check_size, resolve, store

log = logging.getLogger("mwrt.worker")


class SessionData:
    """A session's channel, store and process groups, opened by start() and closed with it."""

    def __init__(self, session, join: wire.Join):
        self.session, self.join = session, join
        self.lock = threading.Lock()
        self.store: TCPStore | None = None
        self.channel: channels.DataChannel | None = None
        self.error: Exception | None = None
        self.ready = threading.Event()
        self.groups: dict[int, ProcessGroup] = {}
        # RecvFrom command id -> (array, Work), or a staged receive's chunks (a GPU's).
        self.posted: dict[int, tuple[np.ndarray, channels.Work] | staging.Receive] = {}
        self.gpu_groups: dict[int, ProcessGroup | None] = {}  # group id -> over nccl, or None
        self.pool = ReceivePool(session.tensors)  # warm destinations for large receives

    def start(self) -> None:
        """Join the data channel on a thread of its own; it answers the Join when done."""
        threading.Thread(target=self._join, daemon=True,
                         name=f"mwrt-join-{self.session.node}").start()

    def _join(self) -> None:
        try:
            self._open()
            answer: wire.Reply = wire.Done(self.join.token, None)
        except Exception as exc:  # noqa: BLE001 - any failure is the Join's answer
            self.error = exc if isinstance(exc, ChannelError) else ChannelError(
                f"node {self.session.node}: cannot open its data channel ({exc})")
            log.warning("session %s: %s", self.session.id, self.error)
            answer = wire.Failed(self.join.token, {"kind": "channel", "message": str(self.error)})
        finally:
            self.ready.set()
            self.session.daemon.joins.release()  # taken by control.join for this thread
        sock = self.session.daemon.reply_socket()
        try:
            wire.send(sock, self.session.identity, answer)
        finally:
            sock.close(linger=1000)

    def _open(self) -> None:
        host, port = split_host_port(self.join.store, "Join: the master's store")
        keys = self.session.daemon.keys  # the cluster's HMAC key admits us to the store too
        try:
            store = TCPStore(host, port, timeout=self.join.timeout,
                             key=keys.hmac_key if keys else None)
        except Exception as exc:  # noqa: BLE001 - _unreachable names any failure to reach it
            raise self._unreachable(exc) from None
        try:
            channel = channels.create(
                self.join.channel, self.session.node, self.join.world, store=store,
                prefix=self.join.prefix, key=keys.hmac_key if keys else None)
        except BaseException:
            store.close()
            raise
        with self.lock:
            self.store, self.channel = store, channel
            closed = self.session.closed
        if closed:  # the session ended while we joined: nobody else will close these
            self.close()

    def _unreachable(self, exc: Exception) -> ChannelError:
        """A Join that failed, named: where the store is, where we are, and the fix."""
        here = socket.gethostname()
        listen = split_host_port(self.session.daemon.address, "listen")[0]
        if listen not in ("0.0.0.0", "::", "*"):
            here = f"{here} ({listen})"
        return ChannelError(
            f"node {self.session.node}: cannot reach the master's data channel store at "
            f"{self.join.store} from {here} ({type(exc).__name__}: {exc}); set MWRT_MASTER_ADDR "
            "or MWRT_IFNAME on the master to an address this worker can reach")

    def get_channel(self) -> channels.DataChannel:
        """The channel, once joined; the join's error if it failed."""
        return self._joined()[0]

    def _joined(self) -> tuple[channels.DataChannel, TCPStore]:
        if not self.ready.wait(self.join.timeout + 5.0):
            raise ChannelTimeoutError(f"node {self.session.node}: still joining the master's "
                                      f"data channel at {self.join.store}")
        if self.error is not None:
            raise self.error
        channel, store = self.channel, self.store
        if channel is None or store is None:
            raise ChannelError(f"node {self.session.node}: the session's data channel is "
                               "closed (the session ended)")
        return channel, store

    def refusal(self, cmd: wire.RecvFrom) -> str:
        """Why a receive may not be posted at all ('' if it may): its array would exceed
        MWRT_MAX_TENSOR_BYTES or the session's quota. The sender is told before any byte
        leaves, so nothing arrives that nobody receives, and the channel stays whole."""
        try:
            check_size(cmd.shape, np.dtype(cmd.dtype), "dist_send", self.session.tensors,
                       cmd.device)
        except (MemoryError, QuotaError) as exc:
            return str(exc)
        except (TypeError, ValueError):
            return ""  # a malformed command: the stream's attempt fails and says why
        return ""

    def post(self, cmd: wire.RecvFrom) -> None:
        """Post a RecvFrom's receive as soon as it arrives (socket thread), so the bytes land
        in their array at once instead of a stash, even while the stream is still busy."""
        if self.channel is None:  # still joining (or failed): the stream's attempt waits
            return
        if staging.staged(cmd):  # a GPU at one end: chunks, through pinned buffers
            try:
                check_size(cmd.shape, np.dtype(cmd.dtype), device=cmd.device)
                self.posted[cmd.id] = staging.Receive(self.channel, cmd.shape, cmd.dtype,
                                                      cmd.device, cmd.peer, cmd.tag)
            except Exception:  # noqa: BLE001, S110 - the stream's own attempt reports it
                pass
            return
        try:
            dtype = np.dtype(cmd.dtype)
            check_size(cmd.shape, dtype)
            host = self.pool.empty(cmd.shape, dtype)
            work = self.channel.irecv(host.reshape(-1).view(np.uint8), cmd.peer, cmd.tag)
        except Exception:  # noqa: BLE001 - the stream's own attempt will fail and say why
            return
        self.posted[cmd.id] = (host, work)

    def group(self, group_id: int, ranks: tuple) -> ProcessGroup:
        """The process group of `ranks` (node numbers), one per group id. The master numbers
        a group per set of (node, stream) pairs (mwrt.master.collectives), so one stream's
        executor runs a group's collectives here, in its order; a group would also bear two
        threads (its calls keep their own state), but not their order."""
        channel = self.get_channel()
        with self.lock:
            group = self.groups.get(group_id)
            if group is None:
                group = self.groups[group_id] = ProcessGroup(channel, list(ranks),
                                                             group_id=group_id)
            return group

    def peer_lost(self, rank: int, why: str) -> None:
        """Transfers from node `rank` fail now, and so does every collective of a group it
        belongs to, on whichever survivor its call waits: those would otherwise wait for
        peers that wait on the dead node, until their timeout, and then name a survivor."""
        with self.lock:
            channel, groups = self.channel, list(self.groups.values())
        if channel is None:
            return
        channel.fail_peer(rank, why)
        for group in groups:
            if rank in group.ranks:
                group.abort(rank, why)

    def gpu_group(self, group_id: int, ranks: tuple, device: int) -> ProcessGroup | None:
        """For a collective over GPU tensors: a group over an nccl channel of its own among
        `ranks`, if every one of them can run NCCL on its tensor's GPU (they say so through
        the session's store, so all decide alike); None: the session's channel, which
        stages GPU tensors through host memory."""
        with self.lock:
            if group_id in self.gpu_groups:
                return self.gpu_groups[group_id]
        _, store = self._joined()
        node, key = self.session.node, f"{self.join.prefix}/nccl/{group_id}"
        mine = _nccl_gpu(device)
        store.set(f"{key}/gpu/{node}", mine or "")
        keys = [f"{key}/gpu/{r}" for r in ranks]
        group = None
        usable = bool(mine)
        if usable:  # a node that cannot needs no answer: the others learn it from its key
            store.wait(keys, timeout=self.join.timeout)
            gpus = [store.get(k) for k in keys]
            # NCCL refuses two ranks on one GPU (local workers sharing a host's only one).
            usable = all(gpus) and len(set(gpus)) == len(gpus)
        if usable:
            channel = channels.create("nccl", list(ranks).index(node), len(ranks),
                                      store=store, prefix=key, timeout=self.join.timeout)
            group = ProcessGroup(channel)
        with self.lock:
            self.gpu_groups[group_id] = group
        return group

    def close(self) -> None:
        with self.lock:
            closeables, self.channel, self.store = (self.channel, self.store), None, None
            gpu = [g.channel for g in self.gpu_groups.values() if g is not None]
            self.gpu_groups.clear()
            self.groups.clear()  # they hold the channel, and received arrays wait in posted
            self.posted.clear()
        self.pool.close()
        if gpu:  # NCCL's destroy may wait for its peers: never on the daemon's thread
            threading.Thread(target=_close_all, args=(gpu,), daemon=True,
                             name=f"mwrt-nccl-close-{self.session.node}").start()
        _close_all(closeables)


def _close_all(closeables) -> None:
    for closeable in closeables:
        if closeable is not None:
            try:
                closeable.close()
            except Exception:  # noqa: BLE001, S110 - a peer gone must not stop the close
                pass


def _nccl_gpu(device: int) -> str | None:
    """What names GPU `device` among the session's (host and PCI bus), if this node can run
    a collective over NCCL on it; else None."""
    if device == arrays.HOST:
        return None
    from ..channels.nccl import nccl_module

    try:
        nccl_module()
        bus = getattr(arrays.namespace(device).cuda.Device(device), "pci_bus_id", None)
    except Exception:  # noqa: BLE001 - no NCCL, or a GPU that cannot be asked: the session's
        return None  # channel serves
    where = bus or f"{os.getpid()}/{device}"  # the fake GPU has no bus: a process's own
    return f"{socket.gethostname()}/{where}"


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
    if staged:  # from a GPU (or to one): chunks that overlap their copies, via pinned memory
        staging.send_array(_data(ex).get_channel(), array, cmd.peer, cmd.tag,
                           getattr(ex, "cuda_stream", None))
    else:
        _data(ex).get_channel().send(array.reshape(-1).view(np.uint8), cmd.peer, cmd.tag)
    ex.bytes_out += array.nbytes


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
        raise _nothing_sent(ex, cmd, exc, host.nbytes) from None
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
        nbytes = math.prod(cmd.shape) * np.dtype(cmd.dtype).itemsize
        raise _nothing_sent(ex, cmd, exc, nbytes) from None


def _nothing_sent(ex, cmd, exc: ChannelError, nbytes: int) -> ChannelError:
    """A receive that got an empty message where bytes were due: the sender's op failed."""
    if "got 0 bytes" in str(exc) and nbytes:
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
