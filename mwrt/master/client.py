"""The master's side of the wire: one Node per worker, and the Cluster that holds them.

A Node batches commands (the message classes of mwrt.protocol, never bare tuples) and sends
them on its `tx` socket; replies arrive on its `rx` socket, read only by a thread waiting at a
sync point. A background heartbeat thread (heartbeat.py) pings every worker, relays events
between nodes, and sends a batch that has waited too long, so work starts even when the master
issues no more.
"""

from __future__ import annotations

import itertools
import linecache
import logging
import math
import os
import sys
import threading
import time
from collections import deque
from types import FrameType

import zmq
from msgspec import Raw
from msgspec.structs import replace

from .. import config
from ..errors import (
    AuthError,
    ChannelError,
    MwrtError,
    QuotaError,
    RemoteError,
    WireError,
    WorkerLostError,
)
from ..protocol import auth, wire
from ..protocol.refusals import listening, master_refusal, recv_monitor_message
from . import waits
from .limits import Limits
from .sites import cell_name, restore_places, warn_at_sites

log = logging.getLogger("mwrt")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SITES = 1 << 16  # issue sites remembered per id counter (a session's nodes share one)
_SITE_MASK = SITES - 1
_AUTH_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                  zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_HANDSHAKE_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | sum(_AUTH_FAILURES)
_READ_SLICE_MS = 50  # a wait notices a lost worker or a refused batch within this
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: no enum made per call
_clock = time.monotonic  # (one global read per command)
QUIET = 1e-3  # seconds without a send after which a node is quiet: its next batch goes at once
_SAY_AFTER = 2.0  # seconds a wait after an interrupted one goes before it says what it awaits


def dealer(context: zmq.Context, identity: bytes, address: str, keys=None) -> zmq.Socket:
    """A DEALER socket with `identity`, connected to `address` (over CURVE given keys)."""
    sock = context.socket(zmq.DEALER)
    if keys is not None:
        auth.connect_curve(sock, keys)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(address)
    return sock


def issue_site() -> tuple | None:
    """(code, line) of the first caller outside mwrt: formatted by site_text() on error only."""
    pinned = _PINNED[0]
    if pinned is not None and _PINNED[1] == threading.get_ident():
        return pinned
    return _outside(sys._getframe(2))


def _outside(frame: FrameType | None) -> tuple | None:
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return None if frame is None else (frame.f_code, frame.f_lineno)


# The site every command a mesh op issues names, and the thread issuing it (a plain list:
# issue_site() reads it on every op, where a threading.local costs 0.5-3 us).
_PINNED: list = [None, 0]


def pin_site() -> bool:
    """Until unpin_site(), every command this thread issues names the line issuing now: a
    mesh op's commands at every place are one op (its places' warnings are issued once).
    False if a site is pinned already (this op's, nested; then unpin_site does nothing)."""
    if _PINNED[0] is not None:
        return False
    _PINNED[:] = [_outside(sys._getframe(1)), threading.get_ident()]
    return True


def unpin_site(pinned: bool) -> None:
    """End pin_site(), given what it returned."""
    if pinned:
        _PINNED[:] = [None, 0]


