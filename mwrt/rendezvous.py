"""Key-value stores through which ranks find each other (torch.distributed's Store API).

HashStore (threads of one process), TCPStore (served by rank 0), FileStore (one host), the
init methods env://, tcp://host:port and file:///path, and the rank rendezvous that names
missing and duplicate ranks.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import threading
import time
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import msgpack

from . import config
from .errors import RendezvousError, RendezvousTimeoutError, WireError


def as_bytes(value) -> bytes:
    """Store values are bytes; str is UTF-8 encoded."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store value: expected bytes or str, got {type(value).__name__}")


class Store:
    """Contract: set/get (get waits for the key)/add/compare_set/wait/delete_key/check."""

    timeout: float = 300.0

    def set(self, key: str, value) -> None:
        raise NotImplementedError

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of `key`, waiting up to `timeout` seconds for it to be set."""
        raise NotImplementedError

    def add(self, key: str, amount: int) -> int:
        """Add `amount` to the integer at `key` (0 if absent) and return the new value."""
        raise NotImplementedError

    def compare_set(self, key: str, expected, desired) -> bytes:
        """Set `key` to `desired` if it holds `expected` (or is absent and expected is b'')."""
        raise NotImplementedError

    def wait(self, keys, timeout: float | None = None) -> None:
        """Wait until every key in `keys` is set; the error lists the missing ones."""
        raise NotImplementedError

    def delete_key(self, key: str) -> bool:
        raise NotImplementedError

    def check(self, keys) -> bool:
        """True if every key in `keys` is set, without waiting."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class HashStore(Store):
    """An in-process store for ranks that are threads of one process."""

    def __init__(self, timeout: float | None = None):
        self.timeout = config.get("channel_timeout") if timeout is None else float(timeout)
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key, value):
        with self._cond:
            self._data[key] = as_bytes(value)
            self._cond.notify_all()

    def get(self, key, timeout=None):
        self.wait([key], timeout)
        with self._cond:
            return self._data[key]

    def add(self, key, amount):
        with self._cond:
            value = int(self._data.get(key, b"0")) + int(amount)
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def compare_set(self, key, expected, desired):
        with self._cond:
            current = self._data.get(key)
            if current == as_bytes(expected) or (current is None and as_bytes(expected) == b""):
                self._data[key] = as_bytes(desired)
                self._cond.notify_all()
            return self._data.get(key, as_bytes(expected))

    def wait(self, keys, timeout=None):
        timeout = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousTimeoutError(
                        f"store: keys not set after {timeout} s (missing: {missing})"
                    )
                self._cond.wait(left)

    def delete_key(self, key):
        with self._cond:
            return self._data.pop(key, None) is not None

    def check(self, keys):
        with self._cond:
            return all(k in self._data for k in keys)

    def num_keys(self) -> int:
        with self._cond:
            return len(self._data)


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


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k
    return bytes(buf)


def _recv_frame(sock: socket.socket):
    (n,) = _FRAME.unpack(_recv_exact(sock, 4))
    if n > _MAX_FRAME:
        raise WireError(f"TCPStore: frame of {n} bytes exceeds the {_MAX_FRAME}-byte limit")
    return msgpack.unpackb(_recv_exact(sock, n), raw=False)


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
                 generation: int | None = None):
        # generation: ranks that re-init on the same port pass their init count, so a client
        # never talks to the previous init's server while rank 0 is replacing it.
        self.host, self.world_size, self.generation = host, world_size, generation
        self.timeout = _seconds(timeout, config.get("rendezvous_timeout"))
        self._server = _StoreServer(host, port, generation) if is_master else None
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


def _seconds(timeout, default) -> float:
    """Accept seconds or a timedelta (torch passes timedeltas)."""
    if timeout is None:
        return float(default)
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


# -- FileStore ---------------------------------------------------------------------------
#
# An append-only log of records (key, value) in one file, locked with flock for each
# operation, so processes on one host (or a shared file system with working locks) agree.
# Readers parse only what was appended since their last read. The last user to close it
# deletes the file, so the next init on the same path starts empty.

_REC = struct.Struct("<II")
_DELETED = 0xFFFFFFFF


