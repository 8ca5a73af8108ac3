"""The session's data channel on a worker, and its process groups (the commands that use them
are in data_commands.py).

Node i is channel rank i and the master is the last rank. The channel is made when the
master's Join arrives, on a thread of its own (a store that cannot be reached must not
stall the daemon's socket thread, nor its other masters): it connects to the master's
store, listens on the address that routes to it, publishes that, and answers the Join,
so a master learns at init, by name, what a worker could not reach. Only ranks holding
the cluster's HMAC key (the worker's key file) can connect.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import numpy as np

from .. import arrays, channels, staging
from ..collective.group import ProcessGroup
from ..errors import ChannelError, ChannelTimeoutError, QuotaError
from ..netaddr import split_host_port
from ..protocol import wire
from ..store import TCPStore
from .pool import ReceivePool
from .tensors import check_size

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
