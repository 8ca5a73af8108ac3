"""A lane: a master's batches and a local daemon's replies over one Unix stream socket.

ZeroMQ hands every message to an I/O thread on each side: four thread wake-ups a round
trip, most of a pyzmq echo's 60-90 µs on a VM, where a bare Unix socket's echo takes 6-17.
A daemon started by its master (a local worker: its Unix socket folder admits that process
alone) also listens on `lane` in that folder; after the session's Hello on ZeroMQ, the
master sends its batches and reads its replies there. Heartbeats stay on ZeroMQ.

Each frame of a message is its length (uint64, little-endian; the top bit set where
another frame of the message follows), then its bytes. The master writes blocking (a
lane is one thread's at a time, under the node's locks); the daemon's socket thread never
blocks: what the socket does not take waits in the lane's outbox until it is writable.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time

import zmq

from ..procs import defer_interrupts

_LENGTH = struct.Struct("<Q")
_MORE = 1 << 63  # in a frame's length word: another frame of the message follows
_pack, _unpack = _LENGTH.pack, _LENGTH.unpack_from
_READ_BYTES = 1 << 18  # one read's most: a 64 KiB inline array's message whole
_JOINED_BYTES = 1 << 16  # a frame up to this size goes out joined to its length: one copy
_IOV_MAX = 512  # buffers one sendmsg takes at most (Linux allows 1024)
_POLLOUT = select.POLLOUT
# A system call's result must never be lost to an exception that a signal handler
# raises (a Ctrl-C, where ipykernel's handler holds none back as mwrt's does): Python raises
# it as a call returns, before its result is stored. list.extend(map(call, args)) stores the
# result in C, where no handler runs, so the bytes a read took or the count a write sent
# are kept, and the lane's framing stays whole.
_READ_ARGS = (_READ_BYTES,)
_NOSIGNALS, _NO_ANCILLARY = (socket.MSG_NOSIGNAL,), ((),)
_ROOM_SLICE = 0.05  # s: a write waiting for room calls its check this often (a lost worker)
# A write to a lane whose other end died fails with EPIPE and never raises SIGPIPE, which
# would kill a program that restored its default action (a CLI piped to `head` does).
_NOSIGNAL = socket.MSG_NOSIGNAL
_GONE = (errno.EPIPE, errno.ECONNRESET, errno.EBADF, errno.ENOTCONN)
BIND, BOUND = b"mwrt-lane", b"mwrt-lane-bound"  # the first message and its answer
CONNECTION_CLOSED = "its connection closed (the worker process died or was stopped)"


class LaneClosed(ConnectionError):
    """The other end closed the lane (its process stopped, or it let the session go)."""


def _views(frames) -> list:
    """A message's buffers as written: each frame's length word, then its bytes."""
    views: list = []
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        view = memoryview(frame)
        views.append(_pack(view.nbytes | (_MORE if i < last else 0)))
        views.append(view)
    return views


class Lane:
    """One end of a lane (see the module's doc): framing, an inbox of bytes read but not
    yet taken as messages, and (the daemon's end) an outbox of bytes not yet written."""

    def __init__(self, sock: socket.socket, max_bytes: int | None = None):
        sock.setblocking(False)
        self.sock, self.fd = sock, sock.fileno()
        self.max_bytes = max_bytes or 1 << 62  # the most a frame may hold (the daemon's bound)
        self._in: bytes | bytearray = b""
        self._pos = 0
        self.outbox: list = []  # buffers not written yet (the daemon's end)
        # The master's end: the rest of the message being sent, and whether a Ctrl-C cut its
        # send where that rest was known (send()); else the batch's fate is unknown.
        self.unsent: list = []
        self.cut = False
        self.began = 0  # messages whose write began (a batch's fate, after a Ctrl-C)
        self._counts: list = []  # a write's count (see _READ_ARGS)
        self._got: list = []  # bytes read, not yet merged into _in (see _READ_ARGS)
        self._readable = select.poll()  # (made once: a wait for a reply is on the hot path)
        self._readable.register(self.fd, select.POLLIN)
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
        """The next whole message read so far (its frames), or None."""
        if self._got:
            self._merge()
        buf, pos = self._in, self._pos
        end = len(buf)
        if end - pos < 8:
            return None
        (word,) = _unpack(buf, pos)
        if word <= self.max_bytes:  # one frame (no _MORE bit): nearly every message
            start, pos = pos + 8, pos + 8 + word
            if pos > end:
                return None
            found = [buf[start:pos] if type(buf) is bytes else bytes(memoryview(buf)[start:pos])]
            if pos == end:  # (taken after it is copied: no call from here to the return)
                self._in, self._pos = b"", 0
            else:
                self._pos = pos
            return found
        return self._frames(buf, pos, end)

    def _frames(self, buf, pos: int, end: int) -> list | None:
        """message() of several frames (or of one too large)."""
        frames = []
        while True:
            if end - pos < 8:
                return None
            (word,) = _unpack(buf, pos)
            size, start = word & ~_MORE, pos + 8
            if size > self.max_bytes:
                raise LaneClosed(f"lane: a frame of {size} bytes (at most {self.max_bytes} "
                                 "expected)")
            pos = start + size
            if pos > end:
                return None
            frames.append(buf[start:pos] if type(buf) is bytes else
                          bytes(memoryview(buf)[start:pos]))
            if not word & _MORE:
                break
        if pos == end:
            self._in, self._pos = b"", 0
        else:
            self._pos = pos
        return frames

    def fill(self) -> bool:
        """Read what the socket holds now (never waiting); True if anything came. A closed
        lane raises LaneClosed."""
        got = self._got
        try:  # (the bytes land in `got` in C, kept there until _merge: see _READ_ARGS)
            got.extend(map(self.sock.recv, _READ_ARGS))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise LaneClosed(f"lane: {exc}") from None
        if not got[-1]:
            raise LaneClosed("lane: closed by the other end")
        self._merge()
        return True

    def _merge(self) -> None:
        """Add the bytes read (`_got`) to those not yet taken, in one store: an exception a
        signal's handler raises lands before it (they stay in `_got`) or after it."""
        buf, pos, got = self._in, self._pos, self._got
        data = got[0] if len(got) == 1 else b"".join(got)
        if pos == len(buf):
            self._in, self._pos, self._got = data, 0, []
            return
        if type(buf) is bytes or pos > len(buf) >> 1:  # (taken messages dropped now and then)
            buf, pos = bytearray(memoryview(buf)[pos:]), 0  # a copy: nothing changed yet
        buf += data  # (no call from here to the store)
        self._in, self._pos, self._got = buf, pos, []

    def unread(self) -> int:
        """Bytes read from the socket and not yet taken as messages."""
        if self._got:
            self._merge()
        return len(self._in) - self._pos

    def whole(self) -> bool:
        """Whether the bytes read hold a whole message not yet taken."""
        buf, pos, end = self._in, self._pos, len(self._in)
        while end - pos >= 8:
            (word,) = _unpack(buf, pos)
            pos += 8 + (word & ~_MORE)
            if pos > end:
                return False
            if not word & _MORE:
                return True
        return False

    def take(self) -> list | None:
        """The next whole message, reading what the socket holds first if none is here
        (never waiting); None if none came."""
        if self._pos != len(self._in) or self._got:
            found = self.message()
            if found is not None:
                return found
        return self.message() if self.fill() else None

    def recv(self, timeout: float) -> list:
        """The next message's frames, waiting up to `timeout` seconds: zmq.Again if none
        came by then (as a ZeroMQ socket's read with RCVTIMEO), LaneClosed if it closed."""
        found = self.take()
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
            if left <= 0 or not _wait(self._readable, left):
                raise zmq.Again()

    # -- writing --------------------------------------------------------------------------

    def send(self, frames, timeout: float, check=None) -> None:
        """Write one message whole, after the rest of one a Ctrl-C cut (the master's end),
        waiting up to `timeout` for room, calling `check` now and then meanwhile (what it
        raises ends the wait); TimeoutError if the daemon took none of it for that long. A
        KeyboardInterrupt as it waits for room sets `cut`: the message is sent all the
        same, its rest left in `unsent` for finish() (or the next send)."""
        if self.unsent:
            self.finish(timeout, check)
        if len(frames) == 1 and len(frames[0]) <= _JOINED_BYTES:  # a batch: one write
            data = _pack(len(frames[0])) + frames[0]
            counts = self._counts
            del counts[:]  # (no call from here to the write's: no handler runs in between)
            self.began += 1
            try:  # (the count lands in `counts` in C: see _READ_ARGS)
                counts.extend(map(self.sock.send, (data,), _NOSIGNALS))
            except (BlockingIOError, InterruptedError):
                counts.append(0)
            except OSError as exc:
                raise LaneClosed(f"lane: {exc}") from None
            except BaseException:  # as the write returned: the rest goes next, as in finish()
                self.unsent, self.cut = [memoryview(data)[counts[0] if counts else 0:]], True
                raise
            if counts[0] == len(data):
                return
            self.unsent = [memoryview(data)[counts[0]:]]
        else:
            views = _views(frames)
            self.unsent = views  # (its bytes were not yet sent: with no call in between)
            self.began += 1
        self.finish(timeout, check)

    def finish(self, timeout: float, check=None) -> None:
        """Write the rest of the message send() began, waiting up to `timeout` for room."""
        views, counts = self.unsent, self._counts
        while views:
            del counts[:]
            try:  # (the count lands in `counts` in C: see _READ_ARGS)
                counts.extend(map(self.sock.sendmsg, (views[:_IOV_MAX],), _NO_ANCILLARY,
                                  _NOSIGNALS))
            except (BlockingIOError, InterruptedError):
                try:
                    room = _room(self.fd, timeout, check)
                except BaseException:  # (a Ctrl-C) `unsent` is what the socket has not taken
                    self.cut = True
                    raise
                if not room:
                    raise TimeoutError(f"lane: the worker read nothing for {timeout} s") from None
                continue
            except OSError as exc:
                raise LaneClosed(f"lane: {exc}") from None
            except BaseException:  # as the write returned: `unsent` is what it left
                if counts:
                    _consume(views, counts[0])
                self.cut = True
                raise
            _consume(views, counts[0])

    def post(self, frames) -> None:
        """Write one message, or as much as the socket takes now and the rest later
        (flush(), when it is writable): the daemon's end, which never waits."""
        if not self.outbox and len(frames) == 1:  # a reply: one write, nearly always whole
            view = memoryview(frames[0])
            data = _pack(view.nbytes) + view
            try:
                sent = self.sock.send(data, _NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                if exc.errno in _GONE:  # its master is gone: the read side says so
                    return
                raise
            if sent < len(data):
                self.outbox.append(memoryview(data)[sent:])
            return
        self.outbox.extend(_views(frames))
        self.flush()

    def flush(self) -> bool:
        """Write what the outbox holds, as far as the socket takes it; True once empty."""
        box = self.outbox
        while box:
            try:
                sent = self.sock.sendmsg(box[:_IOV_MAX], (), _NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                if exc.errno in _GONE:
                    box.clear()  # its master is gone: the read side says so
                    return True
                raise
            _consume(box, sent)
        return True


def _consume(views: list, sent: int) -> None:
    """Drop `sent` bytes off the front of `views`, and the empty buffers at its front."""
    while sent:
        size = memoryview(views[0]).nbytes
        if sent >= size:
            views.pop(0)
            sent -= size
        else:
            views[0] = memoryview(views[0])[sent:]
            sent = 0
    while views and not memoryview(views[0]).nbytes:
        views.pop(0)


def _wait(poll, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `poll` to fire (a frame of its own: a Ctrl-C lands
    here, where the lane's bytes are all accounted for)."""
    return bool(poll.poll(timeout * 1000))


def _room(fd: int, timeout: float, check) -> bool:
    """Wait up to `timeout` seconds for `fd` to take more bytes, calling `check` (if given)
    every _ROOM_SLICE meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if _writable(fd, left if check is None else min(left, _ROOM_SLICE)):
            return True
        if left <= _ROOM_SLICE or check is None:
            return False
        check()


def _writable(fd: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `fd` to take more bytes."""
    poll = select.poll()
    poll.register(fd, _POLLOUT)
    return bool(poll.poll(max(timeout, 0) * 1000))


# A Ctrl-C is held back while these run (procs.interrupt_handler): landing between a system
# call and the count of what it moved, it would drop bytes read or leave the count of those
# written unknown, and the next message would be framed from the middle of another.
defer_interrupts(Lane.message, Lane._frames, Lane.fill, Lane._merge, Lane.take, Lane.recv,
                 Lane.send, Lane.finish, _views, _consume)


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
