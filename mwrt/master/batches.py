"""What a node sends: its batch of commands, the mesh ops' runs, and whether it may send.

A Node (client.py) queues each command in its batch, which goes out as one message when the
node was quiet, when it is full, or with a data frame; the heartbeat thread sends a batch
that waited too long. A mesh op queues its one encoded command at every node at once
(queue_everywhere), growing a Run that every node's batch holds. Handles dropped on any
thread queue their frees here, sent before the next command. Each command's issuing line is
kept by its id, for the errors that name it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import zmq
from msgspec import Raw
from msgspec.structs import replace

from ..errors import MwrtError, WorkerLostError
from ..procs import defer_interrupts
from ..protocol import wire
from ..protocol.lane import CONNECTION_CLOSED, Lane, LaneClosed
from .limits import Limits
from .sites import SITE_MASK, issue_site, site_text

log = logging.getLogger("mwrt")

_clock = time.monotonic  # (one global read per command)
_CUT_BY_CTRL_C = "a Ctrl-C came as a batch of commands was sent (it may have gone out or not)"
QUIET = 1e-3  # seconds without a send after which a node is quiet: its next batch goes at once


class Run(list):
    """Mesh commands queued alike at every node of a mesh: one list that each node's batch
    holds, so a mesh op is one append, not one per node. A node seals its last run (under
    the run's lock) before it queues anything else or sends its batch: from then on the run
    no longer grows, and the next mesh op starts a new one."""

    __slots__ = ("nodes", "stream", "started", "lock", "sealed", "tables", "window")

    def __init__(self, nodes, stream, started: float, body, window: float) -> None:
        super().__init__((body,))
        self.nodes, self.stream, self.started, self.window = nodes, stream, started, window
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
    slot = command_id & SITE_MASK
    if type(streams) is int:  # one command for all
        run = nodes[0].run  # the last run queued at these nodes, if it may grow
        # ... once the last node has it: one that another thread was still queueing grew
        # with this thread's op, which then reached the later nodes after what this thread
        # queued next there (a collective found its input missing on node 1).
        if run is not None and run.nodes is nodes and run.stream == streams \
                and nodes[-1].run is run:
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
        _queue_each(nodes, itertools.repeat(Run(nodes, streams, now, bodies, window)), slot,
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
    if run is not None and run.nodes is nodes and streams == (run.stream,) \
            and nodes[-1].run is run:  # queued at every node (queue_everywhere)
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
                # quiet: the worker may wait. A mesh op's quiet spell is its window, as long
                # as N nodes' queueing may take: with 1 ms, an op that took more (128 nodes
                # on a loaded machine) found every node quiet and sent each op alone
                due, sent = now - node.last_flush > window, True
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


class Batches:
    """A node's sending side, and the state that says whether it may send (a Node's base)."""

    # Set by Node.__init__ (client.py).
    index: int
    address: str
    cluster: Any  # the Cluster (its pid: the process that owns the session)
    tx: zmq.Socket
    lane: Lane | None  # a local daemon's lane: batches go there, not on tx
    sync_timeout: float
    tx_lock: threading.Lock
    batch: list  # commands queued for the next send
    run: Run | None  # the batch's last item, a Run still growing
    runs: bool  # the batch holds runs (spliced in when sent)
    frames: list
    frees: deque  # (id, streams) of dropped handles (Handle.__del__)
    batch_started: float
    last_flush: float
    batch_size: int
    seq: int
    ids: Iterator[int]
    sites: list
    graph_sites: dict
    streams: set[int]
    limits: Limits
    lost: str | None
    lost_at: str
    replaced_by: str
    closed: bool
    torn: str  # why no more messages go on tx or the lane ("": they go)
    refusing: bool
    bye: int | None  # the id of the Bye sent: nothing goes after it

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
        self.sites[command_id & SITE_MASK] = site
        if stream is not None and stream not in self.limits.streams:  # (a subset of streams)
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

    def send_with_read(self, ref: int, stream: int, token: int) -> bool:
        """Send the batch with its last command, if that is the Call that makes tensor `ref`
        alone on `stream`, turned into a CallGet answering `token` with the value: an op and
        the read of its result right after it are one command. False if the batch does not
        end so (sent since, another command since, a mesh op's run, or a node that refuses)."""
        with self.tx_lock:
            batch = self.batch
            last = batch[-1] if batch else None
            if (type(last) is not wire.Call or last.outs != (ref,) or last.stream != stream
                    or self.refusing):
                return False
            batch[-1] = wire.CallGet(last.id, stream, last.outs, last.op, last.args,
                                     last.kwargs, last.fp, token)
            self._flush_locked(_clock())
        if self.limits.due():  # as after any send (queue())
            self.limits.checkpoint()
        return True

    def flush(self) -> None:
        """Send the queued batch now."""
        with self.tx_lock:
            self._flush_locked(time.monotonic())

    def flush_stale(self, now: float, age: float) -> None:
        """Send the batch if its first command has waited more than `age` seconds, or its
        mesh run its window if longer (which grows with the mesh's nodes: the heartbeat
        thread, woken by 128 nodes' pongs every few ms, sent every node's batch each 2 ms
        and so each run of a stream of mesh ops, N sends per few ops)."""
        run = self.run
        if run is not None and run.window > age:
            age = run.window
        lane = self.lane
        stale = (lane is not None and lane.unsent) or (
            (self.batch or self.frees) and now - self.batch_started > age)
        # Not waiting for the lock: its holder sends (maybe waiting for room on a lane, where
        # a heartbeat thread waiting here would ping no node meanwhile).
        if stale and self.tx_lock.acquire(blocking=False):
            try:
                self._flush_locked(now)
            finally:
                self.tx_lock.release()

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
        if self.closed or self.lost or self.torn:
            return
        if self.lane is not None and self.lane.unsent:  # a batch a Ctrl-C cut: its rest first
            self._send(None)
        if not self.batch:
            return
        if self.bye is not None:  # dropped: a worker answers a batch after its Bye with "no
            # session for this master", which this master takes for a lost node
            log.info("%s: dropped commands issued after its Bye", self)
            self.batch, self.frames, self.runs = [], [], False
            return
        self.seq += 1
        # Data frames here are inline arrays (at most MWRT_INLINE_BYTES), copied to bytes when
        # issued: cheap, and it frees the caller to reuse its array at once.
        message = wire.envelope(self.seq, wire.encode_body(_flat(self.batch) if self.runs
                                                           else self.batch), self.frames)
        lane = self.lane
        began = lane.began if lane is not None else -1
        try:
            self._send(message)
        finally:  # sent, or its rest goes next; unless torn, or a Ctrl-C came before its write
            if not self.torn and (lane is None or lane.began != began):
                self.limits.count(len(message))
                self.batch, self.frames, self.runs = [], [], False

    def _send(self, message) -> None:
        """Send a batch's `message` (None: the rest of one a Ctrl-C cut on the lane)."""
        lane = self.lane
        began = lane.began if lane is not None else -1
        try:
            if lane is None:
                wire.send_parts(self.tx, [message])
            elif message is None:  # (a lost worker ends a wait for room, as its loss)
                lane.finish(self.sync_timeout, self.check_lost)
            else:
                lane.send((message,), self.sync_timeout, self.check_lost)
        except LaneClosed:  # the worker's process ended: as its heartbeat's loss would say
            self.mark_lost(CONNECTION_CLOSED)
            self.check_lost()
        except WorkerLostError:  # lost as the lane waited for room: said as such
            raise
        except TimeoutError as exc:  # part of the batch may be written: nothing more goes
            self.torn = f"a batch of commands was cut: {exc} (MWRT_SYNC_TIMEOUT)"
            self.refusing = True
            raise TimeoutError(f"{self}: {exc} (MWRT_SYNC_TIMEOUT)") from None
        except BaseException:  # a Ctrl-C at the send: whether the batch went out is unknown,
            if lane is not None and (lane.cut or lane.began == began):  # (known on the lane:
                lane.cut = False  # its rest goes next, or none of it went and it is queued)
                raise
            self.torn = _CUT_BY_CTRL_C  # so nothing more goes (resent, it could run twice)
            self.refusing = True
            raise

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
        return site if site is not None else site_text(self.sites[command_id & SITE_MASK])

    def sites_of(self, command_id: int):
        """The (code, line) that issued command `command_id`, or None if not remembered."""
        site = self.sites[command_id & SITE_MASK]
        return site if type(site) is tuple else None

    def mark_lost(self, reason: str) -> None:
        """Record that this worker is gone; every later wait on it raises WorkerLostError."""
        if self.lost is None:
            self.lost, self.lost_at = reason, time.strftime("%H:%M:%S")
            self.refusing = True
            self._stop_run()  # no mesh op grows its runs any more
            log.error("%s lost: %s", self, reason)

    def _raise_closed(self) -> None:
        if os.getpid() != self.cluster.pid:
            raise MwrtError(
                f"{self}: this process (pid {os.getpid()}) is a fork of the master (pid "
                f"{self.cluster.pid}), whose session and tensors are the master's alone; pass "
                "the child values (t.numpy()), or call mwrt.init_master_worker() in it for a "
                "session of its own")
        raise MwrtError(f"{self}: this master's session with the node has ended "
                        "(mwrt.shutdown()); tensors made in it are gone")

    def check_open(self) -> None:
        """Raise why this node takes no more commands (its session ended, a Ctrl-C cut a
        send, or its worker was lost), if it takes none."""
        if self.refusing:
            self._refuse_issue()

    def _refuse_issue(self) -> None:
        """Why nothing more can be issued to this node: ended, cut by a Ctrl-C, or lost (a
        loop with no sync point must not queue commands for a dead worker forever)."""
        if self.closed:
            self.check_lost()  # a replaced node: say it was lost, not that the session ended
            self._raise_closed()
        if self.torn:
            raise MwrtError(f"{self}: {self.torn}, so this session cannot send more; call "
                            "mwrt.shutdown(), then mwrt.init_master_worker() again")
        self.check_lost()

    def check_lost(self) -> None:
        if self.lost is not None:
            since = (f"; node {self.index} has since been replaced by {self.replaced_by}: "
                     "load what it held again (mwrt.load)") if self.replaced_by else ""
            raise WorkerLostError(f"{self} is lost (at {self.lost_at}): {self.lost}; its "
                                  f"tensors are gone{since}", node=self.index,
                                  address=self.address)


# A Ctrl-C that lands as a send returns is held back until _send has kept what it sent (as
# one in the lane's own writes is): landing there, it left the batch's fate unknown, and the
# session could send no more.
defer_interrupts(Batches._send, wire.send_parts)
