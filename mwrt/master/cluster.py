"""init_master_worker() and shutdown(): the Cluster of Nodes a master script drives."""

from __future__ import annotations

import atexit
import hashlib
import itertools
import logging
import os
import resource
import socket
import threading
import uuid
import weakref
from collections.abc import Sequence

import numpy as np
import zmq

from .. import channels, config, procs
from ..errors import ConfigError, MwrtError
from ..netaddr import advertise_address, join_host_port, resolve, split_host_port
from ..procs import deaf_to_ctrl_c
from ..protocol import auth, wire
from ..store import TCPStore
from ..store.daemon_registry import wait_for as wait_for_workers
from . import replacement, waits
from .client import Node
from .heartbeat import Heartbeat
from .local import LocalWorker, start_local_workers, stop_all
from .sites import SITES

log = logging.getLogger("mwrt")

_cluster: Cluster | None = None
_lock = threading.Lock()
_HELPERS_BOUND = 10.0  # seconds shutdown waits at most for a call a Ctrl-C left to its helper
_exited = False  # the session ended as the program exits (the at-exit shutdown)


class Cluster:
    """Everything one master holds: its nodes, local daemons, heartbeat and generator."""

    def __init__(self, addresses: list[str], local: list[LocalWorker], timeout: float,
                 keys=None, channel: str | None = None, session: str | None = None):
        self.keys = keys  # the master's KeyFile, or None for unkeyed loopback daemons
        # A named session keeps its id from one master to the next, and the workers keep it
        # for MWRT_SESSION_GRACE seconds after its master is gone, to be re-attached.
        self.session_name = session
        self.grace = config.get("session_grace") if session else 0.0
        self.worker_keys = None  # the local daemons' key, kept to start a replacement
        # Without a grace there is nothing to re-attach to: a fresh id, as for any session.
        self.session_id = _named_id(session, keys) if self.grace > 0 else uuid.uuid4().hex
        # The workers know this master's connections by a nonce of its own: no other master,
        # even one with the key and the session's name, can speak or keep the session alive.
        self.connection_id = f"{self.session_id}/{uuid.uuid4().hex}"
        self.pid = os.getpid()  # the process whose session it is (a fork's child is not)
        self.master_name = f"{socket.gethostname()}:{self.pid}"
        self.context = _context_for(len(addresses))
        self.local = local
        self.ids = itertools.count(1)  # command and tensor ids, shared by every node
        self.sites: list = [None] * SITES  # the line that issued each of them (by id)
        # A local daemon is reached on its Unix socket (LocalWorker.route), any other by tcp.
        routes = {worker.address: worker.route for worker in local}
        self.nodes = [Node(self, i, address, routes.get(address))
                      for i, address in enumerate(addresses)]
        self.rng = np.random.default_rng()
        self.attached: dict | None = None  # handles of a re-attached session (reattach.py)
        self.meshes: weakref.WeakSet = weakref.WeakSet()  # meshes over these nodes
        self._channel_lock = threading.Lock()
        # Commands that make nodes wait on each other (a move's receive and send, the parts of
        # a collective) are issued under it, so every node queues them in one order: two
        # threads' moves, interleaved, left each node's stream in a receive whose send was
        # queued behind the other's, and two collectives of one group took each other's turn.
        self.pairing = threading.RLock()
        self.store: TCPStore | None = None
        self._channel: channels.DataChannel | None = None
        try:
            for node in self.nodes:
                node.connect(timeout)
            resumed_streams = [s for n in self.nodes if n.resumed for s in n.resumed["streams"]]
            self.stream_ids = itertools.count(max([wire.DEFAULT_STREAM_LIMIT - 1,
                                                   *resumed_streams]) + 1)
            self._join_data_channel(timeout, channel or config.get("channel"))
        except BaseException:
            self.close(goodbye=False)
            raise
        self.heartbeat = Heartbeat(self)
        self.heartbeat.start()

    def _join_data_channel(self, timeout: float, name: str) -> None:
        """Serve the rendezvous store and have every node join the data channel; a node that
        cannot reach the store fails here, naming itself and the address."""
        channels.get(name)  # an unknown name fails here, naming the known ones
        self.channel_name = name
        # Each node is told the master's address on the route to it; one store serves all.
        given = config.get("master_addr")
        toward = [given or advertise_address(split_host_port(n.address)[0]) for n in self.nodes]
        bind = toward[0] if len(set(toward)) == 1 else "0.0.0.0"
        store = self.store = TCPStore(toward[0], 0, len(self.nodes) + 1, is_master=True,
                                      bind=bind, key=self.keys.hmac_key if self.keys else None)
        tokens = []
        for node, host in zip(self.nodes, toward):
            tokens.append(next(node.tokens))
            node.issue(wire.Join(id=next(node.ids), store=join_host_port(host, store.port),
                                 prefix=self.session_id, world=len(self.nodes) + 1, channel=name,
                                 timeout=timeout, token=tokens[-1]))
            node.flush()
        failed = []
        for node, token in zip(self.nodes, tokens):  # the worker answers within `timeout`
            try:  # every answer is read, so none is left behind when one node fails
                node.wait(token, "joining the data channel", timeout + 5.0)
            except Exception as exc:  # noqa: BLE001 - the first is raised once all are read
                failed.append(exc)
        if failed:
            raise failed[0]

    @property
    def master_rank(self) -> int:
        """The master's rank in the data channel (nodes are ranks 0..N-1)."""
        return len(self.nodes)

    def channel(self):
        """The master's end of the data channel, connected on first use."""
        with self._channel_lock:
            if self._channel is None:
                self._channel = channels.create(
                    self.channel_name, self.master_rank, len(self.nodes) + 1, store=self.store,
                    prefix=self.session_id, key=self.keys.hmac_key if self.keys else None)
            return self._channel

    def node(self, index: int) -> Node:
        """Node `index`, with an error naming the valid range."""
        if not isinstance(index, int) or not 0 <= index < len(self.nodes):
            raise ValueError(f"node: no node {index!r} (this master has nodes 0.."
                             f"{len(self.nodes) - 1})")
        return self.nodes[index]

    def replace(self, index: int, address: str | None, timeout: float) -> None:
        """Put a fresh node in the place of lost node `index` (see replace_node)."""
        replacement.replace(self, index, address, timeout)


    def rejoin(self, timeout: float) -> None:
        """Every node joins a new data channel (a new store), the replacement among them."""
        with self._channel_lock:
            for closeable in (self._channel, self.store):
                if closeable is not None:
                    closeable.close()
            self._channel = self.store = None
        self._join_data_channel(timeout, self.channel_name)

    def close(self, goodbye: bool = True) -> None:
        """Say goodbye to every worker, stop the heartbeat and any local daemons. A Ctrl-C
        during the goodbyes still closes the rest: no local daemon outlives the master, and
        no socket is left open for context.term() to wait on."""
        heartbeat = getattr(self, "heartbeat", None)
        try:
            for node in self.nodes if goodbye else ():
                if node.info is not None:
                    try:
                        node.say_goodbye()
                    except Exception as exc:  # noqa: BLE001 - a dying worker must not stop it
                        log.info("%s: goodbye not sent: %s", node, exc)
            for node in self.nodes:
                node.close(goodbye=goodbye and node.info is not None)
        finally:
            for node in self.nodes:  # those the goodbyes did not reach; closed ones return
                node.close(goodbye=False)
            if heartbeat is not None:
                heartbeat.stop()
            for closeable in (self._channel, self.store):
                if closeable is not None:
                    closeable.close()
            stop_all(self.local)
            self.context.term()


