"""The master's side of the wire: one Node per worker, its sockets and its handshake.

A Node batches commands (the message classes of mwrt.protocol, never bare tuples) and sends
them on its `tx` socket (batches.py); replies arrive on its `rx` socket, read only by a thread
waiting at a sync point (replies.py). A background heartbeat thread (heartbeat.py) pings every
worker, relays events between nodes, and sends a batch that has waited too long, so work
starts even when the master issues no more.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque

import zmq

from .. import config
from ..errors import AuthError, QuotaError
from ..protocol import auth, wire
from ..protocol.lane import open_lane
from ..protocol.refusals import (
    HUNG_UP,
    MISMATCH,
    REFUSED,
    hang_up,
    listening,
    master_refusal,
    mechanism_mismatch,
    recv_monitor_message,
    why_hung_up,
)
from .limits import Limits
from .replies import Replies
from .sites import SITES

log = logging.getLogger("mwrt")

_AUTH_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                  zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_HANDSHAKE_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | sum(_AUTH_FAILURES)
_READ_SLICE_MS = 50  # a wait notices a lost worker or a refused batch within this
_CLOSE_WAIT = 5.0  # seconds close() waits for another thread's wait to let go of the socket


def dealer(context: zmq.Context, identity: bytes, address: str | None, keys=None) -> zmq.Socket:
    """A DEALER socket with `identity`, connected to `address` if given (over CURVE given
    keys)."""
    sock = context.socket(zmq.DEALER)
    if keys is not None:
        auth.connect_curve(sock, keys)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if address is not None:
        sock.connect(address)
    return sock


class Node(Replies):
    """The master's connection to one worker daemon."""

    def __init__(self, cluster, index: int, address: str, route: str | None = None):
        self.cluster, self.index = cluster, index
        self.address = address if address.startswith("tcp://") else f"tcp://{address}"
        # Where the sockets connect: the daemon's Unix socket for a local one, else address.
        # That socket admits this process alone (the kernel names the peer: the daemon's
        # _bind_ipc), so it takes no CURVE.
        self.route = route or self.address
        self.route_keys = None if self.route.startswith("ipc://") else cluster.keys
        sid = cluster.connection_id.encode()
        # rx first, watched from before it connects: connect() sees a worker that hangs up
        # on its first connection at once (one dying), where that event came unwatched.
        self.rx = dealer(cluster.context, sid + b"/rx", None, self.route_keys)
        self.handshake: zmq.Socket | None = self.rx.get_monitor_socket(_HANDSHAKE_EVENTS)
        self.rx.connect(self.route)
        self.tx = dealer(cluster.context, sid + b"/tx", self.route, self.route_keys)
        # A wait reads replies with this timeout, checking for a loss between reads: one
        # call per reply, where a poll and a read cost two.
        self.rx.setsockopt(zmq.RCVTIMEO, _READ_SLICE_MS)
        self.lane = None  # a local daemon's lane (protocol/lane.py), once connected
        self.tx_lock, self.rx_lock = threading.Lock(), threading.Lock()
        self.routed, self.waiting = threading.Condition(threading.Lock()), 0  # replies.py
        self.batch = []  # commands queued for the next send
        self.run = None  # the batch's last item, a Run still growing
        self.runs = False  # the batch holds runs (spliced in when sent)
        self.frames = []
        self.frees = deque()  # (id, streams) of dropped handles (Handle.__del__)
        self.batch_started = self.last_flush = 0.0
        self.batch_size = config.get("batch_size")
        self.inline_bytes = config.get("inline_bytes")
        self.quick_elements = config.get("inline_op_elements")  # issue.call's hold
        self.sync_timeout = config.get("sync_timeout")
        self.spin = config.get("master_spin_us") * 1e-6
        self.spin_misses = self.spin_skips = 0  # the spin's back-off (_spin)
        self.seq = 0
        # One counter for the session's nodes: an id names one command or tensor among all
        # of them (a graph over several nodes keeps its records by id).
        self.ids = cluster.ids
        self.tokens = itertools.count(1)
        self.replies = {}
        self.warned = []  # (command id, text): NumPy's warnings on the worker, to issue
        # One table for the nodes that share the session's id counter (an id names one
        # command among all of them): a mesh op's line is written once for all its nodes.
        self.sites = cluster.sites
        self.graph_sites = {}  # command id -> its line, for the graphs defined here
        self.streams = set()  # every stream this master has used on the node
        self.lost = None
        # Heartbeats may stop until then (monotonic): the worker is importing torch, whose
        # initialisation holds its interpreter for seconds on a loaded host.
        self.quiet_until = 0.0
        self.lost_at = ""  # the wall-clock time of the loss, for the errors that name it
        self.replaced_by = ""  # the address of the node that took this one's place
        # Why the worker refused a batch, until reported (a QuotaError: over this master's share).
        self.rejected = None
        self.info: wire.Welcome | None = None
        self.resumed: dict | None = None  # what a re-attached named session held
        self.closed = False
        self.torn = ""  # why no more messages go (a Ctrl-C came at a batch's send)
        self.refusing = False  # closed, torn or lost: one test per command issued
        # (token, what, when) of a wait a Ctrl-C cut short.
        self.interrupted = None
        self.bye: int | None = None  # the id of the Bye sent, awaited by close()
        self.limits = Limits(self)

    def __repr__(self):
        return f"node {self.index} ({self.address})"

    # -- connecting -----------------------------------------------------------------------

    def connect(self, timeout: float) -> None:
        """Say Hello on rx and wait for the Welcome; ConnectionError naming the address."""
        token = next(self.tokens)
        hello = wire.Hello(id=token, session=self.cluster.session_id,
                           master=self.cluster.master_name, node=self.index,
                           grace=self.cluster.grace)
        deadline = time.monotonic() + timeout
        try:
            self._send_hello(hello, deadline)
            self._await_welcome(self.handshake, deadline - time.monotonic())
        finally:
            self._unwatch()
        self._route(self.rx.recv_multipart())
        reply, _ = self.replies.pop(token, (None, None))
        if isinstance(reply, wire.Failed) and reply.info.get("kind") == "session":
            name = self.cluster.session_name
            raise ConnectionError(f"worker {self.address} (node {self.index}) refused this "
                                  f"master{f' (session {name!r})' if name else ''}: "
                                  f"{reply.info.get('message')}")
        if not isinstance(reply, wire.Welcome):
            raise ConnectionError(f"worker {self.address} (node {self.index}): unexpected answer "
                                  f"to Hello ({reply!r:.200})")
        self.info = reply
        if self.route.startswith("ipc://") and config.get("lanes"):  # off ZeroMQ from here
            folder = self.route[len("ipc://"):].rpartition("/")[0]
            self.lane = open_lane(f"{folder}/lane", self.cluster.connection_id.encode(),
                                  timeout)
        if reply.resumed:  # a named session re-attached: number past its earlier commands
            self.resumed = reply.resumed
            self.ids = itertools.count(int(reply.resumed["last_id"]) + 1)
            self.sites = [None] * SITES  # ids of its own: a table of its own

    def _send_hello(self, hello, deadline: float) -> None:
        """Send the Hello once rx can queue it: a worker that refused the handshake before
        the send (a key it requires, quick on loopback) leaves rx no connection, where a
        blocking send would wait forever; the monitor then says why."""
        parts = wire.encode(0, [hello])
        while True:
            self._await_welcome(self.handshake, deadline - time.monotonic(), zmq.POLLOUT)
            try:
                self.rx.send_multipart(parts, zmq.NOBLOCK)
                return
            except zmq.Again:  # the connection went between the poll and the send
                continue

    def _await_welcome(self, monitor, timeout: float, events: int = zmq.POLLIN) -> None:
        """Wait for the Hello's answer (or, given POLLOUT, for rx to take the Hello); a
        refused key is reported as such, not as silence."""
        poller = zmq.Poller()
        poller.register(self.rx, events)
        poller.register(monitor, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = dict(poller.poll(math.ceil(max(deadline - time.monotonic(), 0) * 1000)))
            if self.rx in ready:
                return
            if monitor in ready:
                event = recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    raise ConnectionError(hang_up(self._worker(), HUNG_UP, listens=False))
                if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                    raise self._hung_up()
                if event["event"] in _AUTH_FAILURES:
                    mismatch = mechanism_mismatch(event["event"], event["value"])
                    raise AuthError(master_refusal(self.cluster.keys, self._worker(), mismatch))
        raise ConnectionError(f"worker {self.address} (node {self.index}): no answer within "
                              f"{timeout} s; is mwrt-worker running and listening there, with "
                              "a key if this master has one?")

    def _unwatch(self) -> None:
        """Close the handshake's monitor (once)."""
        if self.handshake is not None:
            self.rx.disable_monitor()
            self.handshake.close(linger=0)
            self.handshake = None

    def _worker(self) -> str:
        """The worker's name in errors."""
        return f"worker {self.address} (node {self.index})"

    def _hung_up(self) -> Exception:
        """The error for a handshake the worker hung up on: AuthError only when probes find
        it alive and refusing the key (or lacking one), else what they saw (a dying worker
        hangs up as a refusing one does)."""
        if not listening(self.route):
            return ConnectionError(hang_up(self._worker(), HUNG_UP, listens=False))
        seen = why_hung_up(self.cluster.context, self.route, self.route_keys)
        if seen in (REFUSED, MISMATCH):
            return AuthError(master_refusal(self.route_keys, self._worker(), seen == MISMATCH))
        # No verdict may be a death still under way: its listener often closes last.
        return ConnectionError(hang_up(self._worker(), seen, listening(self.route)))

    def check_device(self, device) -> int:
        """`device` if this node has it (-1 = host memory), else a ValueError naming both."""
        if not isinstance(device, int) or device < -1:
            raise ValueError(f"device: must be -1 (host memory) or a GPU index >= 0 (got "
                             f"{device!r})")
        count = self.info.devices if self.info is not None else device + 1
        if device >= count == 0:
            raise ValueError(f"device: node {self.index} has no GPU {device} (it has no GPU: "
                             "its worker found no CuPy or no CUDA device); pip install "
                             "mwrt[cuda12] on that worker and restart it, or use device=-1 "
                             "(host memory)")
        if device >= count:
            raise ValueError(f"device: node {self.index} has no GPU {device} (it has {count}); "
                             f"use a GPU index below {count}, or device=-1 (host memory)")
        return device

    def check_stream_room(self) -> None:
        """Refuse a new stream past its worker's quota for this master, by name: the worker
        would refuse it, and a collective on it would leave its peers waiting."""
        quota = self.info.streams if self.info is not None else 0
        used = self.streams | {-1} | set(self.resumed["streams"] if self.resumed else ())
        if quota and len(used) >= quota:
            raise QuotaError(
                f"Stream: node {self.index} has no room for another stream of this master "
                f"(got {len(used)} there, the host's default stream counted, expected at most "
                f"MWRT_SESSION_STREAMS = {quota}, its worker's setting); reuse streams instead "
                "of making new ones, or raise MWRT_SESSION_STREAMS on that worker")

    def known_streams(self) -> list[int]:
        """Streams used on this node so far."""
        return sorted(self.streams)

    # -- ending ---------------------------------------------------------------------------

    def close(self, goodbye: bool = True) -> None:
        """Say Bye (briefly waiting for it) and close the sockets."""
        if self.closed:
            return
        if goodbye and self.lost is None and not self.torn:  # torn: the worker's lease frees it
            try:
                self._bye()
            except Exception as exc:  # noqa: BLE001 - a dying worker must not stop shutdown
                log.info("%s: goodbye not answered: %s", self, exc)
        self._stop_run()
        self._unwatch()  # never connected
        self.closed = self.refusing = True
        # A ZeroMQ socket closed while another thread sends or reads on it aborts the process
        # (a dashboard's status() as shutdown() ran): close each under the lock its users
        # hold; a wait on another thread sees `closed` within a read slice and lets go.
        with self.tx_lock:
            self.tx.close(linger=0)
        held = self.rx_lock.acquire(timeout=_CLOSE_WAIT)
        try:
            self.rx.close(linger=0)
            if self.lane is not None:
                self.lane.close()
        finally:
            if held:
                self.rx_lock.release()

    def forget(self) -> None:
        """In a forked child: refuse every command and read, and touch no socket, lock or run
        that the fork copied (they are the parent's, and a lock may have been held)."""
        self.tx_lock, self.rx_lock = threading.Lock(), threading.Lock()
        self.routed, self.waiting = threading.Condition(threading.Lock()), 0
        self.run, self.batch, self.frames, self.runs = None, [], [], False
        self.frees = deque()
        self.lane = None  # the parent's: its copy here is closed with the process
        self.closed = self.refusing = True

    def say_goodbye(self) -> None:
        """Send Bye without waiting for its answer (close() waits for it): a cluster's nodes
        free their sessions together (one after another, 32 took 1.5 s)."""
        if self.bye is not None or self.closed or self.lost is not None or self.torn:
            return
        bye = wire.Bye(id=next(self.ids))
        with self.tx_lock:
            self.seal_run()
            self.batch.append(bye)
            self._flush_locked(time.monotonic())
            self.bye = bye.id  # under the lock: no batch of another thread follows the Bye

    def _bye(self) -> None:
        self.say_goodbye()
        if self.bye is not None:  # sent, now or before
            self.wait(self.bye, "goodbye", timeout=2.0)

