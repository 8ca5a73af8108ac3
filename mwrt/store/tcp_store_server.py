"""The TCPStore server: admits only the job, binds values to their writer, parses defensively.

A connection first passes the HMAC challenge of `protocol.auth` with the job's secret (or
the public key of an unkeyed loopback store): no request byte is read before. Its claim
names the client (host, pid, a nonce), and a key created with set or compare_set belongs
to that client: another one cannot overwrite, add to or delete it, so a rank's address,
once published, is the rank's. Counters created by add stay shared (bound_store.py).

Every length is checked against MWRT_STORE_MAX_VALUE_BYTES before any byte is kept, and a
body is read as it arrives, so announcing a large frame costs nothing. A peer that has not
finished the challenge within a few seconds, or stalls in the middle of a frame, is cut off;
the connections served at once are capped. A peer that breaks these rules is disconnected
with one log line naming it (rate-limited); nothing it sends raises in a server thread.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import threading
import time

import msgspec

from .. import config
from ..errors import AuthError, RendezvousError, WireError
from ..netio import recv_exact
from ..protocol.auth import server_handshake
from ..protocol.refusals import PeerLog
from ..unkeyed import may_listen, refusal
from .bound_store import BoundStore, handle

log = logging.getLogger("mwrt.store")

_FRAME = struct.Struct(">I")
_CHUNK = 1 << 16
_OVERHEAD = 1 << 16  # a request's op, key and arguments beside its value
HANDSHAKE_SECONDS = 2.0  # to finish the challenge (one round trip), from the accept
FRAME_SECONDS = 30.0  # to finish a frame whose length has arrived
# Connections still in the challenge, in all and from one address: when either is reached,
# the oldest of that address's (or of the busiest one's) is cut off for the new one, so a
# stranger holds only its newest few slots, and a rank elsewhere always finds room. A job's
# ranks may all share one address (local workers), so an address's share is at least the
# world size, and the whole grows by as much.
_MAX_PENDING = 64
_MAX_PENDING_PER_ADDRESS = 8
_MAX_CLAIM = 256
# Plain values both ways: arrays decode as lists, extension types as msgspec's Ext (inert).
_pack = msgspec.msgpack.Encoder().encode
_unpack = msgspec.msgpack.Decoder().decode


def frame_limit() -> int:
    """The largest frame either side accepts: a value at the limit plus its request."""
    return int(config.get("store_max_value_bytes")) + _OVERHEAD


def send_frame(sock: socket.socket, obj) -> None:
    payload = _pack(obj)
    sock.sendall(_FRAME.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket, limit: int, started=None):
    """One frame, its announced length checked first; the body is kept as it arrives.

    `started()`, if given, is called once the length is in (the server starts the frame's
    deadline there: a peer may idle between frames, not within one)."""
    (n,) = _FRAME.unpack(recv_exact(sock, 4, "a store frame's length"))
    if n > limit:
        raise WireError(f"frame of {n} bytes announced, over the {limit}-byte limit "
                        "(MWRT_STORE_MAX_VALUE_BYTES)")
    if started is not None:
        started()
    parts, got = [], 0
    while got < n:  # not one n-byte buffer: a peer that announces and stalls costs nothing
        part = sock.recv(min(_CHUNK, n - got))
        if not part:
            raise ConnectionError(f"connection closed after {got} of {n} bytes of a frame")
        parts.append(part)
        got += len(part)
    try:
        return _unpack(b"".join(parts))
    except (ValueError, RecursionError) as exc:  # DecodeError (extra data, garbage), bad UTF-8
        raise WireError(f"frame is not msgpack ({type(exc).__name__}: {exc})") from None


def check_secure(host: str, key: bytes | None, what: str) -> None:
    """Refuse an unkeyed store beyond loopback (anyone reaching it could join the job),
    unless MWRT_INSECURE=1 says the network is private."""
    risk = "could join the job or rewrite its ranks' addresses"
    if not may_listen(host, key, "the job's store", risk):
        raise refusal(what, host, risk, verb="use")


def _check_claim(claim: bytes) -> None:
    parts = claim.decode("utf-8", "replace").rsplit(":", 2)
    if len(claim) > _MAX_CLAIM or len(parts) != 3 or not parts[1].isdigit():
        raise AuthError(f"malformed claim {claim[:40]!r} (expected b'host:pid:nonce')")


class StoreServer:
    """The master rank's side of a TCPStore: a listener, a thread per client, a reaper."""

    def __init__(self, host: str, port: int, generation: int | None, key: bytes | None,
                 world_size: int | None = None):
        check_secure(host, key, "TCPStore")
        self.store, self.generation, self.key = BoundStore(), generation, key
        # Every member may hold a connection for the whole job: a cap below that would turn
        # the last ranks away, however large the cap looked.
        self.max_connections = max(int(config.get("store_max_connections")),
                                   (world_size or 0) + 64)
        self.per_address = max(_MAX_PENDING_PER_ADDRESS, world_size or 0)
        self.max_pending = _MAX_PENDING + self.per_address - _MAX_PENDING_PER_ADDRESS
        self.limit, self.log = frame_limit(), PeerLog(log)
        self.sock = _listen(host, port)
        self.port = self.sock.getsockname()[1]
        self.where = f"{host}:{self.port}"
        self.conns: dict[socket.socket, str] = {}
        self.pending: dict[str, list] = {}  # address -> its connections in the challenge
        # conn -> (when, why): the reaper shuts a connection down that is still in a
        # challenge or a frame then (a slow peer must not hold a thread and a slot).
        self.deadlines: dict[socket.socket, tuple[float, str]] = {}
        self.expired: dict[socket.socket, str] = {}
        self.cond = threading.Condition()
        self.closed = False
        for target, name in ((self._accept, "accept"), (self._reap, "reaper")):
            threading.Thread(target=target, name=f"mwrt-store-{name}", daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, addr = self.sock.accept()
            except OSError as exc:
                if self.closed:
                    return
                self.refused(self.where, "a connection", f"accept failed ({exc})")  # EMFILE
                time.sleep(0.1)
                continue
            self._admit(conn, f"{addr[0]}:{addr[1]}")

    def refused(self, where: str, peer: str, why: str) -> None:
        """Log a refusal: one line per peer address a minute (protocol.refusals.PeerLog)."""
        self.log.warning(peer, "TCPStore %s: refused %s: %s", where, peer, why)

    def _admit(self, conn: socket.socket, peer: str) -> None:
        address = peer.rsplit(":", 1)[0]
        with self.cond:
            n = len(self.conns)
            full = n >= self.max_connections
            if not full:
                self._make_room(address)
                self.conns[conn] = peer
                self.pending.setdefault(address, []).append(conn)
                self.deadlines[conn] = (time.monotonic() + HANDSHAKE_SECONDS,
                                        f"did not finish the challenge in {HANDSHAKE_SECONDS} s")
                self.cond.notify()
        if full:
            conn.close()
            self.refused(self.where, peer, f"{n} connections open (at most "
                         f"{self.max_connections}, MWRT_STORE_MAX_CONNECTIONS)")
            return
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn, peer), name="mwrt-store-conn",
                             daemon=True).start()
        except (OSError, RuntimeError) as exc:  # RuntimeError: no thread could start
            self._forget(conn)
            self.refused(self.where, peer, f"could not serve it ({exc})")

    def _make_room(self, address: str) -> None:
        """Cut off the oldest connection in the challenge of `address` when it has its share,
        or of the busiest address when all slots are taken (holding self.cond)."""
        mine = self.pending.get(address, [])
        if len(mine) < self.per_address:
            if sum(map(len, self.pending.values())) < self.max_pending:
                return
            mine = max(self.pending.values(), key=len)
        oldest = mine.pop(0)
        self.deadlines.pop(oldest, None)
        self.expired[oldest] = ("pushed out of the challenge by newer connections (at most "
                                f"{self.per_address} from one address, {self.max_pending} "
                                "in all)")
        _shutdown(oldest)

    def _done_pending(self, conn: socket.socket, peer: str) -> None:
        with self.cond:
            address = peer.rsplit(":", 1)[0]
            mine = self.pending.get(address)
            if mine is not None and conn in mine:
                mine.remove(conn)
            if not mine:
                self.pending.pop(address, None)
            self.deadlines.pop(conn, None)

    def _serve(self, conn: socket.socket, peer: str) -> None:
        client = None
        try:
            try:
                client = server_handshake(conn, self.key, HANDSHAKE_SECONDS,
                                          _check_claim).decode()
            finally:
                self._done_pending(conn, peer)
            while not self.closed:
                req = recv_frame(conn, self.limit, lambda: self._deadline(
                    conn, "stalled in the middle of a frame"))
                self._deadline(conn, None)  # a get may wait as long as its timeout says
                reply = handle(self.store, self.generation, client, req)
                self._deadline(conn, "did not read its reply")
                send_frame(conn, reply)
                self._deadline(conn, None)
        except (AuthError, WireError) as exc:
            if not self.closed:  # closing breaks every connection: no peer's fault
                self.refused(self.where, peer, self.expired.get(conn) or str(exc))
        except OSError as exc:  # ConnectionError too: a client that left, or one cut off
            if self.closed:
                pass
            elif conn in self.expired:
                self.refused(self.where, peer, self.expired[conn])
            elif client is None:
                self.refused(self.where, peer, f"broke the challenge ({exc})")
        except Exception:  # a bug of ours must not kill the server thread
            log.exception("TCPStore %s: internal error serving %s; dropped it", self.where, peer)
        finally:
            self._forget(conn)

    def _deadline(self, conn: socket.socket, why: str | None) -> None:
        """Cut `conn` off in FRAME_SECONDS, saying `why`; None: no deadline now."""
        with self.cond:
            if why is None:
                self.deadlines.pop(conn, None)
                return
            when = time.monotonic() + FRAME_SECONDS
            self.deadlines[conn] = (when, f"{why} for {FRAME_SECONDS} s")
            self.cond.notify()

    def _forget(self, conn: socket.socket) -> None:
        with self.cond:
            self.conns.pop(conn, None)
            self.deadlines.pop(conn, None)
            self.expired.pop(conn, None)
        conn.close()

    def _reap(self) -> None:
        with self.cond:
            while not self.closed:
                now = time.monotonic()
                for conn, (when, why) in list(self.deadlines.items()):
                    if when <= now:
                        del self.deadlines[conn]
                        self.expired[conn] = why
                        _shutdown(conn)  # its thread's blocked read returns, and it leaves
                nearest = min((when for when, _ in self.deadlines.values()), default=None)
                self.cond.wait(None if nearest is None else max(nearest - now, 0.01))

    def connections(self) -> int:
        """How many connections are open (tests and statistics)."""
        with self.cond:
            return len(self.conns)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
            conns = list(self.conns)
        _shutdown(self.sock)
        self.sock.close()
        for conn in conns:
            _shutdown(conn)  # its thread closes it


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise RendezvousError(
                f"TCPStore: port {port} on {host} is in use (another job or another rank 0 "
                "holds it); pick a free MASTER_PORT, or port 0 for an ephemeral one") from None
        raise RendezvousError(f"TCPStore: cannot listen on {host}:{port}: {e}") from None
    sock.listen(128)
    return sock
