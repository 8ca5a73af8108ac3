"""The socket channel, of which tcp, shm and auto are configurations: each says where it
listens, how it connects, and which path a connection of each socket family takes.

Each rank listens (on one socket or more) and publishes its address in the store. A rank
sends to a peer over a connection it opened itself, one per direction and pair, so two
ranks that send to each other at once never race to set up a shared one; the HMAC
challenge of `mwrt.auth` runs before any payload byte is read. A message travels as
frames (`framing.Frame`): a fixed header, the sender's description of its buffer on the
first frame (for size-mismatch errors), then the raw segment. Messages longer than a
path's segment size go in segments and the connection is released between them, so a
large transfer delays a small one to the same peer by one segment.

The channel has the parts that do the work: its path to each peer (`paths.py`,
`memorypaths.py`) sends the segments, one receiver thread per inbound connection reads
frames (`inbound.Inbound`, which hands a path's own kinds of frame to that connection's
path), and the matcher (`matching.Matcher`) says where each message goes: a large segment
straight into a posted receive's buffer (recv_into, no copy), a small message in one
piece to its receive or a stash. So receivers always drain their sockets, and a ring of
blocking sends cannot deadlock. A thread that waits for a small message may read the
connection itself for a moment.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping
from typing import ClassVar

from .. import config
from ..errors import AuthError, ChannelClosedError, ChannelTimeoutError, ConfigError, WireError
from ..protocol.auth import client_handshake, server_handshake
from ..protocol.refusals import PeerLog
from .base import DataChannel, byte_view, describe
from .framing import DATA, HEADER, MAGIC, Frame
from .inbound import Inbound
from .matching import Matcher
from .paths import OutConn, SocketPath

__all__ = ["DATA", "HEADER", "MAGIC", "Frame", "SocketChannel"]  # the frame format too

log = logging.getLogger("mwrt.channels")


def _peer_name(sock) -> str:
    """'host:port' of a connected socket's peer (else what can be said of it)."""
    try:
        address = sock.getpeername()
    except OSError:
        return "a peer that left"
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return f"a local peer ({address or 'unnamed socket'})"  # AF_UNIX (the shm channel)

_LINGER = 5.0  # seconds close() waits for peers to read what we sent
_HANDSHAKE_SECONDS = 10.0


