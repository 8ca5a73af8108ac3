"""Exact reads from stream sockets, shared by the handshake, the store and the channels;
and the pipe that wakes a poll loop to stop it."""

from __future__ import annotations

import os
import socket


def recv_exact(sock: socket.socket, n: int, what: str = "a message") -> bytes:
    """Read exactly `n` bytes; ConnectionError naming `what` if the peer closes first."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes of {what}")
        got += k
    return bytes(buf)


class Waker:
    """A pipe whose read end `fd` a poll loop watches (zmq.Poller or select), so that a stop
    asked from a signal handler or another thread ends its wait at once, not at its timeout."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def wake(self) -> None:
        try:
            os.write(self._write, b"\0")
        except OSError:  # full: woken already; closed (-1): its loop has ended
            pass

    def close(self) -> None:
        """Close the pipe; a wake() after this writes to -1, never to a reused descriptor."""
        fds, self.fd, self._write = (self.fd, self._write), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)
