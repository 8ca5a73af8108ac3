"""What a master holds itself to: result sizes, and how far a worker may fall behind it.

Ops return at once, so a fast master can queue far more commands than a busy worker
runs. Limits bound that: every half of MWRT_MAX_BACKLOG_BYTES of commands sent to
a node, it records a checkpoint event on each stream written since the last one, and
waits (up to MWRT_SYNC_TIMEOUT) until the worker has passed the checkpoint before that.
So a worker is at most MWRT_MAX_BACKLOG_BYTES behind, and the master waits on events
the worker fires, never on a timer.
"""

from __future__ import annotations

import itertools
import math
import os
import threading

from .. import config
from ..ops import Spec
from ..protocol import wire

_CHECKPOINTS = itertools.count(-1, -1)  # negative: never one of the user's event ids


class Limits:
    """One node's limits on the master: result sizes, and bytes of commands sent since the
    last checkpoint (waiting past MWRT_MAX_BACKLOG_BYTES)."""

    def __init__(self, node):
        self.node = node
        # Only a limit set on the master is checked here (read once: it is checked on every
        # op); the default is the worker's host's, which the worker checks itself.
        given = os.environ.get(config.SETTINGS["max_tensor_bytes"].env)
        self.max_tensor = config.get("max_tensor_bytes") if given else None
        self.limit = config.get("max_backlog_bytes")
        # due() past half of it (asked after every send: one comparison); none for 0
        self._due_at = self.limit / 2 if self.limit > 0 else math.inf
        self.sent = 0
        self.streams: set[int] = set()  # streams written since the last checkpoint
        self.previous: tuple = ()  # that checkpoint's events
        self.checkpoints = 0  # how many times this master waited on the worker (statistics)
        self._lock = threading.Lock()

    def check_result(self, name: str, result) -> None:
        """Refuse, at issue time, an op whose meta rule gives a result over the tensor limit."""
        if self.max_tensor is None:
            return
        for spec in result if type(result) is tuple else (result,):
            if isinstance(spec, Spec):
                nbytes = math.prod(spec.shape) * spec.dtype.itemsize
                if nbytes > self.max_tensor:
                    raise MemoryError(
                        f"{name}: its result would take {nbytes} bytes ({spec.dtype}"
                        f"{list(spec.shape)}), over the limit of {self.max_tensor} "
                        "(MWRT_MAX_TENSOR_BYTES); work on smaller pieces")

    def count(self, nbytes: int) -> None:
        """Add a sent batch's bytes (called under the node's send lock)."""
        self.sent += nbytes

    def due(self) -> bool:
        return self.sent >= self._due_at

    def checkpoint(self) -> None:
        """Mark this point on every stream written since the last checkpoint, then wait
        until the worker has run everything before that last one."""
        if not self._lock.acquire(blocking=False):
            return  # another thread of this master is already at a checkpoint
        try:
            node = self.node
            previous, self.sent = self.previous, 0
            streams, self.streams = self.streams, set()
            self.previous = tuple(next(_CHECKPOINTS) for _ in streams)
            for stream, event in zip(streams, self.previous):
                node.issue(wire.Record(next(node.ids), stream, event, False))
            tokens = []
            for event in previous:
                tokens.append(next(node.tokens))
                node.issue(wire.EventQuery(next(node.ids), event, True, tokens[-1]))
            for token in tokens:
                node.wait(token, f"the worker's catching up (this master was {self.limit} "
                          "bytes of commands ahead of it, MWRT_MAX_BACKLOG_BYTES)")
            self.checkpoints += bool(tokens)
        finally:
            self._lock.release()
