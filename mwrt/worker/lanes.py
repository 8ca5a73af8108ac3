"""A local daemon's lanes (protocol/lane.py): its parent master's sessions, off ZeroMQ.

The listener sits in the daemon's Unix socket folder (mode 0700) and, as the ZeroMQ socket
there does, admits the parent process alone (the kernel names the peer: SO_PEERCRED). A
lane's first message names a session whose Hello the daemon answered; from then on its
messages are that session's batches, and the session's replies go out on it.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from typing import TYPE_CHECKING

from ..protocol.lane import BIND, BOUND, Lane, LaneClosed

if TYPE_CHECKING:
    from .wakes import Wakes

log = logging.getLogger("mwrt.worker")

_PEER = struct.Struct("3i")  # struct ucred: pid, uid, gid
_INBOX_BYTES = 64 << 20  # a lane's messages read ahead of the socket thread at most


class Lanes:
    """The daemon's lane listener and its lanes, served from its socket thread."""

    def __init__(self, folder: str, parent_pid: int, max_bytes: int):
        self.path = os.path.join(folder, "lane")
        self.parent_pid, self.max_bytes = parent_pid, max_bytes
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(self.path)
            self.listener.listen(16)
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.by_identity: dict[bytes, Lane] = {}  # a session's reply identity -> its lane
        self.lanes: set[Lane] = set()  # every open lane, bound or not yet
        self.waiting: set[Lane] = set()  # lanes holding whole messages a bound left unread
        # The socket thread's Wakes, which watches the lanes (set as the daemon serves).
        self.wakes: Wakes = None  # type: ignore[assignment]

    def fileno(self) -> int:
        return self.listener.fileno()

    def serve(self, ready: list, sessions: dict, handle, more) -> None:
        """Take new lanes, write what waits for a writable one, and read each that has
        messages, of the wake's `ready` and those a bound left unread (read()'s args)."""
        for item in (*ready, *self.waiting):
            if item is self:
                self.accept()
            elif item in self.lanes:
                if item.outbox:
                    self.flush(item)
                self.read(item, sessions, handle, more)

    def accept(self) -> None:
        """Take the connections waiting: the parent's become lanes, others are closed."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            pid = _PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               _PEER.size))[0]
            if pid != self.parent_pid:
                log.warning("refused a lane from process %d (only the parent, %d, may open "
                            "one)", pid, self.parent_pid)
                conn.close()
                continue
            lane = Lane(conn, self.max_bytes)
            self.lanes.add(lane)
            self.wakes.watch(lane)

    def read(self, lane: Lane, sessions: dict, handle, more) -> None:
        """Hand `lane`'s messages to `handle` (frames after the routing identity, as the
        ROUTER gives them) while `more()` says the turn goes on; what is left waits."""
        self.waiting.discard(lane)
        try:
            # Past the bound, messages wait their turn and the master waits: its backpressure.
            # One message larger than the bound is read on (the bound of its size is the
            # lane's, as ZeroMQ's socket's): else both ends waited out MWRT_SYNC_TIMEOUT.
            if lane.unread() < _INBOX_BYTES or not lane.whole():
                lane.fill()
            while (frames := lane.message()) is not None:
                if not lane.identity:
                    self._bind(lane, frames, sessions)
                    continue
                handle([lane.sender, *frames])
                if not more():  # the next turn reads on (it may find a part of one)
                    self.waiting.add(lane)
                    return
        except LaneClosed:
            self.close(lane)

    def _bind(self, lane: Lane, frames: list, sessions: dict) -> None:
        """Bind `lane` to the session its first message names, or close it."""
        if len(frames) != 2 or frames[0] != BIND or frames[1] not in sessions:
            log.warning("closed a lane whose first message names no session")
            raise LaneClosed("unbound")
        identity = sessions[frames[1]].identity
        if identity in self.by_identity:  # a session has one lane: its master opened it
            log.warning("closed a second lane for session %s", sessions[frames[1]].id)
            raise LaneClosed("bound already")
        lane.identity, lane.sender = identity, frames[1] + b"/tx"  # (as the ROUTER names them)
        self.by_identity[identity] = lane
        lane.post([BOUND])

    def send(self, identity: bytes, frames) -> bool:
        """Send a message to `identity` on its lane: False if it has none."""
        lane = self.by_identity.get(identity)
        if lane is None:
            return False
        lane.post(frames)
        if lane.outbox:
            self.wakes.watch(lane, writable=True)  # flushed when the socket takes more
        return True

    def flush(self, lane: Lane) -> None:
        """Write what `lane`'s outbox holds, as its socket is writable again."""
        if lane.flush():
            self.wakes.watch(lane)

    def close(self, lane: Lane) -> None:
        """Forget `lane` and close it."""
        self.lanes.discard(lane)
        self.waiting.discard(lane)
        if self.by_identity.get(lane.identity) is lane:
            del self.by_identity[lane.identity]
        if self.wakes is not None:  # (None before serve())
            self.wakes.forget(lane)
        lane.close()

    def close_all(self) -> None:
        for lane in list(self.lanes):
            self.close(lane)
        self.listener.close()