class FileStore(Store):
    """A store in a file shared by processes on one host."""

    def __init__(self, path: str, world_size: int = -1, timeout: float | None = None):
        self.path, self.world_size = os.fspath(path), world_size
        self.timeout = _seconds(timeout, config.get("rendezvous_timeout"))
        self._data: dict[str, bytes] = {}
        self._offset = 0
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._lock = threading.Lock()
        self.add("__users__", 1)

    def _locked(self, fn):
        with self._lock:
            if self._fd is None:
                raise RendezvousError(f"FileStore {self.path}: store is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._refresh()
                return fn()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _refresh(self):
        size = os.fstat(self._fd).st_size
        if size < self._offset:  # the file was truncated or replaced: start over
            self._data, self._offset = {}, 0
        if size == self._offset:
            return
        raw = os.pread(self._fd, size - self._offset, self._offset)
        pos = 0
        while pos + _REC.size <= len(raw):
            klen, vlen = _REC.unpack_from(raw, pos)
            end = pos + _REC.size + klen + (0 if vlen == _DELETED else vlen)
            if end > len(raw):
                break  # a record still being written (cannot happen under the lock)
            key = raw[pos + _REC.size:pos + _REC.size + klen].decode()
            if vlen == _DELETED:
                self._data.pop(key, None)
            else:
                self._data[key] = raw[pos + _REC.size + klen:end]
            pos = end
        self._offset += pos

    def _append(self, key: str, value: bytes | None):
        k = key.encode()
        rec = _REC.pack(len(k), _DELETED if value is None else len(value)) + k + (value or b"")
        os.pwrite(self._fd, rec, os.fstat(self._fd).st_size)
        self._refresh()

    def set(self, key, value):
        self._locked(lambda: self._append(key, as_bytes(value)))

    def get(self, key, timeout=None):
        self.wait([key], timeout)
        return self._locked(lambda: self._data[key])

    def add(self, key, amount):
        def op():
            value = int(self._data.get(key, b"0")) + int(amount)
            self._append(key, str(value).encode())
            return value
        return self._locked(op)

    def compare_set(self, key, expected, desired):
        expected, desired = as_bytes(expected), as_bytes(desired)

        def op():
            current = self._data.get(key)
            if current == expected or (current is None and expected == b""):
                self._append(key, desired)
            return self._data.get(key, expected)
        return self._locked(op)

    def wait(self, keys, timeout=None):
        timeout = self.timeout if timeout is None else float(timeout)
        deadline, pause = time.monotonic() + timeout, 0.001
        while True:
            missing = self._locked(lambda: [k for k in keys if k not in self._data])
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise RendezvousTimeoutError(
                    f"FileStore {self.path}: keys not set after {timeout} s (missing: {missing})")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)  # a file has no wake-up: poll, backing off

    def check(self, keys):
        return self._locked(lambda: all(k in self._data for k in keys))

    def delete_key(self, key):
        def op():
            present = key in self._data
            if present:
                self._append(key, None)
            return present
        return self._locked(op)

    def num_keys(self):
        return self._locked(lambda: len(self._data) - 1)

    def close(self):
        if self._fd is None:
            return
        try:
            left = self.add("__users__", -1)
            if left <= 0:
                os.unlink(self.path)
        except (OSError, RendezvousError):
            pass
        with self._lock:
            fd, self._fd = self._fd, None
        os.close(fd)


# -- init methods ------------------------------------------------------------------------


def _env_int(name: str, given: int, what: str) -> int:
    if given is not None and given >= 0:
        return given
    raw = os.environ.get(name)
    if raw is None or raw == "":
        raise RendezvousError(
            f"env://: {what} not given and {name} is not set; pass {what}= or run under "
            "mwrt-launch (or dist.spawn), which set it")
    try:
        return int(raw)
    except ValueError:
        raise RendezvousError(f"env://: {name} is not an int (got {raw!r})") from None


def store_from_url(init_method: str | None, rank: int = -1, world_size: int = -1,
                   timeout=None, generation: int | None = None) -> tuple[Store, int, int]:
    """Parse `env://`, `tcp://host:port` or `file:///path` into (store, rank, world_size)."""
    url = urlparse(init_method or "env://")
    query = parse_qs(url.query)
    if rank is None or rank < 0:
        rank = int(query["rank"][0]) if "rank" in query else rank
    if world_size is None or world_size < 0:
        world_size = int(query["world_size"][0]) if "world_size" in query else world_size
    if url.scheme == "env":
        rank = _env_int("RANK", rank, "rank")
        world_size = _env_int("WORLD_SIZE", world_size, "world_size")
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        port = _env_int("MASTER_PORT", None, "the master port")
    elif url.scheme == "tcp":
        if not url.hostname or url.port is None:
            raise RendezvousError(f"init_method: tcp:// needs host:port (got {init_method!r}); "
                                  "e.g. tcp://127.0.0.1:29500")
        host, port = url.hostname, url.port
    elif url.scheme == "file":
        if not url.path:
            raise RendezvousError(f"init_method: file:// needs a path (got {init_method!r})")
    else:
        raise RendezvousError(f"init_method: unknown scheme {url.scheme!r} in {init_method!r} "
                              "(known: env://, tcp://host:port, file:///path)")
    if rank < 0 or world_size < 1 or rank >= world_size:
        raise RendezvousError(f"init_method {init_method!r}: rank must be in [0, world_size) "
                              f"(got rank={rank}, world_size={world_size}); pass both")
    if url.scheme == "file":
        return FileStore(url.path, world_size, timeout=timeout), rank, world_size
    store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                     generation=generation)
    return store, rank, world_size


def rendezvous(store: Store, rank: int, world_size: int, *, prefix: str = "mwrt",
               timeout: float | None = None) -> dict[int, tuple[str, int]]:
    """Register rank -> (hostname, pid) and wait for every rank; returns the table."""
    timeout = store.timeout if timeout is None else float(timeout)
    # The nonce tells two claimants apart even within one process; messages show host pid.
    me = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
    err_key = f"{prefix}/rdzv/error"
    got = store.compare_set(f"{prefix}/rdzv/{rank}", b"", me).decode()
    if got != me:
        msg = (f"rendezvous: rank {rank} was claimed twice (by {_who(got)} and by {_who(me)}); "
               "give each process its own RANK")
        store.set(err_key, msg)
        raise RendezvousError(msg)
    keys = [f"{prefix}/rdzv/{r}" for r in range(world_size)]
    deadline = time.monotonic() + timeout
    while True:
        try:
            store.wait(keys, timeout=max(0.0, min(0.2, deadline - time.monotonic())))
            break
        except RendezvousTimeoutError:
            pass
        if store.check([err_key]):
            raise RendezvousError(store.get(err_key).decode())
        if time.monotonic() >= deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise RendezvousTimeoutError(
                f"rendezvous: ranks {missing} of world size {world_size} did not join within "
                f"{timeout} s (rank {rank} waited); start them, or check that they use the same "
                "init_method / MASTER_ADDR:MASTER_PORT and WORLD_SIZE")
    table = {}
    for r, k in enumerate(keys):
        host, pid, _ = store.get(k).decode().rsplit(":", 2)
        table[r] = (host, int(pid))
    return table


def _who(identity: str) -> str:
    host, pid, _ = identity.rsplit(":", 2)
    return f"host {host} pid {pid}"
