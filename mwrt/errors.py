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

    cause: str | None = None  # the worker's error class, where this is also of it (of())

    def __reduce__(self):
        """Pickled by the name of its cause (a class of() makes has no importable name)."""
        return (_rebuilt, (self.cause, self.args, self.__dict__))

    @staticmethod
    def of(kind: str | None) -> type[RemoteError]:
        """RemoteError, or for a worker's error of a class the master knows by name `kind` (a
        builtin such as IndexError, NumPy's LinAlgError or AxisError) a RemoteError that is
        also of that class: `except IndexError:` around the read catches it, as around the
        call on NumPy or torch (Ray's task errors do the same)."""
        cause = _known_class(kind)
        if cause is None:
            return RemoteError
        made = _AS_CAUSE.get(cause)
        if made is None:
            try:  # (a class laid out or made otherwise, UnicodeDecodeError's, cannot be one)
                made = type(f"Remote{cause.__name__}", (RemoteError, cause), {
                    "__str__": Exception.__str__, "__module__": __name__, "cause": kind})
                str(made("a trial"))
            except Exception:  # noqa: BLE001 - whatever the class refuses: a plain RemoteError
                made = RemoteError
            _AS_CAUSE[cause] = made
        return made


def _known_class(kind: str | None) -> type | None:
    """The Exception class named `kind` among Python's builtins and NumPy's own."""
    import builtins
    import sys

    found = getattr(builtins, kind or "", None)
    numpy = sys.modules.get("numpy")
    if found is None and numpy is not None and kind in ("LinAlgError", "AxisError"):
        found = numpy.linalg.LinAlgError if kind == "LinAlgError" else numpy.exceptions.AxisError
    # (not StopIteration: raised from a read inside a generator, Python makes it another)
    if isinstance(found, type) and issubclass(found, Exception) and found not in (
            Exception, StopIteration, StopAsyncIteration):
        return found
    return None


_AS_CAUSE: dict[type, type[RemoteError]] = {}  # a cause's class -> the RemoteError of it


def _rebuilt(cause: str | None, args: tuple, state: dict) -> RemoteError:
    """A pickled RemoteError again, of the class of() makes for `cause`."""
    cls = RemoteError.of(cause)
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


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
