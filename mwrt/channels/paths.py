"""A socket channel's path to one peer: how a message's segments go out, and how the frames
that carry them are read on the other side.

A channel has one path per connection: toward a peer (sending on our connection) and from
it (reading the frames the peer sends on its own). `SocketPath` sends each segment as a
DATA frame on the socket, as the tcp channel does and as every channel does between hosts.
A transport that moves segments another way is one subclass: it sends them its way
(`send_segment`) and reads the frames of its own kinds (`on_frame`); the shared-memory
paths of `memorypaths.py` are two. DATA frames themselves the channel's frame reader
hands to its matcher, whichever the path.
"""

from __future__ import annotations

import threading
import time

from ..errors import ChannelClosedError, ChannelTimeoutError, WireError
from .framing import Frame, send_parts


class OutConn:
    """Our connection to a peer, used for sending; `lock` is held for one frame."""

    def __init__(self, sock, address: str, peer: int, what: str, before_blocking):
        # what: how errors name a send on it ("tcp send rank 0->1"); before_blocking(): run
        # before waiting for the socket or the lock (the frame reader's, which gives every
        # receiver thread its connection back first).
        self.sock, self.address, self.peer, self.what = sock, address, peer, what
        self.lock = threading.Lock()
        self.error: str | None = None
        self._before_blocking = before_blocking

    def write(self, parts, deadline: float) -> None:
        """Write one frame, converting socket errors to channel errors."""
        if not self.lock.acquire(False):
            self._before_blocking()  # never wait while a receiver thread is shut out
            if not self.lock.acquire(True, max(deadline - time.monotonic(), 0)):
                raise ChannelTimeoutError(f"{self.what}: connection busy past the send's "
                                          "timeout")
        peer = self.peer
        try:
            if self.error:
                raise ChannelClosedError(f"{self.what}: connection unusable after an earlier "
                                         f"error ({self.error})", peer=peer)
            send_parts(self.sock, parts, deadline, self._before_blocking)
        except TimeoutError:
            self.error = "a send timed out mid-frame"
            raise ChannelTimeoutError(f"{self.what}: rank {peer} at {self.address} did not take "
                                      "the data within the timeout; is it stalled, or the link "
                                      "to it down?") from None
        except OSError as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"  # fail_peer's why first
            raise ChannelClosedError(f"{self.what}: connection to rank {peer} at "
                                     f"{self.address} lost ({self.error}); check the logs of "
                                     f"rank {peer}", peer=peer) from None
        finally:
            self.lock.release()


class SocketPath:
    """Every segment as a DATA frame on the socket: the tcp path."""

    def __init__(self, channel, peer: int, conn: OutConn | None):
        # conn: our connection to `peer` on a sending path; None on a reading one.
        self.channel, self.peer = channel, peer
        self.conn: OutConn = conn  # type: ignore[assignment]  # None only where nothing is sent
        self.matcher = channel.matcher

    def segment_step(self, total: int) -> int:
        """The segment size of a `total`-byte message."""
        return self.channel.segment_bytes

    def send_segment(self, frame: Frame, seg: memoryview, deadline: float) -> None:
        """Send `seg`, one segment of a message, as the DATA frame `frame` says."""
        self.conn.write([frame.pack(), seg], deadline)

    def on_frame(self, reader, frame: Frame) -> None:
        """Handle a frame of this path's own kinds from the peer: read its bytes, and answer,
        through `reader` (the framing.Reader of the connection)."""
        channel = self.channel
        raise WireError(f"{channel.name} channel rank {channel.rank}: unknown frame kind "
                        f"{frame.kind} from rank {self.peer} on this connection; are both sides "
                        "the same mwrt version?")

    def close(self) -> None:
        """Release what the path holds (the channel closes, or the peer is gone)."""