def uninterrupted(fn, *args):
    """Run fn(*args) on a helper thread and wait for it here: a Ctrl-C lands in this wait,
    while the helper runs to the end, so what fn sends goes out whole (every node's part of
    a collective, a transfer's receive and its bytes) and no worker waits for the rest."""
    done, box = threading.Event(), []

    def run():
        try:
            box.append((True, fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
            box.append((False, exc))
        finally:
            done.set()

    helper = threading.Thread(target=run, name="mwrt-uninterrupted", daemon=True)
    helper.mwrt_site = waits.caller()  # type: ignore[attr-defined]  # its waits are the caller's
    helper.start()
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def site_text(site: tuple | str | None) -> str:
    """'file:line in function' of an issue_site() (a str is already that), '' if none; a
    notebook cell's code as IPython names it, with its source line."""
    if site is None or isinstance(site, str):
        return site or ""
    code, line = site
    cell = cell_name(code.co_filename)
    if cell is None:
        return f"{code.co_filename}:{line} in {code.co_name}"
    source = linecache.getline(code.co_filename, line).strip()
    return f"{cell}, line {line} in {code.co_name}" + (f"\n    {source}" if source else "")


class Run(list):
    """Mesh commands queued alike at every node of a mesh: one list that each node's batch
    holds, so a mesh op is one append, not one per node. A node seals its last run (under
    the run's lock) before it queues anything else or sends its batch: from then on the run
    no longer grows, and the next mesh op starts a new one."""

    __slots__ = ("nodes", "stream", "started", "lock", "sealed", "tables")

    def __init__(self, nodes, stream, started: float, body) -> None:
        super().__init__((body,))
        self.nodes, self.stream, self.started = nodes, stream, started
        self.lock, self.sealed = threading.Lock(), False
        self.tables = list({id(node.sites): node.sites for node in nodes}.values())


def queue_everywhere(nodes, bodies, command_id: int, streams, site, window: float) -> None:
    """Queue one command already encoded (msgspec.Raw: a mesh op's, made once) at each of
    `nodes`, with one clock read: `bodies` and `streams` one per node, or one for all (a
    bytes object and an int), which grows the nodes' last Run while no node has queued
    anything since (one append per op). A node's batch goes out at once after a quiet
    spell, else when full or `window` seconds old: a mesh of N nodes sends N batches per
    window, so a window that grows with N keeps that cost per op from growing with N."""
    now = time.monotonic()
    slot = command_id & _SITE_MASK
    if type(streams) is int:  # one command for all
        run = nodes[0].run  # the last run queued at these nodes, if it may grow
        if run is not None and run.nodes is nodes and run.stream == streams:
            with run.lock:
                grew = not run.sealed
                if grew:
                    run.append(bodies)
            if grew:
                for table in run.tables:
                    table[slot] = site
                if now - run.started >= window or len(run) >= nodes[0].batch_size:
                    _flush_all(nodes, now)
                return
        _queue_each(nodes, itertools.repeat(Run(nodes, streams, now, bodies)), slot,
                    itertools.repeat(streams), site, now, window)
        return
    _queue_each(nodes, bodies, slot, streams or itertools.repeat(None), site, now, window)


def free_everywhere(nodes, tensor_id: int, streams: tuple) -> None:
    """Free block `tensor_id` at each of `nodes` (a mesh tensor one command made everywhere)
    after the streams that used it: one Free grown into the nodes' last run where it may
    grow on the block's one stream (one append for all nodes), else one entry in each node's
    frees. It runs in Handle.__del__, at any point of any thread: nothing under a run's lock
    allocates or drops a handle, so this never waits for its own thread."""
    run = nodes[0].run
    if run is not None and run.nodes is nodes and streams == (run.stream,):
        body = Raw(wire.encode_message(wire.Free(id=next(nodes[0].ids), stream=run.stream,
                                                 ids=(tensor_id,), uses=1)))
        with run.lock:
            grew = not run.sealed
            if grew:
                run.append(body)
        if grew:
            return
    freed = (tensor_id, streams)
    for node in nodes:
        if not node.closed:
            node.frees.append(freed)


def _queue_each(nodes, bodies, slot: int, streams, site, now: float, window: float) -> None:
    """Node.queue's rule, written out in one loop (a call per node cost a mesh op about as
    much as the rest of its work per node); a Run queued is each node's last."""
    for node, body, stream in zip(nodes, bodies, streams):
        if node.refusing:
            node._refuse_issue()
        node.sites[slot] = site
        if stream is not None and stream not in node.limits.streams:  # (a subset of streams)
            node.streams.add(stream)
            node.limits.streams.add(stream)
        with node.tx_lock:
            batch = node.batch
            if batch:
                due, sent = now - node.batch_started >= window, False
            else:  # (a send just went out, from this thread or the heartbeat's)
                node.batch_started = now
                due, sent = now - node.last_flush > QUIET, True  # quiet: the worker may wait
            if node.frees:  # handles dropped before this command: their frees run before it
                node._append_frees()
            elif node.run is not None:
                node.seal_run()
            batch.append(body)
            if type(body) is Run:
                node.run = body
                node.runs = True
            if due or len(batch) >= node.batch_size:
                node._flush_locked(now)
                sent = True
        if sent and node.limits.due():  # far behind: wait for it (never under the lock)
            node.limits.checkpoint()


def _flush_all(nodes, now: float) -> None:
    """Send every node's batch (a run grew past its window or size)."""
    for node in nodes:
        with node.tx_lock:
            node._flush_locked(now)
        if node.limits.due():
            node.limits.checkpoint()


def _flat(batch: list) -> list:
    """The batch's commands, its runs' spliced in."""
    flat: list = []
    for item in batch:
        if type(item) is Run:
            flat += item
        else:
            flat.append(item)
    return flat


class Node:
    """The master's connection to one worker daemon."""

    def __init__(self, cluster, index: int, address: str):
        self.cluster, self.index = cluster, index
        self.address = address if address.startswith("tcp://") else f"tcp://{address}"
        sid = cluster.connection_id.encode()
        self.tx = dealer(cluster.context, sid + b"/tx", self.address, cluster.keys)
        self.rx = dealer(cluster.context, sid + b"/rx", self.address, cluster.keys)
        # A wait reads replies with this timeout, checking for a loss between reads: one
        # call per reply, where a poll and a read cost two.
        self.rx.setsockopt(zmq.RCVTIMEO, _READ_SLICE_MS)
        self.tx_lock, self.rx_lock = threading.Lock(), threading.Lock()
        self.batch: list = []  # commands queued for the next send
        self.run: Run | None = None  # the batch's last item, a Run still growing
        self.runs = False  # the batch holds runs (spliced in when sent)
        self.frames: list = []
        self.frees: deque = deque()  # (id, streams) of dropped handles (Handle.__del__)
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
        self.replies: dict[int, tuple] = {}
        self.warned: list = []  # (command id, text): NumPy's warnings on the worker, to issue
        # One table for the nodes that share the session's id counter (an id names one
        # command among all of them): a mesh op's line is written once for all its nodes.
        self.sites: list = cluster.sites
        self.graph_sites: dict = {}  # command id -> its line, for the graphs defined here
        self.streams: set[int] = set()  # every stream this master has used on the node
        self.lost: str | None = None
        # Heartbeats may stop until then (monotonic): the worker is importing torch, whose
        # initialisation holds its interpreter for seconds on a loaded host.
        self.quiet_until = 0.0
        self.lost_at = ""  # the wall-clock time of the loss, for the errors that name it
        self.replaced_by = ""  # the address of the node that took this one's place
        # Why the worker refused a batch, until reported (a QuotaError: over this master's share).
        self.rejected: str | QuotaError | None = None
        self.info: wire.Welcome | None = None
        self.resumed: dict | None = None  # what a re-attached named session held
        self.closed = False
        self.torn = False  # a Ctrl-C came at a batch's send: no more messages on tx
        self.refusing = False  # closed, torn or lost: one test per command issued
        # (token, what, when) of a wait a Ctrl-C cut short.
        self.interrupted: tuple[int, str, float] | None = None
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
        monitor = self.rx.get_monitor_socket(_HANDSHAKE_EVENTS)
        try:
            wire.send_parts(self.rx, wire.encode(0, [hello]))
            self._await_welcome(monitor, timeout)
        finally:
            self.rx.disable_monitor()
            monitor.close(linger=0)
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
        if reply.resumed:  # a named session re-attached: number past its earlier commands
            self.resumed = reply.resumed
            self.ids = itertools.count(int(reply.resumed["last_id"]) + 1)
            self.sites = [None] * SITES  # ids of its own: a table of its own

    def _await_welcome(self, monitor, timeout: float) -> None:
        """Wait for the Hello's answer; a refused key is reported as such, not as silence."""
        poller = zmq.Poller()
        poller.register(self.rx, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = dict(poller.poll(math.ceil(max(deadline - time.monotonic(), 0) * 1000)))
            if self.rx in ready:
                return
            if monitor in ready:
                event = recv_monitor_message(monitor)
                gone = event["event"] == zmq.EVENT_DISCONNECTED or (
                    event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    and not listening(self.address))
                if gone:  # a worker that dies mid-handshake hangs up as a refusing one does
                    raise ConnectionError(f"worker {self.address} (node {self.index}): closed "
                                          "the connection before answering the Hello (it died "
                                          "or was stopped); start it again, or use another")
                if event["event"] in _AUTH_FAILURES:
                    raise AuthError(master_refusal(
                        event["event"], event["value"], self.cluster.keys,
                        f"worker {self.address} (node {self.index})", self.cluster.context,
                        self.address))
        raise ConnectionError(f"worker {self.address} (node {self.index}): no answer within "
                              f"{timeout} s; is mwrt-worker running and listening there, with "
                              "a key if this master has one?")

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

    # -- issuing --------------------------------------------------------------------------

    def issue(self, command, frame=None, site=None, hold: bool = False) -> None:
        """Queue one command; it goes out with its batch (now, if the node was quiet).

        A `frame` (bytes beside a command with a data_frame trait) rides in the batch; the
        command's `frame` field is set to its index. `site`: the issuing line, when the caller
        already found it (a mesh op issues one command per node from one line). `hold`: an op
        of microseconds, which a quiet node's batch keeps for the next command (queue()).
        """
        if command.on_stream:
            stream = command.stream
        else:
            stream = None
            if isinstance(command, wire.NewStream):  # synchronize() waits on streams it made
                self.streams.add(command.stream)
        if command.sync_point:  # a read's errors name the op, not it; its answer is
            self.queue(command, command.id, stream, site, _clock(), None, frame, send=True)
            return  # awaited at once: sent now, not at the wait
        if site is None:
            site = issue_site()
        self.queue(command, command.id, stream, site, _clock(), None, frame, hold)

    def queue(self, body, command_id: int, stream: int | None, site, now: float,
              window: float | None = None, frame=None, hold: bool = False,
              send: bool = False) -> None:
        """Queue one command (a message, or its bytes: msgspec.Raw) issued from `site` on
        `stream` (None: not on one) at time `now`. The batch goes out at once when the node
        was quiet (no send for a millisecond), when it is full, with a data `frame`, and when
        it is `window` seconds old (None: whenever a millisecond passed since the last send;
        the heartbeat sends stragglers).

        A quiet node's batch keeps a command to `hold` (a small op) for the next one, which
        sends both: a read that follows, `float(t.sum())`, makes one message, not an op's
        and then a read's. Nothing waits on it meanwhile (a read, a relay's Record, a
        transfer come as that next command); if none comes, the heartbeat sends it. A
        command to `send` goes out at once with the batch (a read, awaited next)."""
        if self.refusing:
            self._refuse_issue()
        self.sites[command_id & _SITE_MASK] = site
        if stream is not None:
            self.streams.add(stream)
            self.limits.streams.add(stream)
        with self.tx_lock:
            batch = self.batch
            if not batch:  # (a send just went out, from this thread or the heartbeat's)
                self.batch_started = now
                # quiet: the worker may wait (unless the op is one the read after it takes)
                due, sent = not hold and now - self.last_flush > QUIET, True
            elif window is None:
                due, sent = now - self.last_flush > QUIET, False
            else:
                due, sent = now - self.batch_started >= window, False
            if self.frees:  # handles dropped before this command: their frees run before it
                self._append_frees()
            elif self.run is not None:
                self.seal_run()
            if frame is not None:  # as bytes: pyzmq sends other buffers zero-copy (slow)
                body = replace(body, frame=len(self.frames))
                self.frames.append(frame if type(frame) is bytes else bytes(memoryview(frame)))
                due = True
            batch.append(body)
            if due or send or len(batch) >= self.batch_size:
                self._flush_locked(now)
                sent = True
        # What the worker is behind by grows only when a batch goes out: asked then.
        if sent and self.limits.due():  # far behind: wait for it (never under the lock)
            self.limits.checkpoint()

    def flush(self) -> None:
        """Send the queued batch now."""
        with self.tx_lock:
            self._flush_locked(time.monotonic())

    def flush_stale(self, now: float, age: float) -> None:
        """Send the batch if its first command has waited more than `age` seconds."""
        if (self.batch or self.frees) and now - self.batch_started > age:
            with self.tx_lock:
                self._flush_locked(now)

    def seal_run(self) -> None:
        """The batch's last run grows no more (called under tx_lock, before the batch does)."""
        run, self.run = self.run, None
        if run is not None:
            with run.lock:
                run.sealed = True

    def _stop_run(self) -> None:
        """No mesh op grows the batch's last run any more: this node takes no more (lost or
        closed), which the next op's own queueing then says (any thread, no tx_lock)."""
        run = self.run
        if run is not None:
            with run.lock:
                run.sealed = True

    def _flush_locked(self, now: float) -> None:
        self.last_flush = now
        if self.frees:
            self._append_frees()
        elif self.run is not None:
            self.seal_run()
        if not self.batch or self.closed or self.lost or self.torn:
            return
        self.seq += 1
        # Data frames here are inline arrays (at most MWRT_INLINE_BYTES), copied to bytes when
        # issued: cheap, and it frees the caller to reuse its array at once.
        message = wire.envelope(self.seq, wire.encode_body(_flat(self.batch) if self.runs
                                                           else self.batch), self.frames)
        try:
            wire.send_parts(self.tx, [message])
        except BaseException:  # a Ctrl-C at the send: whether the batch went out is unknown,
            self.torn = self.refusing = True  # so nothing more goes (resent, it could run twice)
            raise
        self.limits.count(len(message))
        self.batch, self.frames, self.runs = [], [], False

    def _append_frees(self) -> None:
        """One Free per stream for the handles dropped so far (some), grouped by streams."""
        if self.run is not None:
            self.seal_run()
        frees = self.frees  # emptied only here, under tx_lock; any thread appends
        tensor_id, streams = frees.popleft()
        if not frees:  # one dropped since the last command: a loop's temporary
            self._free((tensor_id,), streams)
            return
        pop = frees.popleft  # (those dropped meanwhile, even here, wait for the next)
        taken = [(tensor_id, streams), *[pop() for _ in range(len(frees))]]
        freed, uses = zip(*taken)
        if uses.count(streams) == len(uses):  # all used on the same streams
            self._free(freed, streams)
            return
        by_streams: dict[tuple, list] = {}
        for tensor_id, streams in taken:
            by_streams.setdefault(streams, []).append(tensor_id)
        for streams, ids in by_streams.items():
            self._free(tuple(ids), streams)

    def _free(self, ids: tuple, streams: tuple) -> None:
        """Free tensors `ids` once every one of `streams` has reached this point."""
        for stream in streams:
            self.batch.append(wire.Free(id=next(self.ids), stream=stream, ids=ids,
                                        uses=len(streams)))

    def site_of(self, command_id: int) -> str:
        """The line that issued command `command_id` (or captured it in a graph), '' if not
        remembered."""
        site = self.graph_sites.get(command_id)
        return site if site is not None else site_text(self.sites[command_id & _SITE_MASK])

    def sites_of(self, command_id: int):
        """The (code, line) that issued command `command_id`, or None if not remembered."""
        site = self.sites[command_id & _SITE_MASK]
        return site if type(site) is tuple else None

    def known_streams(self) -> list[int]:
        """Streams used on this node so far."""
        return sorted(self.streams)

    def request(self, command, what: str, timeout: float | None = None):
        """Issue a command with a reply token (from self.tokens), and wait for its reply."""
        self.issue(command)
        return self.wait(command.token, what, timeout)

    def wait(self, token: int, what: str, timeout: float | None = None):
        """Wait for the reply `token`; raise the worker's error, a loss, or a timeout."""
        if self.closed:
            self.check_lost()
            self._raise_closed()
        if self.batch or self.frees:  # (a request's own command went out as it was queued)
            self.flush()
        timeout = self.sync_timeout if timeout is None else timeout
        start, began = time.monotonic(), time.time()
        deadline, asked = start + timeout, None
        site = waits.site()  # the user's line, found while the worker works
        with self.rx_lock:
            try:
                if self.spin:  # before the first read
                    self._spin(token)
                while token not in self.replies:
                    self.check_lost()
                    if self.rejected is not None:
                        self._raise_rejected()
                    now = time.monotonic()
                    if now >= deadline:
                        raise TimeoutError(f"{self}: {what} not answered after {timeout} s "
                                           "(MWRT_SYNC_TIMEOUT); the worker is alive but busy")
                    if self.interrupted is not None and now - start > _SAY_AFTER:
                        asked = self._after_interrupt(asked, what)
                    try:  # small replies: bytes beat Frames
                        frames = wire.recv_parts(self.rx)
                    except zmq.Again:  # _READ_SLICE_MS passed: check for a loss, read again
                        continue
                    self._route(frames)
            except KeyboardInterrupt:  # what it awaited runs on: the next long wait says so
                self.interrupted = (token, what, time.monotonic())
                raise
            reply, frames = self.replies.pop(token)
            if self.rejected is not None:  # a refusal routed with the answer: it came first
                self._raise_rejected()
        if self.warned:  # outside the lock: a filter set to "error" raises here
            warned, self.warned = self.warned, []
            warn_at_sites(warned, self.sites_of)
        waits.LOG.note(self.index, what, began, time.time(), site)
        if isinstance(reply, wire.Failed):
            raise self.remote_error(reply.info)
        return reply, frames

    def _spin(self, token: int) -> None:
        """Read replies without sleeping until reply `token` is in or MWRT_MASTER_SPIN_US
        have passed: the reply to a small read comes within it, and a thread woken from a
        blocking read takes tens of us more on a VM. After a miss the spin is skipped for
        the next 1, 3, 7 ... waits (up to 63), a hit taking one miss back, so a loaded host
        or long ops cost no CPU in spins that do not pay."""
        if self.spin_skips:
            self.spin_skips -= 1
            return
        rx, clock = self.rx, time.monotonic
        deadline = clock() + self.spin
        while token not in self.replies:
            if rx.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]
                self._route(wire.recv_parts(rx))  # another's reply, or a warning, first
            elif clock() >= deadline:
                self.spin_misses = min(self.spin_misses + 1, 6)
                self.spin_skips = (1 << self.spin_misses) - 1
                return
            else:
                os.sched_yield()  # the core, to whoever waits for it (the worker, if local)
        self.spin_misses = max(self.spin_misses - 1, 0)  # on only while hits outnumber misses

    def _after_interrupt(self, asked: int | None, what: str) -> int | None:
        """A wait that follows an interrupted one: ask the worker what its streams run (once),
        and say what this wait is behind; the token asked, or None once said."""
        if self.interrupted is None:  # asked after an interrupted wait only
            return None
        token, cut, since = self.interrupted
        if token in self.replies:  # what the interrupted wait awaited has finished since
            self.replies.pop(token)
            self.interrupted = None
            return None
        if asked is None:  # sent past issue(): its backpressure must not wait inside a wait
            stats = wire.Stats(id=next(self.ids), token=next(self.tokens))
            with self.tx_lock:
                self.seal_run()
                self.batch.append(stats)
                self._flush_locked(time.monotonic())
            return stats.token
        if asked not in self.replies:
            return asked
        reply, _ = self.replies.pop(asked)
        self.interrupted = None  # said once
        value = reply.value if isinstance(reply, wire.Done) else None
        running = value.get("running", []) if isinstance(value, dict) else []
        for busy in running:
            site = self.site_of(busy["command"]) or "an unknown line"
            log.warning("%s: %s waits behind %s on stream %s, issued at %s, running for %.0f s "
                        "(a Ctrl-C interrupted the wait of %s %.0f s ago, not the op, which "
                        "runs to its end); mwrt.cancel() drops the commands queued behind it",
                        self, what, busy["op"], busy["stream"], site, busy["seconds"], cut,
                        time.monotonic() - since)
        return None

    def _route(self, frames) -> None:
        try:
            _, body, data = wire.open_envelope(frames)
            (reply,) = wire.decode_body(body)
        except (wire.WireError, ValueError) as exc:
            log.error("%s: undecodable reply: %s", self, exc)
            return
        if type(reply) is wire.Warned:  # comes before the answer of its stream
            self.warned.extend(reply.warnings)
            return
        if reply.token == -1 and isinstance(reply, wire.Failed):
            if reply.info.get("kind") == "unknown_session":
                self.mark_lost(reply.info.get("message", "session unknown to the worker"))
            else:  # a whole batch was refused: its commands never ran; say so at the next wait
                log.error("%s: %s", self, reply.info.get("message"))
                self.rejected = reply.info.get("message", "a batch was refused")
                if reply.info.get("kind") == "quota":  # over this master's share: by name
                    self.rejected = QuotaError(f"{self}: {self.rejected}")
            return
        self.replies[reply.token] = (reply, data)

    # -- failures -------------------------------------------------------------------------

    def mark_lost(self, reason: str) -> None:
        """Record that this worker is gone; every later wait on it raises WorkerLostError."""
        if self.lost is None:
            self.lost, self.lost_at = reason, time.strftime("%H:%M:%S")
            self.refusing = True
            self._stop_run()  # no mesh op grows its runs any more
            log.error("%s lost: %s", self, reason)

    def _raise_rejected(self) -> None:
        if self.rejected is not None:
            message, self.rejected = self.rejected, None
            if isinstance(message, QuotaError):
                raise message
            raise WireError(f"{self}: the worker refused a batch of commands, which did not run: "
                            f"{message}")

    def _raise_closed(self) -> None:
        raise MwrtError(f"{self}: this master's session with the node has ended "
                        "(mwrt.shutdown()); tensors made in it are gone")

    def _refuse_issue(self) -> None:
        """Why nothing more can be issued to this node: ended, cut by a Ctrl-C, or lost (a
        loop with no sync point must not queue commands for a dead worker forever)."""
        if self.closed:
            self.check_lost()  # a replaced node: say it was lost, not that the session ended
            self._raise_closed()
        if self.torn:
            raise MwrtError(f"{self}: a Ctrl-C came as a batch of commands was sent (it may have "
                            "gone out or not), so this session cannot send more; call "
                            "mwrt.shutdown(), then mwrt.init_master_worker() again")
        self.check_lost()

    def check_lost(self) -> None:
        if self.lost is not None:
            since = (f"; node {self.index} has since been replaced by {self.replaced_by}: "
                     "load what it held again (mwrt.load)") if self.replaced_by else ""
            raise WorkerLostError(f"{self} is lost (at {self.lost_at}): {self.lost}; its "
                                  f"tensors are gone{since}", node=self.index,
                                  address=self.address)

    def remote_error(self, info: dict) -> Exception:
        """Turn a worker's error report into RemoteError (or the loss it describes)."""
        if info.get("kind") == "unknown_session":
            self.mark_lost(info.get("message", ""))
            return WorkerLostError(f"{self} is lost: {self.lost}", node=self.index,
                                   address=self.address)
        if info.get("kind") == "channel":
            return ChannelError(f"{self}: {info.get('message')}")
        if info.get("kind") == "quota":  # over this master's share, refused before it ran
            return QuotaError(f"{self}: {info.get('message')}")
        if info.get("kind") != "remote":
            return MwrtError(f"{self}: {info.get('message')}")
        command = info.get("command")
        site = self.site_of(command) if isinstance(command, int) else ""
        message = (f"node {info.get('node')}, device {info.get('device')}, stream "
                   f"{info.get('stream')}: {info.get('op')} on shapes {info.get('shapes')} "
                   f"failed: {info.get('type')}: {info.get('message')}")
        return RemoteError(message, node=info.get("node"), device=info.get("device"),
                           stream=info.get("stream"), op=info.get("op"),
                           remote_traceback=restore_places(info.get("traceback", "")),
                           issued_at=site)

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
        self.closed = self.refusing = True
        self.tx.close(linger=0)
        self.rx.close(linger=0)

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
        self.bye = bye.id

    def _bye(self) -> None:
        self.say_goodbye()
        if self.bye is not None:  # sent, now or before
            self.wait(self.bye, "goodbye", timeout=2.0)
