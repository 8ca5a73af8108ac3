"""What a node receives: the replies to its commands, read by the thread that waits for one.

A wait (Node.wait) reads the node's rx socket until its reply is in, routing every reply it
reads by its token (another thread's, a warning, a refused batch); it spins briefly first,
as a thread woken from a blocking read takes tens of microseconds more on a VM, and checks
for a lost worker, a refused batch or its timeout between reads. A worker's error report
becomes the exception the user sees (remote_error).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time

import zmq

from ..errors import ChannelError, MwrtError, QuotaError, RemoteError, WireError, WorkerLostError
from ..procs import defer_interrupts
from ..protocol import wire
from ..protocol.lane import CONNECTION_CLOSED, LaneClosed
from . import waits
from .batches import Batches
from .sites import restore_places, warn_at_sites

log = logging.getLogger("mwrt")

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: no enum made per call
_READ_SLICE = 0.05  # s: a thread waiting for the reader checks the lock and its timeout
_SAY_AFTER = 2.0  # seconds a wait after an interrupted one goes before it says what it awaits


class Replies(Batches):
    """A node's receiving side (a Node's base)."""

    # Set by Node.__init__ (client.py).
    rx: zmq.Socket
    rx_lock: threading.Lock
    tokens: itertools.count
    replies: dict[int, tuple]
    routed: threading.Condition  # notified as a reply is routed and as a reader lets go
    waiting: int  # threads waiting for the reader to route their reply
    warned: list  # (command id, text): NumPy's warnings on the worker, to issue
    rejected: str | QuotaError | None
    interrupted: tuple[int, str, float] | None
    sync_timeout: float
    spin: float
    spin_misses: int
    spin_skips: int

    def request(self, command, what: str, timeout: float | None = None):
        """Issue a command with a reply token (from self.tokens), and wait for its reply."""
        self.issue(command)
        return self.wait(command.token, what, timeout)

    def wait(self, token: int, what: str, timeout: float | None = None):
        """Wait for the reply `token`; raise the worker's error, a loss, or a timeout."""
        lane = self.lane
        if self.batch or self.frees or (lane is not None and lane.unsent):  # (a request's own
            self.flush()  # command went out as it was queued; a Ctrl-C may have cut it)
        timeout = self.sync_timeout if timeout is None else timeout
        start, began = time.monotonic(), time.time()
        deadline = start + timeout
        site = waits.site()  # the user's line, found while the worker works
        if self._take_reading(token, what, deadline, timeout):
            try:
                reply, frames = self._read_until(token, what, start, deadline, timeout)
            finally:
                self.rx_lock.release()
                if self.waiting:  # one of them reads on
                    self._wake_waiting()
        else:  # the thread that reads routed it here
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

    def _take_reading(self, token: int, what: str, deadline: float, timeout: float) -> bool:
        """Take rx_lock to read replies (True), or, while another thread reads, wait until it
        routes reply `token` here (False). Waiting for the lock alone deadlocked threads: the
        reader's own reply was queued behind a receive whose bytes a waiting thread sends once
        its reply (routed, unseen) is in (a dist_send beside a read of the same node)."""
        if self.rx_lock.acquire(blocking=False):
            return True
        with self.routed:
            self.waiting += 1
            try:
                while token not in self.replies:
                    if self.rx_lock.acquire(blocking=False):
                        return True
                    if time.monotonic() >= deadline:
                        raise self._timed_out(what, timeout)
                    self.routed.wait(_READ_SLICE)  # woken by each reply routed
            finally:
                self.waiting -= 1
        return False

    def _wake_waiting(self) -> None:
        """Wake the threads waiting for the reader (a reply routed, or the reader done)."""
        with self.routed:
            self.routed.notify_all()

    def _timed_out(self, what: str, timeout: float) -> TimeoutError:
        return TimeoutError(f"{self}: {what} not answered after {timeout} s "
                            "(MWRT_SYNC_TIMEOUT); the worker is alive but busy")

    def _read_until(self, token: int, what: str, start: float, deadline: float,
                    timeout: float) -> tuple:
        """Read and route replies until `token`'s is in, holding rx_lock; it, popped."""
        if self.closed:  # (under the lock: close() may run on another thread meanwhile)
            self.check_lost()
            self._raise_closed()
        asked = None
        try:
            if self.spin:  # before the first read
                self._spin(token)
            while token not in self.replies:
                self.check_lost()
                if self.rejected is not None:
                    self._raise_rejected()
                now = time.monotonic()
                if now >= deadline:
                    raise self._timed_out(what, timeout)
                if self.interrupted is not None and now - start > _SAY_AFTER:
                    asked = self._after_interrupt(asked, what)
                try:  # small replies: bytes beat Frames
                    lane = self.lane
                    frames = wire.recv_parts(self.rx) if lane is None else lane.recv(_READ_SLICE)
                except LaneClosed:  # its process ended: said next turn (or closed here)
                    if self.closed:
                        self._raise_closed()
                    self.mark_lost(CONNECTION_CLOSED)
                    continue
                except zmq.Again:  # _READ_SLICE passed: check for a loss, read again
                    frames = None
                if frames is None:
                    if self.closed:  # shut down by another thread, which waits for the lock
                        self._raise_closed()  # (outside the except: no zmq.Again chained)
                    continue
                self._route(frames)
        except KeyboardInterrupt:  # what it awaited runs on: the next long wait says so
            self.interrupted = (token, what, time.monotonic())
            raise
        reply = self.replies.pop(token)
        if self.rejected is not None:  # a refusal routed with the answer: it came first
            self._raise_rejected()
        return reply

    def _spin(self, token: int) -> None:
        """Read replies without sleeping until reply `token` is in or MWRT_MASTER_SPIN_US
        have passed: the reply to a small read comes within it, and a thread woken from a
        blocking read takes tens of us more on a VM. After a miss the spin is skipped for
        the next 1, 3, 7 ... waits (up to 63), a hit taking one miss back, so a loaded host
        or long ops cost no CPU in spins that do not pay."""
        if self.spin_skips:
            self.spin_skips -= 1
            return
        rx, clock, lane = self.rx, time.monotonic, self.lane
        deadline = clock() + self.spin
        while token not in self.replies:
            if lane is not None:
                try:
                    frames = lane.take()
                except LaneClosed:  # _read_until says so
                    return
                if frames is not None:
                    self._route(frames)  # another's reply, or a warning, first
                    continue
            elif rx.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]
                self._route(wire.recv_parts(rx))  # another's reply, or a warning, first
                continue
            if clock() >= deadline:
                self.spin_misses = min(self.spin_misses + 1, 6)
                self.spin_skips = (1 << self.spin_misses) - 1
                return
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
        if self.waiting:  # another thread's, maybe
            self._wake_waiting()

    def _raise_rejected(self) -> None:
        if self.rejected is not None:
            message, self.rejected = self.rejected, None
            if isinstance(message, QuotaError):
                raise message
            raise WireError(f"{self}: the worker refused a batch of commands, which did not run: "
                            f"{message}")

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
        return RemoteError.of(info.get("type"))(
            message, node=info.get("node"), device=info.get("device"),
            stream=info.get("stream"), op=info.get("op"),
            remote_traceback=restore_places(info.get("traceback", "")), issued_at=site)


# A Ctrl-C landing in wait() itself (as _take_reading returns with rx_lock taken, before the
# try that lets it go; as _read_until returns the reply) is held back until wait returns:
# there it left the lock held, and every later wait on the node waited out its timeout.
defer_interrupts(Replies.wait)
