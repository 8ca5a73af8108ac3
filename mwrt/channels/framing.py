"""Frames on a stream socket, for the socket channels: the header, writing, reading ahead.

A frame is a fixed header (magic, kind, flags, description length, aux, tag, total size,
offset, segment size), the sender's description of its buffer (first frame of a message
only), then, for DATA frames, the segment's bytes. Writes go out as one sendmsg on a
non-blocking socket, which waits only when the kernel buffer is full. Reads go through a
`Reader` that asks the kernel for as much as is there: a small message, or several,
costs one recv (and one trip through the GIL) instead of one per part; a large segment
is still received straight into its destination. Inbound sockets are non-blocking too:
the thread that reads one may change (mwrt.channels.inbound), and only the current
reader may wait on it.
"""

from __future__ import annotations

import os
import select
import struct
import time
from typing import NamedTuple

# magic, kind, flags, desc_len, aux, tag, total, offset, seglen
HEADER = struct.Struct("<IBBHIQQQQ")
MAGIC = 0x4D575254
DATA = 1
WHOLE = 1 << 16  # a message up to this size (with its description) is handled in one piece


class Frame(NamedTuple):
    """One frame's header: what it is (`kind`, DATA or a path's own), the `kind`'s extra
    number (`aux`: a slot), the message's tag and size, where this segment lies in it, and
    the sender's description of its buffer ("" after a message's first frame)."""

    kind: int
    tag: int
    total: int
    offset: int
    seglen: int
    desc: str = ""
    aux: int = 0

    def as_kind(self, kind: int, aux: int = 0) -> Frame:
        """This frame, of another kind (a path's own, carrying the same segment)."""
        return self._replace(kind=kind, aux=aux)

    def pack(self) -> bytes:
        """The header and description as they go on the wire."""
        desc = self.desc.encode()
        return HEADER.pack(MAGIC, self.kind, 0, len(desc), self.aux, self.tag, self.total,
                           self.offset, self.seglen) + desc


# Seconds a thread waiting with a deadline polls the socket before it sleeps: a sleeping
# thread costs a wake-up, and the kernel then tends to move it next to the sender's thread
# (a "sync" wake-up), where two ranks that exchange at once take turns on one CPU.
SPIN = 50e-6


def read_into(sock, view: memoryview, what: str) -> bool:
    """Fill `view` from `sock`; False on a clean end of stream before the first byte."""
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0:
                return False
            raise ConnectionError(f"connection closed after {got} of {n} bytes of {what}")
        got += k
    return True


def send_parts(sock, parts, deadline: float, before_wait=None) -> None:
    """Write `parts` (bytes, flat byte views) on a non-blocking socket by `deadline`."""
    # One sendmsg when the kernel buffer has room, the common case; else `before_wait()`
    # runs once before the first wait, and TimeoutError comes at the deadline.
    try:
        sent = sock.sendmsg(parts)
    except BlockingIOError:
        sent = 0
    for part in parts:
        n = len(part)
        if sent >= n:
            sent -= n
            continue
        rest, sent = memoryview(part)[sent:], 0
        if before_wait is not None:
            before_wait()
            before_wait = None
        while rest:
            left = deadline - time.monotonic()
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            if left <= 0 or not poller.poll(left * 1000):
                raise TimeoutError("the peer took no data before the deadline")
            try:
                rest = rest[sock.send(rest):]
            except BlockingIOError:
                pass


