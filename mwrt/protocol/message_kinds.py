"""The kinds of message (Command, StreamCommand, Reply), the traits that say how the daemon
treats each, and the protocol's constants; the messages themselves are in messages.py."""

# No `from __future__ import annotations`: msgspec reads each field's type as an object,
# where a string costs it an eval() (1,700 of them: ~30 ms of every process's start).
from typing import ClassVar

import msgspec

# -- protocol constants ---------------------------------------------------------------------

# Stream ids below this are the default streams (id == device); a master numbers the streams
# it creates from here up.
DEFAULT_STREAM_LIMIT = 1 << 20
# Streams one session may have on a worker: each is a thread, and a master must not be able
# to start unboundedly many.
MAX_STREAMS = 1024
# Data-channel tags are (space << 56) | ...: a collective's spaces are 0-2 (see
# mwrt.collective.group), and transfers between master and workers take space 3.
TAG_SPACE_SHIFT = 56
TRANSFER_TAGS = 3 << TAG_SPACE_SHIFT
# Event ids at or below this are implicit (safe streams, graphs): recorded and waited on one
# worker, counted rather than latched, never reported to the master. Above it, negative ids
# are the master's own (backpressure checkpoints) and positive ones the user's.
IMPLICIT_EVENTS = -(1 << 48)


class Message(msgspec.Struct, array_like=True, frozen=True, gc=False, forbid_unknown_fields=True):
    """A message: packed as [code, *fields]; the traits below say how the daemon treats it."""

    # The master's socket that carries it: tx (batched commands), rx (the Hello), hb
    # (heartbeats and relays); "" for a reply.
    socket: ClassVar[str] = ""
    # Run in order by its stream's executor; otherwise the socket thread handles it at once.
    on_stream: ClassVar[bool] = False
    # Answered once its stream reaches it; on an idle host stream the socket thread may
    # answer it at once, saving two thread hand-offs.
    sync_point: ClassVar[bool] = False
    # Its token (when >= 0) asks for its result: a failure is then the answer, not a sticky
    # error of the stream.
    answered: ClassVar[bool] = False
    # Runs even after its stream failed: it reports the error, frees memory, fires an event,
    # or tells peers that nothing is coming.
    always_runs: ClassVar[bool] = False
    # Its field `frame` indexes a data frame of its batch (the master fills it in).
    data_frame: ClassVar[bool] = False
    # Runs code the master shipped: only a keyed daemon (authenticated masters) accepts it.
    needs_key: ClassVar[bool] = False
    # Its receive is posted as it arrives, so bytes land in place before its stream gets to it.
    posts_receive: ClassVar[bool] = False
    # Short when its operands are small: on an idle host stream the socket thread may run it
    # at once (bounded by MWRT_INLINE_OP_ELEMENTS), saving the executor's two hand-offs.
    quick: ClassVar[bool] = False
    # The worker handler's name: the class name in snake case (set below).
    handler: ClassVar[str] = ""


# Each subclass says frozen=True as well: msgspec inherits it, but type checkers read
# dataclass_transform's keywords per class (PEP 681) and would take the subclass as mutable.
class Command(Message, frozen=True):
    """Master -> worker, numbered by the master."""

    socket = "tx"  # answered on the socket thread unless on_stream
    id: int


class StreamCommand(Command, frozen=True):
    """A command that runs on stream `stream`, in issue order."""

    on_stream = True
    stream: int


class Reply(Message, frozen=True):
    """Worker -> master: the answer to the command that asked with `token`."""

    token: int



TRAITS = ("socket", "on_stream", "sync_point", "answered", "always_runs", "data_frame",
          "needs_key", "posts_receive", "quick", "handler")


def traits(cls) -> dict:
    """A message class's traits by name (for reports and tests)."""
    return {name: getattr(cls, name) for name in TRAITS}
