"""TCPStore: a key-value store served by one process (rank 0) over a TCP socket.

Requests and replies are msgpack frames with a length prefix; the server runs one thread
per client, and `wait`/`get` block on the server side up to the caller's timeout.
"""

from __future__ import annotations

import errno
import socket
import struct
import threading
import time

import msgpack

from .. import config
from ..errors import RendezvousError, RendezvousTimeoutError, WireError
from ..netio import recv_exact
from .stores import HashStore, Store, _seconds, as_bytes

# -- TCPStore ----------------------------------------------------------------------------
#
# One server thread (in the master rank) holds a dict; every rank, the master included, is a
# client. A frame is a 4-byte big-endian length then a msgpack list: decoding never runs code.
# Requests: [op, key, arg, arg2]; replies: ["ok", value] or ["err", kind, message].

_FRAME = struct.Struct(">I")
_MAX_FRAME = 64 << 20


def _send_frame(sock: socket.socket, obj) -> None:
    payload = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(_FRAME.pack(len(payload)) + payload)


def _recv_frame(sock: socket.socket):
    (n,) = _FRAME.unpack(recv_exact(sock, 4))
    if n > _MAX_FRAME:
        raise WireError(f"TCPStore: frame of {n} bytes exceeds the {_MAX_FRAME}-byte limit")
    return msgpack.unpackb(recv_exact(sock, n), raw=False)


class _StoreServer:
    """The master's side of a TCPStore: a listening socket and one thread per client."""

    def __init__(self, host: str, port: int, generation: int | None):
        self.store, self.generation = HashStore(timeout=3600.0), generation
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            if e.errno == errno.EADDRINUSE:
                raise RendezvousError(
                    f"TCPStore: port {port} on {host} is in use (another job or another rank 0 "
                    "holds it); pick a free MASTER_PORT, or port 0 for an ephemeral one"
                ) from None
            raise RendezvousError(f"TCPStore: cannot listen on {host}:{port}: {e}") from None
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, name="mwrt-store-accept", daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="mwrt-store-conn",
                             daemon=True).start()

    def _serve(self, conn):
        try:
            while True:
                _send_frame(conn, self._handle(_recv_frame(conn)))
        except (OSError, ConnectionError, WireError, ValueError, msgpack.UnpackException):
            conn.close()  # a client left or sent garbage: drop it, keep serving the others

    def _handle(self, req):
        if not isinstance(req, list) or len(req) != 4 or not isinstance(req[1], (str, list)):
            return ["err", "wire", f"TCPStore: malformed request {str(req)[:80]!r}"]
        op, key, a, b = req
        s = self.store
        if op == "hello":  # a client of another init (generation) on the same port: refuse it
            stale = None not in (a, self.generation) and a != self.generation
            return ["err", "stale", f"generation {self.generation}"] if stale else ["ok", None]
        try:
            if op == "set":
                s.set(key, a)
                return ["ok", None]
            if op == "get":
                return ["ok", s.get(key, timeout=a)]
            if op == "add":
                return ["ok", s.add(key, a)]
            if op == "cas":
                return ["ok", s.compare_set(key, a, b)]
            if op == "wait":
                s.wait(key, timeout=a)
                return ["ok", None]
            if op == "check":
                return ["ok", s.check(key)]
            if op == "del":
                return ["ok", s.delete_key(key)]
            if op == "num":
                return ["ok", s.num_keys()]
        except RendezvousTimeoutError as e:
            return ["err", "timeout", str(e)]
        except (TypeError, ValueError) as e:
            return ["err", "value", str(e)]
        return ["err", "wire", f"TCPStore: unknown request {op!r} (known: set get add cas wait "
                               "check del num)"]

    def close(self):
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for conn in list(self.conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


class TCPStore(Store):
    """A store served by the master rank over TCP; every rank (master included) is a client."""

    def __init__(self, host: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout: float | None = None,
                 generation: int | None = None, bind: str | None = None):
        # generation: ranks that re-init on the same port pass their init count, so a client
        # never talks to the previous init's server while rank 0 is replacing it. bind: where
        # the master's server listens, when not at `host` (every interface: "0.0.0.0").
        self.host, self.world_size, self.generation = host, world_size, generation
        self.timeout = _seconds(timeout, config.get("rendezvous_timeout"))
        self._server = _StoreServer(bind or host, port, generation) if is_master else None
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
            try:
                sock = socket.create_connection((self.host, self.port), timeout=2.0)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _send_frame(sock, ["hello", "", self.generation, None])
                if _recv_frame(sock)[0] == "ok":
                    return sock
                sock.close()
                e = f"the server there belongs to another init than generation {self.generation}"
            except (OSError, ConnectionError) as exc:
                e = exc
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
            _send_frame(sock, [op, key, a, b])
            reply = _recv_frame(sock)
        except (OSError, ConnectionError) as e:
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
        raise RendezvousError(reply[2])

    def set(self, key, value):
        self._call("set", key, as_bytes(value))

    def get(self, key, timeout=None):
        t = self.timeout if timeout is None else float(timeout)
        return self._call("get", key, t, wait=t)

    def add(self, key, amount):
        return self._call("add", key, int(amount))

    def compare_set(self, key, expected, desired):
        return self._call("cas", key, as_bytes(expected), as_bytes(desired))

    def wait(self, keys, timeout=None):
        t = self.timeout if timeout is None else float(timeout)
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
