"""Exact reads from stream sockets, shared by the handshake, the store and the channels."""

from __future__ import annotations

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
