"""One master's session on a worker: its tensors, streams and events, freed together."""

from __future__ import annotations

import threading
import time

from ..errors import QuotaError
from ..protocol import wire
from ..protocol.wire import DEFAULT_STREAM_LIMIT
from .executor import StreamExecutor
from .graphs import GraphStore, ImplicitEvents
from .quotas import Inflight, TensorTable

_MAX_NAMES = 1 << 16

# A master connects three sockets, identified as SESSION/tx (commands), SESSION/rx (replies;
# it sends the Hello, so the worker knows it is connected) and SESSION/hb (heartbeats, relays).
TX, RX, HB = b"tx", b"rx", b"hb"


class EventState:
    """An event's completion flag and the time it fired; for one a GPU stream of this worker
    recorded, also its CUDA event, which may not have fired yet (mwrt.worker.cuda_events)."""

    __slots__ = ("fired", "time", "error", "recorded", "cuda")

    def __init__(self):
        self.fired = threading.Event()
        self.recorded = threading.Event()  # set with fired, or at a GPU stream's record
        self.cuda = None
        self.time = 0.0
        self.error = ""  # set when the event will never really fire (its node was lost)


class Session:
    """State kept for one master; every stream of the session has its own executor."""

    def __init__(self, daemon, identity: bytes, session_id: str, master: str, node: int):
        self.daemon, self.identity, self.id = daemon, identity, session_id
        self.sid = session_id.encode()
        self.master, self.node = master, node
        self.tensors: dict[int, object] = TensorTable(node)
        self.inflight = Inflight(node)
        self.streams: dict[int, StreamExecutor] = {}
        self.events: dict[int, EventState] = {}
        self.pending_frees: dict[int, int] = {}
        self.event_waiters: dict[int, list] = {}
        self.implicit = ImplicitEvents(self)
        self.graphs = GraphStore(self)
        self.functions: dict[bytes, object] = {}  # shipped functions, by content (an LRU)
        self.lock = threading.Lock()
        self.last_seen = time.monotonic()
        self.last_seq = -1
        self.trace: list | None = None  # timeline slices while the master profiles
        self.data = None  # the data channel's state, once the master sent a Join
        self.closed = False
        self.grace = 0.0  # seconds kept after the master's silence, to be re-attached
        self.names: dict[str, int] = {}  # tensor ids by the names the master gave them
        self.max_id = 0  # the highest command id seen: a re-attaching master counts on

    def stream(self, stream_id: int, device: int | None = None) -> StreamExecutor:
        """The executor of `stream_id`; default streams (id == device) start on first use."""
        executor = self.streams.get(stream_id)
        if executor is None:
            if device is None:
                if not -1 <= stream_id < DEFAULT_STREAM_LIMIT:
                    raise KeyError(f"stream {stream_id}: unknown on node {self.node}; "
                                   "create it with mwrt.Stream() first")
                device = stream_id
            self.daemon.streams.take(self, stream_id)  # QuotaError past this master's share
            try:
                executor = StreamExecutor(self, stream_id, device)
            except BaseException:
                self.daemon.streams.give(1)
                raise
            self.streams[stream_id] = executor
        return executor

    def name_tensor(self, ref: int, name: str) -> None:
        """Remember tensor `ref` as `name` (bounded: names are the master's to choose)."""
        if name not in self.names and len(self.names) >= _MAX_NAMES:
            raise QuotaError(f"name: this session already named {_MAX_NAMES} tensors; name "
                             "fewer (a name is for finding a tensor after a re-attach)")
        self.names[name] = ref

    def resumed(self) -> dict:
        """What a master re-attaching to this session is told: named tensors, ids, streams."""
        from .. import arrays

        named = {}
        for name, ref in self.names.items():
            value = self.tensors.get(ref)
            if value is not None and hasattr(value, "shape"):
                device = -1 if arrays.in_host_memory(value) else int(value.device.id)
                named[name] = [ref, list(value.shape), value.dtype.str, device]
        streams = [s for s in self.streams if s >= DEFAULT_STREAM_LIMIT]
        return {"names": named, "last_id": self.max_id, "streams": streams}

    def event(self, event_id: int) -> EventState:
        """The state of event `event_id`, created on first mention."""
        with self.lock:
            state = self.events.get(event_id)
            if state is None:
                state = self.events[event_id] = EventState()
            return state

    def fire_event(self, event_id, when, send, error: str = "") -> None:
        """Mark an event done, answer its waiters, and tell the master (for relays)."""
        state = self.event(event_id)
        with self.lock:
            state.error = error
            if when is not None:
                state.time = when
            state.fired.set()
            state.recorded.set()
            waiters = self.event_waiters.pop(event_id, [])
        for token in waiters:
            send(self.identity, wire.Done(token=token, value={"done": True, "time": state.time}))
        if when is not None:
            send(self.sid + b"/" + HB, wire.Fired(token=-1, event=event_id, time=state.time))

    def free(self, ids, uses: int) -> None:
        """Drop tensors once each of the `uses` streams that were sent this free reached it."""
        if uses <= 1:
            for tid in ids:
                self.tensors.pop(tid, None)
            return
        with self.lock:
            for tid in ids:
                left = self.pending_frees.get(tid, uses) - 1
                if left <= 0:
                    self.pending_frees.pop(tid, None)
                    self.tensors.pop(tid, None)
                else:
                    self.pending_frees[tid] = left

    def peer_lost(self, rank: int, reason: str) -> None:
        """The master saw node `rank` die: transfers and collectives waiting on it fail now."""
        if self.data is not None:
            self.data.peer_lost(rank, f"node {rank} is lost ({reason})")

    def stats(self) -> dict:
        """Live tensors and their bytes."""
        arrays = [t for t in list(self.tensors.values()) if hasattr(t, "nbytes")]
        return {"tensors": len(arrays), "bytes": int(sum(a.nbytes for a in arrays)),
                "streams": len(self.streams), "events": len(self.events),
                "functions": len(self.functions),
                "queued_bytes": self.inflight.nbytes,
                **(self.data.pool.stats() if self.data is not None else {})}

    def close(self) -> None:
        """Stop the executors and drop every tensor, channel and event at once."""
        if self.closed:
            return
        self.closed = True
        for executor in list(self.streams.values()):
            executor.stop()
        self.daemon.streams.give(len(self.streams))
        data, self.data = self.data, None
        if data is not None:
            data.close()
        for state in list(self.events.values()):
            state.fired.set()  # release any stream waiting on an event of this session
            state.recorded.set()
        self.tensors.clear()
        self.streams.clear()
        self.events.clear()
        self.event_waiters.clear()
        self.pending_frees.clear()
        self.graphs.graphs.clear()
        self.functions.clear()
        self.trace = None