class SocketChannel(DataChannel):
    """A channel over stream sockets; subclasses say how to listen and connect.

    It has a matcher (`matching.Matcher`: which receive each message goes to), a frame
    reader (`inbound.Inbound`: the receiver threads, and waiters that read for themselves)
    and a path per connection (`paths.SocketPath` or the class `paths` names for the
    connection's socket family: how segments go out, and the frames of its own kinds are
    read).
    """

    name = "sockets"
    # The path of a connection by its socket family (socket.AF_UNIX ...); SocketPath, every
    # segment a DATA frame, for the others.
    paths: ClassVar[Mapping[int, type[SocketPath]]] = {}
    buffered_sends = True  # unmatched messages are stashed, so sends never wait for receives
    any_size_recv = True
    posted_receives = True  # irecv posts the buffer and returns: any number may be pending

    def __init__(self, rank, world_size, *, store, prefix="mwrt", key=None, timeout=None):
        super().__init__(rank, world_size, store=store, prefix=prefix, key=key, timeout=timeout)
        self.matcher = Matcher(self, on_peer_gone=self._on_peer_gone)
        self.inbound = Inbound(self, self.matcher, self._send, self._connected)
        self.matcher.read_for = self.inbound.read_for
        self._lock = threading.Lock()  # the inbound sockets
        self._cond = threading.Condition()  # a send waiting for its tag to be free
        self.segment_bytes = config.get("segment_bytes")
        if self.segment_bytes < 1:
            raise ConfigError(f"MWRT_SEGMENT_BYTES: must be >= 1 (got {self.segment_bytes})")
        self._busy_tags: dict[tuple[int, int], int] = {}  # (peer, tag) -> the sending thread
        self._tag_waiters = 0
        self._outbound: dict[int, SocketPath] = {}  # the sending path to each peer
        self._inpaths: dict[int, SocketPath] = {}  # the reading path from each peer
        self._out_locks = [threading.Lock() for _ in range(world_size)]
        self._inbound: set = set()
        self._threads: list[threading.Thread] = []
        self._listeners: list[socket.socket] = []
        self._refusals = PeerLog(log)  # one line per stranger a minute, however often it knocks
        if world_size > 1:
            self._listeners, address = self._listen()
            store.set(self._address_key(rank), address)
            for listener in self._listeners:
                self._spawn(self._accept_loop, f"mwrt-{self.name}-accept-{rank}", listener)

    # -- for subclasses ----------------------------------------------------------------

    def _listen(self) -> tuple[list[socket.socket], str]:
        """Open the listening sockets; return them and the address peers connect to."""
        raise NotImplementedError

    def _connect(self, address: str, peer: int, timeout: float) -> socket.socket:
        """Open a connected socket to `peer` at `address`."""
        raise NotImplementedError

    def _shown(self, record: str, sock: socket.socket) -> str:
        """How errors name a peer's address: its published record (tcp: host:port)."""
        return record

    def _path(self, peer: int, sock, conn: OutConn | None) -> SocketPath:
        """The path over `sock` to (conn) or from (None) `peer`."""
        return self.paths.get(sock.family, SocketPath)(self, peer, conn)

    def _on_peer_gone(self, peer: int) -> None:
        """Release the reading path's resources (shm mappings)."""
        path = self._inpaths.pop(peer, None)
        if path is not None:
            path.close()

    # -- receiving: the matcher's and the frame reader's -------------------------------

    def _recv(self, view, peer, tag, timeout, desc):
        self.matcher.recv(view, peer, tag, timeout, desc)

    def _recv_message(self, peer, tag, timeout):
        return self.matcher.recv_message(peer, tag, timeout)

    def _exchange_message(self, view, peer, tag, timeout, desc):
        return self.inbound.exchange_message(view, peer, tag, timeout, desc)

    def irecv(self, buf, peer, tag=0, timeout=None):
        """Post a receive now; the receiver thread fills `buf` without a helper thread."""
        view = byte_view(buf, writable=True, what=f"{self.name} irecv from rank {peer}")
        self._check(peer, tag)
        return self.matcher.irecv(view, describe(buf), peer, tag, self._timeout(timeout))

    def arrived(self, peer: int, tag: int = 0) -> bool:
        self.inbound.reclaim(peer)
        return self.matcher.arrived(peer, tag)

    def gone(self, peer: int) -> str | None:
        return self.matcher.departed.get(peer)

    def fail_tags(self, match, why: str) -> None:
        self.matcher.fail_tags(match, why)

    # -- sending -----------------------------------------------------------------------

    def _send(self, view, peer, tag, timeout, desc):
        deadline = time.monotonic() + timeout
        key = (peer, tag)
        try:
            # Connected once, the connection stays: skip the per-peer connect lock.
            path = self._outbound.get(peer) or self._out_path(peer, deadline, timeout)
            self._claim_tag(key, deadline)
        except ChannelTimeoutError as exc:
            raise ChannelTimeoutError(f"{exc} [sending {desc} on tag {tag}, timeout {timeout} s]"
                                      ) from None
        try:
            total, offset, head = view.nbytes, 0, desc
            step = path.segment_step(total)
            while True:
                n = min(step, total - offset)
                seg = view[offset:offset + n] if n < total else view
                path.send_segment(Frame(DATA, tag, total, offset, n, head), seg, deadline)
                offset, head = offset + n, ""
                if offset >= total:
                    break
        except ChannelTimeoutError as exc:
            raise ChannelTimeoutError(f"{exc} [sending {desc} on tag {tag}, timeout {timeout} s]"
                                      ) from None
        finally:
            self._release_tag(key)

    def _claim_tag(self, key, deadline) -> None:
        """Own (peer, tag) while a message's segments go out, so two never interleave."""
        me = threading.get_ident()
        if self._busy_tags.setdefault(key, me) == me:  # atomic under the GIL: no lock
            return
        self.inbound.before_blocking()  # never wait while a receiver thread is shut out
        with self._cond:
            self._tag_waiters += 1
            try:
                while self._busy_tags.setdefault(key, me) != me:
                    if not self._cond.wait(max(deadline - time.monotonic(), 0)):
                        raise ChannelTimeoutError(f"{self.name} send rank {self.rank}->{key[0]}: "
                                                  "another send on this tag is still running")
            finally:
                self._tag_waiters -= 1

    def _release_tag(self, key) -> None:
        del self._busy_tags[key]
        if self._tag_waiters:  # read after the delete: a waiter counted later sees it free
            with self._cond:
                self._cond.notify_all()

    def _connected(self, peer: int) -> bool:
        return peer in self._outbound

    def _what(self, peer: int) -> str:
        return f"{self.name} send rank {self.rank}->{peer}"

    def _out_path(self, peer: int, deadline: float, timeout: float) -> SocketPath:
        what = self._what(peer)
        if not self._out_locks[peer].acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise ChannelTimeoutError(f"{what}: connecting took longer than {timeout} s")
        try:
            path = self._outbound.get(peer)
            if path is not None:
                return path
            key = self._address_key(peer)
            try:
                address = self.store.get(key, timeout=max(deadline - time.monotonic(), 0))
            except TimeoutError:
                raise ChannelTimeoutError(
                    f"{what}: rank {peer} did not publish its address ({key!r}) within "
                    f"{timeout} s; is it running with the same store and prefix?") from None
            record = address.decode()
            sock = self._connect(record, peer, max(deadline - time.monotonic(), 1e-3))
            address = self._shown(record, sock)
            try:
                client_handshake(sock, self.key, max(deadline - time.monotonic(), 1e-3),
                                 self._claim(self.rank),
                                 peer=f"{self.name} channel rank {peer} at {address}")
            except AuthError:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                raise ChannelClosedError(
                    f"{what}: rank {peer} at {address} dropped the connection during the "
                    f"handshake ({type(exc).__name__}: {exc}); check the logs of rank {peer}",
                    peer=peer) from None
            sock.setblocking(False)  # send_parts waits itself, only when the buffer is full
            conn = OutConn(sock, address, peer, what, self.inbound.before_blocking)
            path = self._outbound[peer] = self._path(peer, sock, conn)
            if self.closed:  # close() ran while we connected: do not leak the socket
                self._shut(sock)
            return path
        finally:
            self._out_locks[peer].release()

    def fail_peer(self, peer: int, why: str) -> None:
        """Fail receives from `peer` and sends to it: a send blocked on a dead link (its
        socket buffer full, no reset ever coming) wakes now instead of at its timeout."""
        self.matcher.fail_peer(peer, why)
        conn = self._outbound[peer].conn if peer in self._outbound else None
        if conn is not None and conn.error is None:
            conn.error = why
            self._shut(conn.sock, close=False)  # a blocked send returns EPIPE at once

    # -- receiver thread ---------------------------------------------------------------

    def _accept_loop(self, listener) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # the listener was closed
            if self.closed:
                sock.close()
                return
            with self._lock:
                self._inbound.add(sock)
            self._spawn(self._serve, f"mwrt-{self.name}-recv-{self.rank}", sock)

    def _serve(self, sock) -> None:
        peer, why = None, "closed the connection"
        try:
            peer = self._authenticate(sock)
            if peer is not None:
                path = self._inpaths[peer] = self._path(peer, sock, None)
                self.inbound.read_frames(sock, peer, path.on_frame)
        except (OSError, WireError) as exc:
            why = f"broke the connection ({type(exc).__name__}: {exc})"
            if isinstance(exc, WireError):
                log.warning("%s channel rank %d: dropping rank %s: %s", self.name, self.rank,
                            peer, exc)
        finally:
            with self._lock:
                self._inbound.discard(sock)
            sock.close()
            if peer is not None:
                self.matcher.peer_gone(peer, why)

    def _authenticate(self, sock) -> int | None:
        def check(claim: bytes):
            group, _, rank = claim.rpartition(b"/")
            if group + b"/" != self._claim("") or not rank.isdigit() or \
                    not 0 <= int(rank) < self.world_size or int(rank) == self.rank:
                raise AuthError(f"unexpected claim {claim!r} (expected {self._claim('<rank>')!r})")

        try:
            # A connection that never finishes the challenge must not hold a thread for long.
            claim = server_handshake(sock, self.key, min(self.timeout, _HANDSHAKE_SECONDS), check)
        except AuthError as exc:
            peer = _peer_name(sock)
            self._refusals.warning(peer, "%s channel rank %d: refused a connection from %s: %s",
                              self.name, self.rank, peer, exc)
            return None
        return int(claim.rpartition(b"/")[2])

    # -- lifecycle ---------------------------------------------------------------------

    def _close(self):
        self.matcher.fail_posts()
        self.inbound.kick()
        with self._lock:
            inbound = list(self._inbound)
        for listener in self._listeners:
            self._shut(listener)
        self._close_outbound()
        for sock in inbound:
            self._shut(sock, close=False)  # its receiver thread closes it
        deadline = time.monotonic() + 5.0
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(deadline - time.monotonic(), 0))
        for path in list(self._outbound.values()):
            path.close()  # shm: unlink slots the receiver never mapped (it died or never received)

    def _close_outbound(self) -> None:
        # Half-close, then wait for the peer to finish reading: closing a socket with unread
        # acks sends a reset, which would make the peer drop frames we already sent.
        conns = [path.conn for path in self._outbound.values()]
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        deadline = time.monotonic() + min(self.timeout, _LINGER)
        for conn in conns:
            try:
                while deadline > time.monotonic():
                    conn.sock.settimeout(deadline - time.monotonic())
                    if not conn.sock.recv(1 << 16):
                        break
            except OSError:
                pass  # reset or timed out: the peer is gone or stuck, nothing left to save
            conn.sock.close()

    @staticmethod
    def _shut(sock, close: bool = True) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected, or already shut
        if close:
            sock.close()

    def _spawn(self, target, name, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _address_key(self, rank: int) -> str:
        return f"{self.prefix}/{self.name}/{rank}"

    def _claim(self, rank: int | str) -> bytes:
        """Who a connecting rank says it is: group and rank, checked by the HMAC too."""
        return f"{self.prefix}/{self.name}/{rank}".encode()
