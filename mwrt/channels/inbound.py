"""An inbound connection that its receiver thread drains, or a waiting thread reads itself.

Through a receiver thread a small message costs two thread wake-ups: the receiver's when
the bytes arrive, then the waiter's when the receiver hands them over, each tens of µs
on a busy or virtual machine. So a thread that waits for a small message from a peer may
take the connection's read role: it disarms the receiver thread's one-shot epoll
registration (no wake-up for it), reads whole small DATA frames itself and delivers them
like the receiver would, and gives the role back as soon as anything else shows up (a
large segment, another frame kind, a malformed header, the end of the stream): the
receiver thread handles all of those as before, so errors and deaths surface one way.

A thread that got its message keeps the connection disarmed for a short lease (LEASE):
collectives come in runs, and a peer's next message often arrives before we ask for it;
it then waits in the socket for us instead of waking the receiver thread. The receiver
watches the lease with a timed wait and takes the connection back when it runs out, so
a peer's sends never wait on us for longer than that.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time

from ..errors import WireError
from .framing import DATA, HEADER, MAGIC, WHOLE, Frame, Reader
from .matching import Matcher

log = logging.getLogger("mwrt.channels")

WAIT, HAND_BACK = "wait", "hand back"  # what next_small says instead of a frame
LEASE = 0.005  # seconds a connection stays with the thread that last read it
_SLICE = 0.05  # a thread reading for itself looks up this often (a close, fail_peer)
_EPOLL = hasattr(select, "epoll") and hasattr(os, "eventfd")  # Linux: else no taking over
_ARMED = select.EPOLLIN | select.EPOLLONESHOT if _EPOLL else 0


class InConn:
    """An inbound socket, its read-ahead buffer, and the read role (`lock`)."""

    def __init__(self, sock, before_wait):
        sock.setblocking(False)
        self.reader = Reader(sock, before_wait=before_wait)
        self.lock = threading.Lock()  # held by whoever reads: the receiver thread or a waiter
        self.closed = False  # set by the receiver thread, under `lock`, when it stops
        self.lent_until = 0.0  # while set, the receiver is disarmed and a waiter reads
        self._watching = False  # the receiver waits with a timeout, for the lease's end
        self._hand_back = False  # the reader stopped at something for the receiver
        self._epoll = select.epoll() if _EPOLL else None
        self._fd = sock.fileno()
        if self._epoll is not None:
            # Wakes the receiver when the socket cannot: a lease started, or bytes a waiter
            # read ahead wait in the buffer (no longer in the socket).
            self._kick = os.eventfd(0, os.EFD_NONBLOCK)
            self._epoll.register(self._fd, _ARMED)
            self._epoll.register(self._kick, select.EPOLLIN)

    # -- the receiver thread's side --------------------------------------------------

    def wait_readable(self, at_least: float = 0.0) -> None:
        """Wait for bytes (or the end) while armed, or for a lease to need a look."""
        if self._epoll is None:
            self.reader.wait()
            return
        # Clear the flag, then read the lease: a waiter sets the lease, then reads the flag,
        # so either we see its lease or it sees us not watching and kicks.
        self._watching = False
        lent = self.lent_until
        self._watching = bool(lent)
        timeout = max(lent - time.monotonic(), at_least) if lent else -1
        for fd, _ in self._epoll.poll(timeout):
            if fd == self._kick:
                try:
                    os.eventfd_read(self._kick)
                except BlockingIOError:
                    pass

    def lease_running(self, closing: bool) -> bool:
        """Under `lock`: True while a lease runs; when it ran out, end it (re-arm later)."""
        if self.lent_until and time.monotonic() < self.lent_until and not closing:
            return True
        self.lent_until = 0.0
        return False

    def arm(self) -> None:
        """Let the next bytes wake the receiver thread (at once if some are waiting), or
        room for the answers it owes the peer."""
        if self._epoll is None:  # no epoll here
            return
        try:
            self._epoll.modify(self._fd, _ARMED | (select.EPOLLOUT if self.reader.owed else 0))
        except (OSError, ValueError):
            pass  # closing: its receiver thread is on its way out

    def kick(self) -> None:
        try:
            os.eventfd_write(self._kick, 1)
        except (OSError, AttributeError):
            pass

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            os.close(self._kick)

    # -- a waiting thread's side -----------------------------------------------------

    def take(self) -> bool:
        """Try to take the read role from the receiver thread, without waiting."""
        if self._epoll is None or not self.lock.acquire(False):
            return False
        try:
            if not self.closed:
                if not self.lent_until:  # lent, it is disarmed already
                    self._epoll.modify(self._fd, 0)
                return True
        except (OSError, ValueError):
            pass
        self.lock.release()
        return False

    def reclaim(self) -> None:
        """End a lease now: a large message is coming, which the receiver thread reads."""
        if self.lent_until and self.take():
            self.give_back()

    def give_back(self, lend: bool = False) -> None:
        """Release the role: lend the connection on (`lend`), or return it to the receiver."""
        buffered = self.reader.end > self.reader.start
        if lend and not buffered and not self._hand_back:
            self.lent_until = time.monotonic() + LEASE
            if not self._watching:
                self.kick()  # the receiver waits without a timeout: tell it to watch
        else:
            self.lent_until = 0.0
            self.arm()
            if buffered:
                self.kick()
        self._hand_back = False
        self.lock.release()

    def next_small(self, deadline: float):
        """(tag, description, bytes) of a next whole small DATA frame, else WAIT or HAND_BACK."""
        # WAIT: nothing by `deadline`. HAND_BACK: another frame, or the stream ended or
        # broke: the receiver thread's business. The bytes are valid until the next read.
        r = self.reader
        try:
            if not r.fill(HEADER.size, "a frame header", deadline):
                return self._stop()
            magic, kind, _, dlen, _, tag, total, offset, seglen = HEADER.unpack_from(r.buf,
                                                                                     r.start)
            if magic != MAGIC or kind != DATA or offset or seglen != total or \
                    dlen + total > WHOLE:
                return self._stop()
            size = HEADER.size + dlen + total
            if not r.fill(size, "a message", deadline):
                return self._stop()
        except TimeoutError:
            return WAIT
        except OSError:
            return self._stop()
        at, r.start = r.start + HEADER.size, r.start + size
        desc = str(r.view[at:at + dlen], "utf-8", "replace")
        return tag, desc, r.view[at + dlen:at + dlen + total]

    def _stop(self) -> str:
        self._hand_back = True
        return HAND_BACK


class Inbound:
    """The frame reader a socket channel has: frames off its inbound connections, read by
    their receiver threads (read_frames) or by waiters, handed to its matcher."""

    def __init__(self, channel, matcher: Matcher, send, connected):
        # send(view, peer, tag, timeout, desc): the channel's send; connected(peer): True
        # once its own connection to `peer` is up (a first send may wait on it).
        self.channel, self.matcher, self.name, self.rank = channel, matcher, channel.name, \
            channel.rank
        self._send, self._connected = send, connected
        self._inconns: dict[int, InConn] = {}  # by peer, once authenticated
        self._role = threading.local()  # .conn: the inbound connection this thread reads

    def read_frames(self, sock, peer: int, on_frame) -> None:
        """Read frames from `peer` on `sock` until the stream ends; on_frame(reader, frame)
        handles a kind other than DATA (a path's own), reading and answering through the
        framing.Reader."""
        # Receives finished here wake their waiters just before this thread waits: a
        # waiter woken earlier would only wait again, for the GIL this thread still holds.
        done: list = []

        def release():
            for post, error in done:
                post.release(error)
            done.clear()

        conn = InConn(sock, release)
        self._inconns[peer] = conn
        try:
            busy = 0.0
            while True:
                release()
                conn.wait_readable(busy)
                # A thread that reads for itself gives the role back first; while it holds
                # a lease, it renews it, and we look again when that would run out.
                busy = 0.0 if conn.lock.acquire(not conn.lent_until) else LEASE
                if busy:
                    continue
                try:
                    if conn.lease_running(self.channel.closed):
                        continue
                    if not self._drain(conn.reader, peer, done, on_frame):
                        return
                    conn.arm()
                finally:
                    conn.lock.release()
        finally:
            conn.closed = True  # no waiter takes it from here on
            release()
            if self._inconns.get(peer) is conn:
                del self._inconns[peer]
            conn.close()

    def _drain(self, reader: Reader, peer: int, done: list, on_frame) -> bool:
        """Handle every frame that has arrived; False at the end of the stream."""
        reader.flush()  # answers owed since the socket was last full
        while (ready := reader.available()):
            header = reader.next_header()
            if header is None:  # cannot be: available() saw bytes buffered; ended all the same
                return False
            magic, kind, _, dlen, aux, tag, total, offset, seglen = header
            if magic != MAGIC:
                raise WireError(f"bad frame magic {magic:#x} (expected {MAGIC:#x})")
            if kind == DATA and offset == 0 and seglen == total and dlen + total <= WHOLE:
                # A small message, usually read already with its header: one lock, no wait.
                body = reader.take(dlen + total, "a message")
                finished = self.matcher.deliver(peer, tag, body[dlen:], str(body[:dlen], "utf-8",
                                                                      "replace"))
                if finished is not None:
                    done.append(finished)
                continue
            reader.before_wait()  # a large segment may take a while: wake them now
            frame = Frame(kind, tag, total, offset, seglen, str(
                reader.take(dlen, "a frame description"), "utf-8", "replace"), aux)
            if kind == DATA:
                target = self.matcher.segment_target(peer, frame)
                if target is None:
                    reader.discard(seglen, "a discarded segment")
                else:
                    reader.read_into(target, "a segment")
                self.matcher.segment_done(peer, tag, seglen)
            else:
                on_frame(reader, frame)
        return ready is not None

    # -- reading for ourselves (mwrt.channels.inbound) ---------------------------------

    def read_for(self, post, deadline: float | None) -> None:
        """Read `post`'s small message ourselves if its connection is ours to take."""
        conn = self._inconns.get(post.peer)
        if conn is None:
            return
        if post.view is not None and post.view.nbytes > WHOLE:
            conn.reclaim()  # a large one: the receiver thread puts it straight in place
            return
        if not conn.take():
            return
        try:
            self._read_small(conn, post.peer, deadline, post=post)
        finally:
            conn.give_back(lend=post.finished)

    def _read_small(self, conn: InConn, peer: int, deadline: float | None, post=None,
                    tag: int = -1) -> memoryview | None:
        """Deliver small frames from `conn` until `post` is done, or return one for `tag`."""
        # With no post, a message on `tag` that no receive awaits is ours and returned. Stop
        # when anything else shows up (the receiver thread's business) or at `deadline`.
        while post is None or not post.finished:
            now = time.monotonic()
            if (deadline is not None and now >= deadline) or peer in self.matcher.departed or \
                    self.channel.closed:
                return None
            if post is None and self.matcher.tag_failed(tag):
                return None  # fail_tags: the usual receive it falls back to raises why
            got = conn.next_small(now + _SLICE if deadline is None else
                                  min(deadline, now + _SLICE))
            if got is HAND_BACK:
                return None
            if got is WAIT:
                continue  # look again whether a close or fail_peer finished the post
            at, desc, body = got
            try:
                out = self.matcher.deliver(peer, at, body, desc, keep=post is None and at == tag)
            except WireError as exc:
                log.warning("%s channel rank %d: dropping rank %s: %s", self.name, self.rank,
                            peer, exc)
                try:
                    conn.reader.sock.shutdown(socket.SHUT_RDWR)  # its receiver thread closes it
                except OSError:
                    pass
                self.matcher.peer_gone(peer, f"broke the connection (WireError: {exc})")
                return None
            if type(out) is tuple:
                out[0].release(out[1])
            elif out is not None:
                return out
        return None

    def exchange_message(self, view, peer, tag, timeout, desc) -> memoryview:
        """Send `view`, then receive `peer`'s next message on `tag`, reading it ourselves."""
        conn = self._inconns.get(peer)
        if view.nbytes > WHOLE or conn is None or not self._connected(peer) or not conn.take():
            self._send(view, peer, tag, timeout, desc)
            return self.matcher.recv_message(peer, tag, timeout)
        # The peer's answer usually arrives while we send: holding the read role already,
        # we read it without waking the receiver thread (a send that must wait yields it).
        deadline = time.monotonic() + timeout
        self._role.conn = conn
        got = None
        try:
            got = self.matcher.claim_arrived(peer, tag)
            self._send(view, peer, tag, timeout, desc)
            if got is None and self.holds_role(conn):
                got = self._read_small(conn, peer, deadline, tag=tag)
        finally:
            self.yield_role(lend=got is not None)
        if got is not None:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            raise self.matcher.timeout_error(peer, tag, "any size", timeout)
        return self.matcher.recv_message(peer, tag, left)  # it did not come whole: the usual way

    def reclaim(self, peer: int) -> None:
        """A lent connection is read by nobody: let its receiver thread look (arrived)."""
        conn = self._inconns.get(peer)
        if conn is not None:
            conn.reclaim()

    def holds_role(self, conn: InConn) -> bool:
        """True while this thread holds the read role of `conn` (a send may yield it)."""
        return getattr(self._role, "conn", None) is conn

    def yield_role(self, lend: bool = False) -> None:
        """Give back the read role this thread holds, if any (lend: keep it on a lease)."""
        conn = getattr(self._role, "conn", None)
        if conn is not None:
            self._role.conn = None
            conn.give_back(lend)

    def before_blocking(self) -> None:
        """About to wait on something else (a full socket, a busy connection): let every
        receiver thread read. Two ranks whose sends wait on each other's reads would
        otherwise stall until their leases run out (5 ms), where socket buffers are small."""
        self.yield_role()
        for conn in list(self._inconns.values()):
            conn.reclaim()

    def kick(self) -> None:
        """On close: receivers watching a lease look again, and find the channel closing."""
        for conn in list(self._inconns.values()):
            conn.kick()
