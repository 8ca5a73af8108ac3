"""Frames on a stream socket, for the socket channels: the header, writing, reading ahead.

A frame is a fixed header (magic, kind, flags, description length, aux, tag, total size,
offset, segment size), the sender's description of its buffer (first frame of a message
only), then, for DATA frames, the segment's bytes. Writes go out as one sendmsg on a
non-blocking socket, which waits only when the kernel buffer is full. Reads go through a
`Reader` that asks the kernel for as much as is there: a small message, or several,
costs one recv (and one trip through the GIL) instead of one per part; a large segment
is still received straight into its destination.
"""

from __future__ import annotations

import select
import struct
import time

# magic, kind, flags, desc_len, aux, tag, total, offset, seglen
HEADER = struct.Struct("<IBBHIQQQQ")
MAGIC = 0x4D575254
DATA = 1
WHOLE = 1 << 16  # a message up to this size (with its description) is handled in one piece


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


def send_parts(sock, parts, deadline: float) -> None:
    """Write `parts` (bytes, or flat byte views) on a non-blocking socket; TimeoutError after
    `deadline`. One sendmsg when the kernel buffer has room, which is the common case."""
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
    """An inbound socket read ahead into a buffer; other attributes are the socket's, so a
    frame handler given the Reader may read (recv_into) and answer (sendall) as on it."""

    def __init__(self, sock, size: int = WHOLE + HEADER.size):
        self.sock, self.buf = sock, bytearray(size)
        self.view, self.start, self.end = memoryview(self.buf), 0, 0

    def __getattr__(self, name):
        return getattr(self.sock, name)

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

    def fill(self, n: int, what: str) -> bool:
        """Have `n` bytes buffered; False on a clean end of stream before any."""
        if self.end - self.start >= n:
            return True
        if self.start + n > len(self.buf):  # move what is left to the front
            left = self.end - self.start
            self.buf[:left] = self.view[self.start:self.end]
            self.start, self.end = 0, left
        while self.end - self.start < n:
            k = self.sock.recv_into(self.view[self.end:])
            if k == 0:
                if self.end == self.start:
                    return False
                raise ConnectionError(f"connection closed after {self.end - self.start} of {n} "
                                      f"bytes of {what}")
            self.end += k
        return True

    def recv_into(self, view: memoryview, nbytes: int = 0) -> int:
        """socket.recv_into, served from the buffer first."""
        n = min(nbytes or len(view), self.end - self.start)
        if n == 0:
            return self.sock.recv_into(view, nbytes)
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
