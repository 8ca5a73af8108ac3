"""The socket thread's wait: one poll() of its sockets' descriptors, ZeroMQ asked only as needed.

ZeroMQ's own poll (zmq.Poller) asks every socket for its events before it sleeps and again
after it wakes, and each ask is two system calls (a read of the socket's command queue, and
libzmq's check that the process did not fork): for the daemon's three sockets, 13 polls and
15 getpid a round trip. Here the thread sleeps in one poll() of the sockets' descriptors
(ZMQ_FD), which become readable when something comes, and asks ZeroMQ (ZMQ_EVENTS) about a
socket only where its descriptor fired or where a call since the last ask may have taken the
signal (a send on the router processes its commands too).

A ZMQ_FD is edge-triggered: it fires when the socket's state may have changed, not while it
holds messages. So a socket is settled only when the last call on it was an ask, or a read,
that found nothing; the others (`unsettled`) are asked before each sleep. A sleep that ends
with nothing fired asks them all again, so a socket wrongly thought settled waits one timeout
at most.
"""

from __future__ import annotations

import os
import select
import time

import zmq

_EVENTS, _POLLIN, _FD = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.FD)
_SPIN_MISSES = 6  # a spin that keeps missing is skipped for up to 2**6 - 1 turns


class Wakes:
    """Waits for any of `sockets` to have a message, or for one of `fds` to be readable;
    spins first where that pays."""

    def __init__(self, sockets, spin_seconds: float, fds=(), unasked=()):
        self.sockets = tuple(sockets)
        # Sockets the caller reads without a wait (NOBLOCK), taking zmq.Again as read empty:
        # where their descriptor fires, the read asks ZeroMQ itself, so no ask comes first.
        self.unasked = frozenset(unasked)
        # Sockets to ask before a sleep: any but those whose last call was an ask or a read
        # that found nothing (the caller takes a socket off once it has read it empty).
        self.unsettled = set(self.sockets)
        self._poll = select.poll()
        self._by_fd: dict = dict.fromkeys(fds)  # plain descriptors (a Waker's) end a sleep only
        for sock in self.sockets:
            self._by_fd[sock.getsockopt(_FD)] = sock
        for fd in self._by_fd:
            self._poll.register(fd, select.POLLIN)
        self.others: dict = {}  # descriptors of other kinds (lanes), by fd: ready when fired
        self.spin_seconds = spin_seconds
        self.spin_misses = self.spin_skips = 0  # the spin's back-off (spin())

    def _ready(self, timeout_ms: int) -> list:
        """The sockets that hold a message (or may: those `unasked`), after waiting up to
        `timeout_ms` for one (0: not at all). Every socket is looked at (one poll() for all),
        so none starves another."""
        unsettled, ready = self.unsettled, []
        if unsettled:
            for sock in self.sockets:
                if sock in unsettled:
                    if sock.getsockopt(_EVENTS) & _POLLIN:
                        ready.append(sock)
                    else:
                        unsettled.discard(sock)
        fired = self._poll.poll(0 if ready else timeout_ms)
        if not fired:
            if not ready and timeout_ms > 0:  # slept through: ask every socket next time
                unsettled.update(self.sockets)
            return ready
        for fd, _ in fired:
            sock = self._by_fd.get(fd)
            if sock is None:
                other = self.others.get(fd)
                if other is not None:
                    ready.append(other)
                continue
            if sock in ready:
                continue
            if sock in self.unasked or sock.getsockopt(_EVENTS) & _POLLIN:
                unsettled.add(sock)
                ready.append(sock)
        return ready

    def watch(self, other, writable: bool = False) -> None:
        """Wake for `other` (with a fileno()) too: as it is readable, or also writable."""
        fd = other.fileno()
        self.others[fd] = other
        self._poll.register(fd, select.POLLIN | (select.POLLOUT if writable else 0))

    def forget(self, other) -> None:
        """Stop waking for `other` (before it closes: its fd may be reused)."""
        fd = other.fileno()
        if self.others.pop(fd, None) is not None:
            self._poll.unregister(fd)

    wait = _ready  # (spin() calls _ready: a tracer that wraps wait sees the wakes from a sleep)

    def spin(self, allowed) -> list:
        """wait() without sleeping, again and again for up to spin_seconds, if allowed()
        (asked only where a spin is due, as it costs a walk of the streams): the sockets
        that hold a message, or [] if none came. After a miss the spin is skipped for the
        next 1, 3, 7 ... calls (up to 63), a hit taking one miss back, so a loaded host, a
        master that reads rarely or many daemons on few cores spend no CPU on spins that do
        not pay."""
        if not self.spin_seconds:
            return []
        if self.spin_skips:
            self.spin_skips -= 1
            return []
        if not allowed():
            return []
        clock = time.perf_counter
        deadline = clock() + self.spin_seconds
        while True:
            ready = self._ready(0)
            if ready:
                self.spin_misses = max(self.spin_misses - 1, 0)  # on while hits outnumber misses
                return ready
            if clock() >= deadline:
                self.spin_misses = min(self.spin_misses + 1, _SPIN_MISSES)
                self.spin_skips = (1 << self.spin_misses) - 1
                return []
            os.sched_yield()  # lets the GIL and this core go to whoever waits for them
