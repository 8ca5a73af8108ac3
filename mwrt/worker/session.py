"""One master's session on a worker: its tensors, streams and events, freed together."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from .. import config
from ..channels.segments import new_name, write_new
from ..errors import QuotaError
from ..protocol import wire
from ..protocol.wire import DEFAULT_STREAM_LIMIT
from .executor import StreamExecutor
from .graphs import GraphStore, ImplicitEvents, Pending
from .quotas import Inflight, TensorTable

_MAX_NAMES = 1 << 16
_SHARED_KEPT = 64  # segment names a session keeps before it forgets those already taken

# A master connects three sockets, identified as SESSION/tx (commands), SESSION/rx (replies;
# it sends the Hello, so the worker knows it is connected) and SESSION/hb (heartbeats, relays).
TX, RX, HB = b"tx", b"rx", b"hb"
FIRED_KEPT = 1 << 18  # fired events whose time a session keeps (~100 bytes each)


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

    def __init__(self, daemon, sid: bytes, session_id: str, master: str, node: int):
        self.daemon, self.id = daemon, session_id
        self.sid, self.identity = sid, sid + b"/" + RX  # its master's connections (SESSION/NONCE)
        self.master, self.node = master, node
        self.tensors: dict[int, object] = TensorTable(node)
        self.inflight = Inflight(node)
        self.streams: dict[int, StreamExecutor] = {}
        self.events: dict[int, EventState] = {}
        self.pending_frees: dict[int, int] = {}
        self.event_waiters: dict[int, list] = {}
        self.fired: dict[int, float] = {}  # events fired for good: their times, oldest first
        self.max_events = config.get("session_events")
        self.waits = 0  # tokens in event_waiters
        self.implicit = ImplicitEvents(self)
        self.graphs = GraphStore(self)
        self.functions: dict[bytes, object] = {}  # shipped functions, by content (an LRU)
        # While a Replay waits for its graph's decoding: what came after it, in order.
        self.parked: list | None = None
        self.waiting: Pending | None = None  # the graph's decoding it waits for
        self.inbox: deque = deque()  # admitted slices of batches waiting for this session's turn
        self.lock = threading.Lock()
        self.last_seen = time.monotonic()
        self.last_seq = -1
        self.trace: list | None = None  # timeline slices while the master profiles
        self.data = None  # the data channel's state, once the master sent a Join
        self.closed = False
        self.grace = 0.0  # seconds kept after the master's silence, to be re-attached
        self.names: dict[str, int] = {}  # tensor ids by the names the master gave them
        self.max_id = 0  # the highest command id seen: a re-attaching master counts on
        self.inline = 0  # stream commands the socket thread ran itself (idle streams)
        self.shared: list[str] = []  # segments made for t.numpy(copy=False), maybe not taken
        self.lent: dict[int, object] = {}  # arrays a master on this host reads in place, by Lend

    def attach(self, sid: bytes, master: str) -> None:
        """Pass this session to the master of connections `sid` (a re-attach)."""
        self.sid, self.identity, self.master = sid, sid + b"/" + RX, master
        self.last_seq, self.last_seen = -1, time.monotonic()

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
            value: Any = self.tensors.get(ref)  # an array, or what a remote function returned
            if value is not None and hasattr(value, "shape"):
                device = -1 if arrays.in_host_memory(value) else int(value.device.id)
                named[name] = [ref, list(value.shape), value.dtype.str, device]
        streams = [s for s in self.streams if s >= DEFAULT_STREAM_LIMIT]
        return {"names": named, "last_id": self.max_id, "streams": streams}

    def event(self, event_id: int) -> EventState:
        """The state of event `event_id`, created on first mention; QuotaError past
        MWRT_SESSION_EVENTS events not yet fired."""
        with self.lock:
            state = self.events.get(event_id)
            if state is None:
                if len(self.events) >= self.max_events:
                    raise QuotaError(
                        f"event {event_id}: this master already has {len(self.events)} events "
                        f"not yet fired on node {self.node} (MWRT_SESSION_EVENTS = "
                        f"{self.max_events}); wait on or drop events before making more")
                state = self.events[event_id] = EventState()
                when = self.fired.pop(event_id, None)
                if when is not None:  # fired before, and kept as its time alone
                    state.time = when
                    state.fired.set()
                    state.recorded.set()
            return state

    def fire_event(self, event_id, when, send, error: str = "") -> None:
        """Mark an event done, answer its waiters, and tell the master (for relays)."""
        with self.lock:
            quiet = event_id not in self.events and not error  # nobody holds or waits on it
            if quiet:
                self._keep_fired(event_id, when if when is not None else
                                 self.fired.get(event_id, 0.0))
        if quiet:
            if when is not None:
                send(self.sid + b"/" + HB, wire.Fired(token=-1, event=event_id, time=when))
            return
        state = self.event(event_id)
        with self.lock:
            state.error = error
            if when is not None:
                state.time = when
            state.fired.set()
            state.recorded.set()
            waiters = self.event_waiters.pop(event_id, [])
            self.waits -= len(waiters)
            if not error and self.events.get(event_id) is state:
                # Fired for good: only its time is kept (a few bytes, not two locks), and
                # the oldest such go first past the bound (asked again, they seem unfired).
                del self.events[event_id]
                self._keep_fired(event_id, state.time)
        for token in waiters:
            send(self.identity, wire.Done(token=token, value={"done": True, "time": state.time}))
        if when is not None:
            send(self.sid + b"/" + HB, wire.Fired(token=-1, event=event_id, time=state.time))

    def _keep_fired(self, event_id: int, when: float) -> None:
        """Remember that `event_id` fired at `when` (holding self.lock)."""
        self.fired.pop(event_id, None)
        self.fired[event_id] = when  # last: the newest
        if len(self.fired) > FIRED_KEPT:
            del self.fired[next(iter(self.fired))]

    def fired_time(self, event_id: int) -> float | None:
        """When event `event_id` fired, if it has for good (None if not, or not known)."""
        return self.fired.get(event_id)

    def add_waiter(self, event_id: int, token: int) -> bool:
        """Answer `token` when event `event_id` fires; False if it has fired already.
        QuotaError past MWRT_SESSION_EVENTS waits."""
        if self.fired_time(event_id) is not None:
            return False
        state = self.event(event_id)
        with self.lock:
            if state.fired.is_set():
                return False
            if self.waits >= self.max_events:
                raise QuotaError(
                    f"event {event_id}: this master already waits on {self.waits} events on "
                    f"node {self.node} (MWRT_SESSION_EVENTS = {self.max_events}); wait on "
                    "fewer at once")
            self.event_waiters.setdefault(event_id, []).append(token)
            self.waits += 1
            return True

    def share(self, array) -> str:
        """Copy `array` into a new /dev/shm segment that the master maps and unlinks; its
        name. Names the master never took are unlinked when the session ends."""
        name = new_name()
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        path = write_new(name, flat.data if flat.nbytes else memoryview(b"\0"))  # (never empty)
        with self.lock:
            if self.closed:  # ended while we copied: close() has unlinked the others already
                os.unlink(path)
                return name
            if len(self.shared) >= _SHARED_KEPT:  # those the master took are gone already
                self.shared = [path for path in self.shared if os.path.exists(path)]
            self.shared.append(path)
        return name

    def lend(self, lend: int, array) -> None:
        """Hold `array` (its memory stays where Lend said) until unlend(lend)."""
        with self.lock:
            if not self.closed:  # ended meanwhile: close() has dropped the others already
                self.lent[lend] = array

    def unlend(self, lend: int) -> None:
        """Let go of what Lend `lend` pinned (unknown ids: the session ended between)."""
        with self.lock:
            self.lent.pop(lend, None)

    def load_function(self, blob: bytes):
        """Unpickle a shipped function (cloudpickle), cached by content for this session only:
        module state one master's function leaves must never reach another's. Keyed only."""
        if self.daemon.keys is None:  # routes.py refuses needs_key commands first
            raise PermissionError("remote: this worker has no key, so it runs no shipped code")
        digest, functions = hashlib.sha256(blob).digest(), self.functions
        with self.lock:  # the session's streams load concurrently
            fn = functions.pop(digest, None)
            if fn is not None:
                functions[digest] = fn  # last: the most recently used
                return fn
        import cloudpickle

        fn = cloudpickle.loads(blob)
        with self.lock:
            while len(functions) >= self.daemon.max_functions:
                functions.pop(next(iter(functions)))  # the least recently used
            functions[digest] = fn
        return fn

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
        return {"tensors": len(arrays), "bytes": _held(arrays),
                "streams": len(self.streams), "events": len(self.events),
                "events_fired": len(self.fired), "waits": self.waits,
                "functions": len(self.functions), "graphs": len(self.graphs.graphs),
                "graph_bytes": self.graphs.nbytes,
                "queued_bytes": self.inflight.nbytes, "running": self.running(),
                # hand-offs to stream threads, and commands run without one
                "handoffs": sum(ex.taken for ex in list(self.streams.values())),
                "ops": sum(ex.ops for ex in list(self.streams.values())),  # commands run
                "inline": self.inline,
                **(self.data.pool.stats() if self.data is not None else {})}

    def running(self) -> list[dict]:
        """What each busy stream runs now, and for how long."""
        from .handlers import op_name

        now = time.monotonic()
        out: list[dict] = []
        for executor in list(self.streams.values()):
            running = executor.running
            if running is not None:
                out.append({"stream": executor.id, "command": running[0].id,
                            "op": op_name(running[0]), "seconds": now - running[1]})
        return out

    def close(self) -> None:
        """Stop the executors and drop every tensor, channel and event at once."""
        if self.closed:
            return
        self.closed = True
        for executor in list(self.streams.values()):
            executor.stop()
        self.daemon.op_slots.release(self)  # its streams waiting for a turn: to their end
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
        self.fired.clear()
        self.pending_frees.clear()
        self.graphs.clear()
        self.parked = None
        self.functions.clear()
        self.trace = None
        with self.lock:  # share() and lend() add under it, and look at self.closed first
            shared, self.shared = self.shared, []
            self.lent.clear()
        for path in shared:  # the master died before it took them
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _held(arrays: list) -> int:
    """The bytes `arrays` hold: an array's, or a torch tensor's storage as it is now (once
    per storage; a sharded module's whole parameters, freed between uses, hold none)."""
    total, seen = 0, set()
    for a in arrays:
        storage = getattr(a, "untyped_storage", None)
        if storage is None:
            total += a.nbytes
            continue
        storage = storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return int(total)
