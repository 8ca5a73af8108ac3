"""Every error mwrt raises; each message names the place (node, rank, peer) and the fix."""

from __future__ import annotations


class MwrtError(Exception):
    """Base of all mwrt errors."""


class ConfigError(MwrtError, ValueError):
    """A setting or argument is invalid."""


class WireError(MwrtError):
    """A frame could not be decoded, or is too large, or of an unknown version."""


class QuotaError(MwrtError):
    """A master asked a worker for more than its share (streams, tensors, bytes, backlog)."""


class AuthError(MwrtError):
    """A peer failed authentication."""


class RemoteError(MwrtError):
    """User code failed on a worker: names node, device, stream, op, shapes and the traceback."""

    def __init__(self, message, *, node=None, device=None, stream=None, op=None,
                 remote_traceback="", issued_at=""):
        self.node, self.device, self.stream, self.op = node, device, stream, op
        self.remote_traceback, self.issued_at = remote_traceback, issued_at
        parts = [message]
        if issued_at:
            parts.append(f"issued at: {issued_at}")
        if remote_traceback:
            parts.append(f"### worker traceback (node {node}):\n{remote_traceback.rstrip()}")
        super().__init__("\n".join(parts))


class WorkerLostError(MwrtError, ConnectionError):
    """A worker died, restarted or stopped answering; its tensors are gone."""

    def __init__(self, message, *, node=None, address=None):
        self.node, self.address = node, address
        super().__init__(message)


class ChannelError(MwrtError):
    """A data-channel operation failed."""

    peer: int | None = None  # the global rank it concerns, where known
    group_peer: int | None = None  # that rank's place in the group that saw it, where known


class ChannelClosedError(ChannelError, ConnectionError):
    """The peer closed the connection or died; names the peer."""

    def __init__(self, message, *, peer=None):
        self.peer = peer
        super().__init__(message)


class ChannelTimeoutError(ChannelError, TimeoutError):
    """A data-channel wait ran past its timeout; names what was awaited and from whom."""


class PlacementError(MwrtError, ValueError):
    """A mesh op whose operands' placements have no rule; redistribute one of them first."""


class CollectiveMismatchError(MwrtError):
    """Ranks disagree on a collective's op, dtype, shape or kind; names the ranks and values."""


class RendezvousError(MwrtError):
    """Ranks could not find each other: missing or duplicate ranks, store unreachable."""


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """A rendezvous wait ran past its timeout; names the missing ranks or keys."""
