"""TCPStore: a key-value store served by one process (rank 0) over a TCP socket.

Every connection first proves the job's secret (the HMAC challenge of protocol.auth, both
ways); then requests and replies are msgpack frames with a length prefix, and `wait`/`get`
block on the server side up to the caller's timeout. The server lives in store.tcp_store_server.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from .. import config
from ..errors import AuthError, QuotaError, RendezvousError, RendezvousTimeoutError, WireError
from ..protocol.auth import client_handshake
from .stores import Store, as_bytes
from .tcp_store_server import (
    HANDSHAKE_SECONDS,
    StoreServer,
    check_secure,
    frame_limit,
    recv_frame,
    send_frame,
)

# -- TCPStore ----------------------------------------------------------------------------
#
# One server thread (in the master rank) holds a dict; every rank, the master included, is a
# client. A frame is a 4-byte big-endian length then a msgpack list: decoding never runs code.
# Requests: [op, key, arg, arg2]; replies: ["ok", value] or ["err", kind, message].


class TCPStore(Store):
    """A store served by the master rank over TCP; every rank (master included) is a client."""

    def __init__(self, host: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout: float | None = None,
                 generation: int | None = None, bind: str | None = None,
                 key: bytes | None = None):
        # generation: ranks that re-init on the same port pass their init count, so a client
        # never talks to the previous init's server while rank 0 is replacing it. bind: where
        # the master's server listens, when not at `host` (every interface: "0.0.0.0").
        # key: the job's secret (auth.job_secret()); None: loopback only, or MWRT_INSECURE=1.
        self.host, self.world_size, self.generation = host, world_size, generation
        self.timeout = config.seconds(timeout, config.get("rendezvous_timeout"),
                                      "TCPStore: timeout")
        self._key = key
        # Who this client is to the server, which binds the keys it writes to this claim.
        self._claim = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(8).hex()}".encode()
        self._server = None
        check_secure(host, key, "TCPStore")
        if is_master:
            self._server = StoreServer(bind or host, port, generation, key, world_size)
        self.port = self._server.port if self._server else int(port)
        self._lock = threading.Lock()
        self._free: list[socket.socket] = []
        self._closed = False
        try:
            self._free.append(self._connect())
        except BaseException:
            self.close()
            raise

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.timeout
        while True:
            sock = None
            try:
                sock = socket.create_connection((self.host, self.port), timeout=2.0)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                client_handshake(sock, self._key, min(self.timeout, HANDSHAKE_SECONDS) or 1.0,
                                 self._claim, f"TCPStore {self.host}:{self.port}")
                send_frame(sock, ["hello", "", self.generation, None])
                if recv_frame(sock, frame_limit())[0] == "ok":
                    return sock
                e = f"the server there belongs to another init than generation {self.generation}"
            except AuthError as exc:
                if sock is not None:
                    sock.close()
                raise AuthError(f"{exc}; this job's store is at {self.host}:{self.port} (is "
                                "MWRT_JOB_SECRET or MWRT_KEY_FILE the same on every rank?)"
                                ) from None
            except (OSError, WireError) as exc:
                e = str(exc)
            if sock is not None:
                sock.close()
            if time.monotonic() >= deadline:
                raise RendezvousTimeoutError(
                    f"TCPStore: could not connect to {self.host}:{self.port} within "
                    f"{self.timeout} s ({e}); is rank 0 running, and are MASTER_ADDR and "
                    "MASTER_PORT the same on every rank?") from None
            time.sleep(0.05)

    def _call(self, op, key, a=None, b=None, wait: float = 0.0):
        # A pool of connections: a get blocked waiting for a key must not hold up a set
        # from another thread of this process.
        with self._lock:
            if self._closed:
                raise RendezvousError(f"TCPStore {self.host}:{self.port}: store is closed")
            sock = self._free.pop() if self._free else None
        try:
            sock = sock or self._connect()
            sock.settimeout(wait + 30.0)
            send_frame(sock, [op, key, a, b])
            reply = recv_frame(sock, frame_limit())
        except (OSError, WireError) as e:
            if sock is not None:
                sock.close()
            raise RendezvousError(
                f"TCPStore: lost the store at {self.host}:{self.port} during {op} {key!r} "
                f"({e}); rank 0, which serves it, has probably exited") from None
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._free.append(sock)
        if reply[0] == "ok":
            return reply[1]
        if reply[1] == "timeout":
            raise RendezvousTimeoutError(reply[2])
        if reply[1] == "quota":
            raise QuotaError(reply[2])
        raise RendezvousError(reply[2])

    def _wait(self, timeout, what: str) -> float:
        return config.seconds(timeout, self.timeout, f"TCPStore.{what}: timeout")

    def set(self, key, value):
        self._call("set", key, as_bytes(value))

    def get(self, key, timeout=None):
        t = self._wait(timeout, "get")
        return self._call("get", key, t, wait=t)

    def add(self, key, amount):
        return self._call("add", key, int(amount))

    def compare_set(self, key, expected, desired):
        return self._call("cas", key, as_bytes(expected), as_bytes(desired))

    def wait(self, keys, timeout=None):
        t = self._wait(timeout, "wait")
        self._call("wait", list(keys), t, wait=t)

    def check(self, keys):
        return self._call("check", list(keys))

    def delete_key(self, key):
        return self._call("del", key)

    def num_keys(self):
        return self._call("num", "")

    def close(self):
        with self._lock:
            self._closed, free, self._free = True, self._free, []
        for sock in free:
            sock.close()
        if self._server is not None:
            self._server.close()
            self._server = None