def _named_id(name: str | None, keys) -> str:
    """The session id of a named session: the same for every master with its name and key."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"init_master_worker: session must be a non-empty str (got {name!r})")
    secret = keys.hmac_key if keys is not None else b""
    return "named-" + hashlib.sha256(secret + b"\0" + name.encode()).hexdigest()[:32]


def worker_addresses(workers) -> list[str]:
    """Normalize the `workers` argument (or MWRT_WORKERS) into a list of addresses."""
    if workers is None:
        workers = config.get("workers")
    if isinstance(workers, str):
        workers = [w.strip() for w in workers.split(",") if w.strip()]
    workers = list(workers)
    for address in workers:
        host, _ = split_host_port(address, "workers")
        resolve(host, f"workers: {address}")  # an unknown name fails now, not at a timeout
    return workers


def init_master_worker(workers: str | Sequence[str] | None = None, *,
                       local_workers: int | None = None, timeout: float | None = None,
                       key: str | os.PathLike | auth.KeyFile | None = None,
                       backend: str | None = None,
                       channel: str | None = None, registry: str | None = None,
                       num_workers: int | None = None, session: str | None = None) -> None:
    """Connect to worker daemons (or start `local_workers` on loopback) and open sessions.

    `key` is the master's key file (path or auth.KeyFile; default MWRT_KEY_FILE). Local
    workers always get a fresh key pair, so only this master can reach them. `backend` (the
    proposal's name) or `channel`: the data channel of the session (default MWRT_CHANNEL).
    `registry`: a directory where `mwrt-worker --register DIR` daemons announce themselves;
    the master waits for `num_workers` of them (default MWRT_REGISTRY, MWRT_NUM_WORKERS).
    `session`: a name; the workers keep a named session for MWRT_SESSION_GRACE seconds after
    its master is gone, and a master with the same name and key re-attaches (mwrt.attached()).
    """
    global _cluster
    procs.interrupt_outside_finalizers()  # a Ctrl-C in a handle's __del__ is not lost
    timeout = config.get("connect_timeout") if timeout is None else float(timeout)
    channel = _session_channel(backend, channel)
    registry = registry or config.get("registry")
    if workers is None and registry:
        workers = wait_for_workers(registry, config.get("num_workers") if num_workers is None
                                   else num_workers, config.get("rendezvous_timeout"))
    addresses = worker_addresses(workers)
    keys = auth.as_key_file(key)
    with _lock:
        if _cluster is not None:
            raise MwrtError("init_master_worker: already initialized; call mwrt.shutdown() "
                            "first")
        local = []
        if not addresses and session is not None:
            raise ConfigError(
                f"init_master_worker: session={session!r} needs workers that outlive this "
                "master, and local workers stop with it (got no worker addresses); start "
                "daemons with `mwrt-worker --key-file KEY` and pass their addresses and key")
        if not addresses:
            count = config.get("local_workers") if local_workers is None else local_workers
            if not isinstance(count, int) or count < 1:
                raise ConfigError(f"local_workers: must be an int >= 1 (got {count!r})")
            local, keys, worker_keys = start_local_workers(count, timeout)
            addresses = [w.address for w in local]
        try:
            _cluster = Cluster(addresses, local, timeout, keys, channel, session)
            _cluster.worker_keys = worker_keys if local else None
        except BaseException:
            stop_all(local)
            raise


# What one node costs the master: ZeroMQ sockets (tx, rx, hb, monitors) and descriptors
# (those sockets' and the data channel's), measured in docs/scaling.md, with room to spare.
_SOCKETS_PER_NODE, _FDS_PER_NODE, _FDS_SPARE = 8, 16, 256


def _context_for(count: int) -> zmq.Context:
    """A ZeroMQ context with room for `count` nodes, and the open-file limit to match: the
    defaults (1,023 sockets, often 1,024 fds) stopped a master near 100-200 nodes with a
    bare 'Too many open files'."""
    need = _FDS_PER_NODE * count + _FDS_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        if raised < need:
            log.warning("init_master_worker: %d nodes want about %d open files, but this "
                        "process may open %d (ulimit -Hn); raise the hard limit if some fail",
                        count, need, raised)
    context = zmq.Context()
    context.max_sockets = max(context.max_sockets, _SOCKETS_PER_NODE * count + 64)
    return context


def _session_channel(backend: str | None, channel: str | None) -> str | None:
    """The session's channel from init_master_worker's `backend=` or `channel=`."""
    if backend and channel and backend != channel:
        raise ConfigError(f"init_master_worker: backend={backend!r} and channel={channel!r} "
                          "name the same thing; pass one")
    name = backend or channel
    if name == "mpi":
        raise ConfigError("init_master_worker: the mpi channel's ranks are the processes of one "
                          "MPI job, and the master and its daemons are not one; use tcp or auto "
                          "here (MPI carries process groups: init_process_group('mpi'))")
    return "auto" if name == "gloo" else name


def replace_node(index: int, address: str | None = None, *,
                 timeout: float | None = None) -> None:
    """After node `index` was lost, give the session a fresh node `index` at `address` (or,
    in a session that started its own workers, a new local daemon). Handles to what the lost
    node held keep raising WorkerLostError, saying so; everything else goes on."""
    timeout = config.get("connect_timeout") if timeout is None else float(timeout)
    with _lock:
        current().replace(index, address, timeout)


def shutdown() -> None:
    """Free every session, close the sockets, stop local daemons; a no-op if not initialized."""
    global _cluster
    if _cluster is not None:
        _let_helpers_finish()
    with _lock:
        cluster, _cluster = _cluster, None
    if cluster is not None:
        cluster.close()
    procs.restore_interrupt()


class OfTheSession:
    """What names one thing of this master's session (a stream, an event, a mesh): refused by
    pickle, as it means nothing in another process (it pickled as its node's sockets), and
    its own copy, as a copy would name the same thing. `_kind` and `_fix` say it."""

    _kind = ""  # "a stream of this master's session"
    _fix = ""  # "make one where it is needed (mwrt.Stream())"

    def __reduce__(self):
        raise TypeError(f"{type(self).__name__}: {self!r} cannot be pickled: it is "
                        f"{self._kind}; {self._fix}")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo: dict):
        return self


def current() -> Cluster:
    """The initialized cluster, or an error saying how to make one."""
    cluster = _cluster
    if cluster is None:
        if _exited:
            raise MwrtError("mwrt: the session ended as the program exits (mwrt.shutdown() "
                            "at exit); a thread that still uses it ends with the program")
        raise MwrtError("mwrt: not initialized; call mwrt.init_master_worker() first")
    return cluster


def is_initialized() -> bool:
    """True between init_master_worker and shutdown."""
    return _cluster is not None


def _shutdown_at_exit() -> None:
    """shutdown() as the interpreter exits, deaf to Ctrl-C: a second one there (after the
    first ended the script) cut it short with a traceback, left the session to the workers'
    lease and local daemons running. Every wait in it has its timeout."""
    global _exited
    if _cluster is None:
        return
    _exited = True
    threading.excepthook = _quiet_at_exit(threading.excepthook)
    heard = threading.Event()  # a second Ctrl-C: wait no more for the helpers
    with deaf_to_ctrl_c(heard):
        _let_helpers_finish(heard)
        if not _detach():
            shutdown()


def _quiet_at_exit(previous):
    """threading.excepthook for the exit: only daemon threads run then, and one whose mwrt
    call the shutdown ended (session ended) ends quietly, as the exit ends it a moment later;
    it printed a traceback of the shutdown's internals, though the program had succeeded."""
    def hook(args) -> None:
        if not issubclass(args.exc_type, MwrtError):
            previous(args)
    return hook


def _let_helpers_finish(heard: threading.Event | None = None) -> None:
    """Before any Bye, let the calls a Ctrl-C left to their helpers (waits.uninterrupted: a
    collective's parts, a transfer) send the rest: a part that came after the Bye found no
    session on its worker, which was reported lost. Bounded; `heard` set ends it sooner."""
    bound = min(config.get("sync_timeout"), _HELPERS_BOUND)
    for call in waits.finish_uninterrupted(bound, heard):
        why = "a second Ctrl-C" if heard is not None and heard.is_set() else f"after {bound:g} s"
        log.warning("shutdown: stopped waiting for %s to send the rest of its commands (%s); "
                    "its nodes drop what comes after their Bye", call, why)


def _detach() -> bool:
    """At exit, leave a named session with a grace to its workers (no Bye): True if so."""
    global _cluster
    with _lock:
        if _cluster is None or _cluster.grace <= 0:
            return False
        cluster, _cluster = _cluster, None
    for node in cluster.nodes:  # what the script issued last (names) reaches the session:
        if node.lost is None:  # the sockets close without lingering
            try:
                node.request(wire.Query(id=next(node.ids), stream=0, token=next(node.tokens)),
                             "leaving the named session", timeout=5.0)
            except Exception as exc:  # noqa: BLE001 - a dying worker must not stop the exit
                log.info("%s: not confirmed before leaving: %s", node, exc)
    cluster.close(goodbye=False)
    return True


def _forget_in_child() -> None:
    """In a child of os.fork() (multiprocessing's fork, a Pool's worker): leave the parent's
    session alone. Without, the child's exit ran shutdown() on the parent's sockets: its Bye
    ended the parent's session and stopped its local daemons, and the child spun forever
    waiting for a reply that went to the parent. Its handles now raise an error naming the
    fork, and the child may open a session of its own."""
    global _cluster, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    cluster, _cluster = _cluster, None
    if cluster is not None:
        for node in cluster.nodes:
            node.forget()


atexit.register(_shutdown_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)
