"""CUDA-like streams and events on every node, with cross-node event waits relayed by the master.

A stream is an ordered queue of commands on one (node, device), run by its own executor
on the worker, so streams overlap. An event marks a point in a stream; another stream —
on the same node or another — can wait for it without the master blocking. A tensor used
on a stream other than the one that wrote or read it is ordered automatically (ordering.py);
events order work that shares no tensor. Stream(order="manual") or MWRT_STREAM_ORDER=manual
keep CUDA's rule instead: order the streams with events yourself.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from ..errors import MwrtError
from ..protocol import wire
from . import context, ordering
from .cluster import OfTheSession, current

_EVENT_IDS = itertools.count(1)


class Stream(OfTheSession):
    """An ordered queue of commands on (node, device); streams of one worker run concurrently."""

    _kind = "a stream of this master's session"
    _fix = "make one where it is needed (mwrt.Stream())"

    def __init__(self, node: int | None = None, device: int | None = None, *,
                 order: str = "safe", _id=None):
        self.node = context.current_node() if node is None else node
        self._node = current().node(self.node)
        self.device = self._node.check_device(context.current_device() if device is None
                                              else device)
        if _id is None:
            self._node.check_stream_room()
            _id = next(current().stream_ids)
            self._node.issue(wire.NewStream(id=next(self._node.ids), stream=_id,
                                            device=self.device))
        if order not in ("safe", "manual"):
            raise ValueError(f"Stream: order must be 'safe' or 'manual' (got {order!r})")
        if order == "manual":
            ordering.MANUAL.add(_id)
        self.id = _id

    @classmethod
    def default(cls, node: int | None = None, device: int | None = None) -> Stream:
        """The default stream of (node, device)."""
        device = context.current_device() if device is None else device
        return cls(node, device, _id=device)

    def __eq__(self, other):
        return isinstance(other, Stream) and (self.node, self.id) == (other.node, other.id)

    def __hash__(self):
        return hash((self.node, self.id))

    def __repr__(self):
        kind = "default " if self.id < wire.DEFAULT_STREAM_LIMIT else ""
        return f"<{kind}Stream {self.id} on node {self.node} device {self.device}>"

    def synchronize(self) -> None:
        """Wait until everything issued to this stream has run; raises its sticky error."""
        node = self._node
        node.request(wire.Sync(id=next(node.ids), stream=self.id, token=next(node.tokens)),
                     f"synchronize() of {self!r}")

    def query(self) -> bool:
        """True if everything issued to this stream has run (does not wait)."""
        node = self._node
        reply, _ = node.request(wire.Query(id=next(node.ids), stream=self.id,
                                           token=next(node.tokens)), f"query() of {self!r}")
        return bool(reply.value)

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait for `event` (the master does not block)."""
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        """Make later work on this stream wait for all work issued to `stream` so far."""
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        """Record `event` (or a new one) at this point of the stream."""
        event = Event() if event is None else event
        event.record(self)
        return event


class Event(OfTheSession):
    """A point in a stream; query/synchronize/wait/elapsed_time as CUDA's."""

    _kind = "an event of this master's session"
    _fix = "record one where it is needed (mwrt.Event())"

    def __init__(self, enable_timing: bool = False):
        self.enable_timing = enable_timing
        self._id: int | None = None
        self._time = 0  # the id of the Record command: what a wait on it covers
        self._stream: Stream | None = None
        self._fired = False  # set by the master's heartbeat thread when the worker says so

    def __repr__(self):
        where = "unrecorded" if self._stream is None else f"recorded on {self._stream!r}"
        return f"<Event {self._id} {where}>"

    def record(self, stream: Stream | None = None) -> None:
        """Capture this point of `stream` (default: the current stream)."""
        stream = current_stream() if stream is None else stream
        self._id, self._stream, self._fired = next(_EVENT_IDS), stream, False
        current().heartbeat.watch(self)
        node = stream._node
        self._time = next(node.ids)
        node.issue(wire.Record(id=self._time, stream=stream.id, event=self._id,
                               timing=self.enable_timing))

    def query(self) -> bool:
        """True if the recorded work is done (or nothing was recorded)."""
        return self._ask(False)["done"] if self._stream is not None else True

    def synchronize(self) -> None:
        """Wait until the recorded work is done."""
        if self._stream is not None:
            self._ask(True)

    def wait(self, stream: Stream | None = None) -> None:
        """Make later work on `stream` wait for this event, across nodes too."""
        stream = current_stream() if stream is None else stream
        if self._stream is None or self._id is None:  # never recorded: nothing to wait for
            return
        target, source = stream._node, self._stream._node
        if source.closed:  # recorded in an ended session: it would never fire
            source.check_open()
        if target is not source and ordering.capture:
            raise MwrtError("graph: a wait on an event of another node cannot be captured (the "
                            "master relays it); record and wait on the same node inside graphs")
        if target is not source:
            source.flush()  # the record must reach its worker for the relay to fire
            if not current().heartbeat.relay(self, source.index, target.index):
                return  # already fired: nothing to wait for
        else:  # safe streams need not order again what this wait orders
            ordering.note(target, stream.id, self._stream.id, self._time)
        target.issue(wire.WaitEvent(id=next(target.ids), stream=stream.id, event=self._id))

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between this event and `end` (both synchronized first)."""
        if not (self.enable_timing and end.enable_timing):
            raise ValueError("elapsed_time: both events need Event(enable_timing=True)")
        if self._stream is None or end._stream is None:
            raise ValueError("elapsed_time: both events must be recorded first")
        return (end._ask(True)["time"] - self._ask(True)["time"]) * 1000.0

    def _ask(self, wait: bool) -> dict:
        if self._stream is None or self._id is None:  # its callers ask recorded events only
            raise ValueError(f"{self!r}: not recorded; call record() first")
        node = self._stream._node
        query = wire.EventQuery(id=next(node.ids), event=self._id, wait=wait,
                                token=next(node.tokens))
        reply, _ = node.request(query, f"{'synchronize' if wait else 'query'}() of {self!r}")
        return reply.value


def current_stream(node: int | None = None, device: int | None = None) -> Stream:
    """The stream ops on (node, device) go to now: the one set with `mwrt.stream`, or default."""
    node = context.current_node() if node is None else node
    device = context.current_device() if device is None else device
    for s in reversed(context.stream_stack()):
        if s.node == node and s.device == device:
            return s
    return Stream.default(node, device)


@contextlib.contextmanager
def stream(s: Stream) -> Iterator[Stream]:
    """Send ops issued inside (on s's node and device) to stream `s`; also makes s's place
    current."""
    s._node.check_open()  # one of an ended session: its worker no longer knows it
    with context.chosen_stream(s), context.node(s.node, s.device):
        yield s
