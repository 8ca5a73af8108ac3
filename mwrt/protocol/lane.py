"""A lane: a master's batches and a local daemon's replies over one Unix stream socket.

ZeroMQ hands every message to an I/O thread on each side: four thread wake-ups a round
trip, about 60 µs of a pyzmq echo's 80 on a VM, where a Unix socket's round trip takes 17.
A daemon started by its master (a local worker: its Unix socket folder admits that process
alone) also listens on `lane` in that folder; after the session's Hello on ZeroMQ, the
master sends its batches and reads its replies there. Heartbeats stay on ZeroMQ.

A message is its frame count and the frames' lengths (uint32, little-endian), then the
frames. The master writes blocking (a lane is one thread's at a time, under the node's
locks); the daemon's socket thread never blocks: what the socket does not take waits in
the lane's outbox until it is writable.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time

import zmq

_COUNT = struct.Struct("<I")
_SIZES = [struct.Struct(f"<{n}I") for n in range(5)]
_READ_BYTES = 1 << 18  # one read's most: a 64 KiB inline array's message whole
_IOV_MAX = 512  # buffers one sendmsg takes at most (Linux allows 1024)
_POLLIN, _POLLOUT = select.POLLIN, select.POLLOUT
BIND, BOUND = b"mwrt-lane", b"mwrt-lane-bound"  # the first message and its answer


CONNECTION_CLOSED = "its connection closed (the worker process died or was stopped)"


class LaneClosed(ConnectionError):
    """The other end closed the lane (its process stopped, or it let the session go)."""


def _sizes(count: int) -> struct.Struct:
    return _SIZES[count] if count < len(_SIZES) else struct.Struct(f"<{count}I")


def header(frames) -> bytes:
    """A message's header: its frame count and their lengths."""
    sizes = [memoryview(f).nbytes for f in frames]
    return _COUNT.pack(len(sizes)) + _sizes(len(sizes)).pack(*sizes)