class Reader:
    """A non-blocking inbound socket read ahead into a buffer, usable as the socket itself."""

    # Other attributes are the socket's, so a frame handler given the Reader may read
    # (recv_into) and answer (sendall) as on it. Without a deadline a read waits as long as
    # it takes, calling `before_wait()` first; with one it raises TimeoutError when the
    # bytes are late.

    # Answers to the peer (shm's slot acks) never wait for room: the peer may be blocked
    # sending to us, reading its answers only after, so a reader that waited on its answer
    # would never read again (each side sending to the other, neither reading). What the
    # socket does not take now waits in `owed` and goes out whenever this reader waits.

    def __init__(self, sock, size: int = WHOLE + HEADER.size, before_wait=lambda: None):
        self.sock, self.buf, self.before_wait = sock, bytearray(size), before_wait
        self.view, self.start, self.end = memoryview(self.buf), 0, 0
        self.owed = bytearray()
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)

    def __getattr__(self, name):
        return getattr(self.sock, name)

    def sendall(self, data) -> None:
        """Answer the peer without waiting: what the socket does not take now goes later."""
        self.owed += data
        self.flush()

    def flush(self) -> bool:
        """Send what is owed as far as the socket takes it; True once nothing is owed."""
        while self.owed:
            try:
                n = self.sock.send(self.owed)
            except BlockingIOError:
                return False
            del self.owed[:n]
        return True

    def wait(self) -> None:
        """Wait until the socket has bytes (or has ended), sending what is owed meanwhile."""
        self._poll(None)

    def _poll(self, timeout_ms: float | None) -> bool:
        """Wait for bytes (True) or `timeout_ms`, sending owed answers as room comes."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while True:
            self._poller.modify(self.sock, select.POLLIN | (select.POLLOUT if self.owed else 0))
            left = None if deadline is None else max(deadline - time.monotonic(), 0) * 1000
            events = self._poller.poll(left)
            if self.owed:
                self.flush()
            if any(ev & ~select.POLLOUT for _, ev in events):
                return True
            if not events:
                return False

    def available(self) -> bool | None:
        """True when bytes are buffered or arrive without waiting; None at the end of stream."""
        if self.end > self.start:
            return True
        self.start = self.end = 0
        try:
            k = self.sock.recv_into(self.view)
        except BlockingIOError:
            return False
        self.end = k
        return True if k else None

    def next_header(self) -> tuple | None:
        """The next frame's header fields, or None at a clean end of stream."""
        if not self.fill(HEADER.size, "a frame header"):
            return None
        fields = HEADER.unpack_from(self.buf, self.start)
        self.start += HEADER.size
        return fields

    def take(self, n: int, what: str) -> memoryview:
        """The next `n` bytes (n <= the buffer's size), valid until the next read."""
        if n and not self.fill(n, what):
            raise ConnectionError(f"connection closed before {n} bytes of {what}")
        out = self.view[self.start:self.start + n]
        self.start += n
        return out

    def fill(self, n: int, what: str, deadline: float | None = None) -> bool:
        """Have `n` bytes buffered; False on a clean end of stream before any."""
        if self.end - self.start >= n:
            return True
        if self.start + n > len(self.buf):  # move what is left to the front
            left = self.end - self.start
            self.buf[:left] = self.view[self.start:self.end]
            self.start, self.end = 0, left
        while self.end - self.start < n:
            k = self._recv(self.view[self.end:], deadline)
            if k == 0:
                if self.end == self.start:
                    return False
                raise ConnectionError(f"connection closed after {self.end - self.start} of {n} "
                                      f"bytes of {what}")
            self.end += k
        return True

    def recv_into(self, view: memoryview, nbytes: int = 0) -> int:
        """socket.recv_into, served from the buffer first; waits for bytes like a blocking one."""
        n = min(nbytes or len(view), self.end - self.start)
        if n == 0:
            return self._recv(view[:nbytes] if nbytes else view, None)
        view[:n] = self.view[self.start:self.start + n]
        self.start += n
        return n

    def read_into(self, view: memoryview, what: str) -> None:
        """Fill `view`: the buffered bytes first, then straight from the socket."""
        if view.nbytes and not read_into(self, view, what):
            raise ConnectionError(f"connection closed before {view.nbytes} bytes of {what}")

    def discard(self, n: int, what: str) -> None:
        """Skip `n` bytes."""
        while n:
            k = min(n, len(self.buf))
            self.take(k, what)
            n -= k

    def _recv(self, view: memoryview, deadline: float | None) -> int:
        spin_until = None
        while True:
            try:
                return self.sock.recv_into(view)
            except BlockingIOError:
                pass
            if deadline is None:
                self.before_wait()
                self._poll(None)
                continue
            now = time.monotonic()
            if spin_until is None:
                spin_until = min(now + SPIN, deadline)
            if now < spin_until:  # a waiter's bytes usually follow within µs: stay awake,
                os.sched_yield()  # but let a thread that shares our CPU (the sender?) run
                continue
            if now >= deadline or not self._poll((deadline - now) * 1000):
                raise TimeoutError("no bytes before the deadline")