class Lane:
    """One end of a lane (see the module's doc): framing, an inbox of bytes read but not
    yet taken as messages, and (the daemon's end) an outbox of bytes not yet written."""

    def __init__(self, sock: socket.socket, max_bytes: int | None = None):
        sock.setblocking(False)
        self.sock, self.fd = sock, sock.fileno()
        self.max_bytes = max_bytes  # the most a frame may hold (the daemon's bound)
        self._in: bytes | bytearray = b""
        self._pos = 0
        self.outbox: list = []  # memoryviews not written yet
        self.closed = False
        # The daemon's end, once bound: its session's reply identity and its batches' sender.
        self.identity = self.sender = b""

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()

    # -- reading --------------------------------------------------------------------------

    def message(self) -> list | None:
        """The next whole message read so far (its frames, as bytes), or None."""
        buf, pos = self._in, self._pos
        left = len(buf) - pos
        if left < 4:
            return None
        (count,) = _COUNT.unpack_from(buf, pos)
        start = pos + 4 + 4 * count
        if len(buf) < start:
            return None
        sizes = _sizes(count).unpack_from(buf, pos + 4)
        end = start + sum(sizes)
        if self.max_bytes is not None and end - start > self.max_bytes + 4096 * (count + 1):
            raise LaneClosed(f"lane: a message of {end - start} bytes (at most "
                             f"{self.max_bytes} expected)")
        if len(buf) < end:
            return None
        frames = []
        for size in sizes:
            frames.append(bytes(buf[start:start + size]))
            start += size
        if end == len(buf):
            self._in, self._pos = b"", 0
        else:
            self._pos = end
        return frames

    def fill(self) -> bool:
        """Read what the socket holds now (never waiting); True if anything came. A closed
        lane raises LaneClosed."""
        try:
            data = self.sock.recv(_READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise LaneClosed(f"lane: {exc}") from None
        if not data:
            raise LaneClosed("lane: closed by the other end")
        buf, pos = self._in, self._pos
        if pos == len(buf):
            self._in, self._pos = data, 0
        elif type(buf) is bytearray:
            if pos > len(buf) >> 1:  # taken messages dropped now and then: linear in all
                del buf[:pos]
                self._pos = 0
            buf += data
        else:
            self._in = bytearray(memoryview(buf)[pos:])
            self._in += data
            self._pos = 0
        return True

    def unread(self) -> int:
        """Bytes read from the socket and not yet taken as messages."""
        return len(self._in) - self._pos

    def ready(self) -> bool:
        """Whether a whole message is here, reading what the socket holds first if not."""
        if self.message_waiting():
            return True
        return self.fill() and self.message_waiting()

    def message_waiting(self) -> bool:
        """Whether the inbox holds a whole message (read, not yet taken)."""
        buf, pos = self._in, self._pos
        if len(buf) - pos < 4:
            return False
        (count,) = _COUNT.unpack_from(buf, pos)
        start = pos + 4 + 4 * count
        return len(buf) >= start and len(buf) >= start + sum(
            _sizes(count).unpack_from(buf, pos + 4))

    def recv(self, timeout: float) -> list:
        """The next message's frames, waiting up to `timeout` seconds: zmq.Again if none
        came by then (as a ZeroMQ socket's read with RCVTIMEO), LaneClosed if it closed."""
        found = self.message()
        if found is not None:
            return found
        deadline = time.monotonic() + timeout
        while True:
            if self.fill():
                found = self.message()
                if found is not None:
                    return found
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not _wait(self.fd, _POLLIN, left):
                raise zmq.Again()

    # -- writing --------------------------------------------------------------------------

    def send(self, frames, timeout: float) -> None:
        """Write one message whole, waiting up to `timeout` for room (the master's end);
        TimeoutError if the daemon took none of it for that long."""
        views = [memoryview(header(frames)), *[memoryview(f) for f in frames]]
        while views:
            try:
                sent = self.sock.sendmsg(views[:_IOV_MAX])
            except (BlockingIOError, InterruptedError):
                if not _wait(self.fd, _POLLOUT, timeout):
                    raise TimeoutError(f"lane: the worker read nothing for {timeout} s") from None
                continue
            except OSError as exc:
                raise LaneClosed(f"lane: {exc}") from None
            _consume(views, sent)

    def post(self, frames) -> None:
        """Write one message, or as much as the socket takes now and the rest later
        (flush(), when it is writable): the daemon's end, which never waits."""
        self.outbox.append(memoryview(header(frames)))
        self.outbox.extend([memoryview(f) for f in frames])
        if len(self.outbox) == len(frames) + 1:  # nothing was waiting before it
            self.flush()

    def flush(self) -> bool:
        """Write what the outbox holds, as far as the socket takes it; True once empty."""
        box = self.outbox
        while box:
            try:
                sent = self.sock.sendmsg(box[:_IOV_MAX])
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.EBADF):
                    box.clear()  # its master is gone: the read side says so
                    return True
                raise
            _consume(box, sent)
        return True


def _consume(views: list, sent: int) -> None:
    """Drop `sent` bytes off the front of `views`."""
    while sent:
        size = views[0].nbytes
        if sent >= size:
            views.pop(0)
            sent -= size
        else:
            views[0] = views[0][sent:]
            sent = 0
    while views and not views[0].nbytes:
        views.pop(0)


def _wait(fd: int, events: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `fd` to be readable or writable (`events`)."""
    poll = select.poll()
    poll.register(fd, events | select.POLLHUP)
    return bool(poll.poll(max(timeout, 0) * 1000))


def open_lane(path: str, sid: bytes, timeout: float) -> Lane | None:
    """A lane to the daemon listening at `path`, bound to session `sid` (whose Hello it
    answered); None if it has none or does not bind it (the session keeps ZeroMQ)."""
    if not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        lane = Lane(sock)
        lane.send([BIND, sid], timeout)
        answer = lane.recv(timeout)
    except (OSError, zmq.Again):
        sock.close()
        return None
    if answer != [BOUND]:
        lane.close()
        return None
    return lane
