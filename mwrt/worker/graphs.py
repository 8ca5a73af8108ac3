"""Implicit events and captured graphs: a session's worker-side state for safe streams.

Implicit events (ids at or below wire.IMPLICIT_EVENTS) are the master's way to order a use
of a tensor on one stream after its uses on another: a Record on the first, a WaitEvent on
the second, on the same worker. They count rather than latch, so a graph replayed many
times can record and wait on the same ids, and each wait consumes the record it matched.

A graph is a list of stream commands recorded once on the master (DefineGraph). A Replay
hands them, grouped by stream, to the streams' executors as if they had arrived in one
batch, with the captured input ids mapped to the ids the Replay binds.
"""

from __future__ import annotations

import threading
import time

from msgspec.structs import replace

from .. import config
from ..errors import QuotaError, WireError
from ..protocol import wire
from .compiled import Prepared
from .tensors import ref_ids

_TENSOR_FIELDS = ("ref", "out")  # int fields naming a tensor (besides Refs in args)


class ImplicitEvents:
    """Counting events, one waiter per record, local to the session."""

    def __init__(self, session):
        self.session = session
        self.counts: dict[int, int] = {}
        self.cond = threading.Condition()

    def record(self, event: int) -> None:
        with self.cond:
            self.counts[event] = self.counts.get(event, 0) + 1
            self.cond.notify_all()

    def wait(self, event: int, timeout: float) -> None:
        """Consume one record of `event`; TimeoutError naming it past `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.counts.get(event):
                left = deadline - time.monotonic()
                if self.session.closed:
                    return
                if left <= 0:
                    raise TimeoutError(
                        f"wait_event: the stream this one waits for (implicit event {event}) "
                        f"did not get there after {timeout} s (MWRT_SYNC_TIMEOUT); is it stuck "
                        "in a long op or waiting on this stream?")
                self.cond.wait(min(left, 0.2))
            left = self.counts[event] - 1
            if left:
                self.counts[event] = left
            else:
                del self.counts[event]


class Graph:
    """One recorded graph: its commands grouped by stream, and where its inputs appear."""

    __slots__ = ("groups", "inputs", "bound", "prepared", "writes", "replayed")

    def __init__(self, commands: list, inputs: tuple):
        self.groups: dict[int, list] = {}
        for command in commands:
            if not command.on_stream or command.sync_point or command.posts_receive:
                raise WireError(f"graph: {type(command).__name__} cannot be replayed (only "
                                "stream commands that need no answer can)")
            self.groups.setdefault(command.stream, []).append(command)
        self.inputs = frozenset(inputs)
        # (stream, index) of each command that names an input: the only ones a Replay rebuilds
        self.bound = [(stream, i) for stream, group in self.groups.items()
                      for i, command in enumerate(group) if _names(command, self.inputs)]
        # A replay without rebinding runs steps prepared once (compiled.py) per stream.
        self.prepared = {stream: Prepared(group) for stream, group in self.groups.items()}
        # The tensors each replay makes again, under the ids it made them first.
        self.writes = frozenset(i for command in commands for i in _outs(command))
        self.replayed = False

    def bind(self, bindings: tuple) -> dict:
        """The groups to submit, with captured input ids replaced as `bindings` pairs them."""
        mapping = dict(zip(bindings[::2], bindings[1::2]))
        if not mapping:
            return self.prepared
        unknown = set(mapping) - self.inputs
        if unknown:
            raise KeyError(f"graph: tensors {sorted(unknown)} are not inputs of this graph")
        groups = {stream: list(group) for stream, group in self.groups.items()}
        for stream, i in self.bound:
            groups[stream][i] = _rebind(groups[stream][i], mapping)
        return groups


class Pending:
    """A graph whose definition the decoder thread has not read yet."""

    __slots__ = ("command", "max_bytes", "ready", "result")

    def __init__(self, command, max_bytes: int):
        self.command, self.max_bytes = command, max_bytes
        self.ready = threading.Event()
        self.result: Graph | str = "not decoded yet"  # the graph, or why it is malformed

    def decode(self) -> None:
        """Build the graph (decoder thread): a malformed one is kept as its error."""
        try:
            commands = []
            for command in wire.iter_body(self.command.body, self.max_bytes):
                commands.append(command)
                if len(commands) % 64 == 0:
                    time.sleep(0)  # lets the socket thread have the GIL between messages
            self.result = Graph(commands, tuple(self.command.inputs))
        except (WireError, TypeError, ValueError) as exc:
            self.result = str(exc)
        self.ready.set()


class GraphDecoder:
    """The daemon's thread that decodes graph definitions; it wakes the socket thread after
    each (an empty message into its reply queue, `address`), so Replays parked behind one go
    on: one socket fewer in the socket thread's poll, which costs a system call per socket."""

    def __init__(self, context, address: str):
        import queue

        self.context, self.address = context, address
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="mwrt-graphs")

    def start(self) -> None:
        self.thread.start()

    def put(self, pending: Pending) -> None:
        self.jobs.put(pending)

    def _run(self) -> None:
        import zmq

        wake = self.context.socket(zmq.PUSH)  # a socket belongs to one thread: this one's
        wake.connect(self.address)
        try:
            while (pending := self.jobs.get()) is not None:
                pending.decode()
                wake.send(b"")
        finally:
            wake.close(linger=0)

    def stop(self) -> None:
        """End the thread (after the job it runs)."""
        self.jobs.put(None)
        if self.thread.is_alive():
            self.thread.join(2.0)


class NotDecoded(Exception):
    """A Replay of a graph still being decoded: the session waits for it, in order."""


class GraphStore:
    """The graphs one master defined on this worker, by id, bounded in number and bytes
    (MWRT_SESSION_GRAPHS, MWRT_SESSION_GRAPH_BYTES). Definitions are decoded off the socket
    thread (a 1 MiB one takes ~0.5 s of Python), which only checks their size."""

    def __init__(self, session):
        self.session = session
        self.graphs: dict[int, Graph | str | Pending] = {}
        self.sizes: dict[int, int] = {}  # graph id -> its definition's bytes
        self.nbytes = 0
        self.max_graphs = config.get("session_graphs")
        self.max_bytes = config.get("session_graph_bytes")

    def define(self, command, max_bytes: int) -> Pending:
        """Keep a graph, to be decoded by Pending.decode(); QuotaError past the bounds."""
        self.drop(command.graph)
        size = len(command.body) if isinstance(command.body, bytes) else 0
        if len(self.graphs) >= self.max_graphs or self.nbytes + size > self.max_bytes:
            raise QuotaError(
                f"graph {command.graph}: this master already keeps {len(self.graphs)} graphs "
                f"of {self.nbytes} bytes on node {self.session.node} (got {size} bytes more, "
                f"expected at most MWRT_SESSION_GRAPHS = {self.max_graphs} graphs and "
                f"MWRT_SESSION_GRAPH_BYTES = {self.max_bytes} bytes); drop graphs it no "
                "longer replays (del g)")
        pending = self.graphs[command.graph] = Pending(command, max_bytes)
        self.sizes[command.graph], self.nbytes = size, self.nbytes + size
        return pending

    def replay(self, command) -> tuple[dict, int]:
        """The stream groups of one replay and the graph's bytes; KeyError naming the graph
        if it cannot run, NotDecoded if it is not decoded yet."""
        graph = self.graphs.get(command.graph)
        if isinstance(graph, Pending):
            if not graph.ready.is_set():
                raise NotDecoded(graph)
            graph = self.graphs[command.graph] = graph.result
        if graph is None:
            raise KeyError(f"graph {command.graph}: not defined on node {self.session.node} "
                           "(dropped, refused, or its definition never arrived)")
        if isinstance(graph, str):
            raise KeyError(f"graph {command.graph}: its definition was refused: {graph}")
        if not graph.replayed:  # a shape asked of them is answered in order from now on
            graph.replayed = True
            self.session.tensors.remade(graph.writes)
        return graph.bind(tuple(command.bindings)), self.sizes.get(command.graph, 0)

    def drop(self, graph_id: int) -> None:
        if self.graphs.pop(graph_id, None) is not None:
            self.nbytes -= self.sizes.pop(graph_id, 0)

    def clear(self) -> None:
        self.graphs.clear()
        self.sizes.clear()
        self.nbytes = 0


def _outs(command) -> tuple:
    """The ids of the tensors `command` makes."""
    out = getattr(command, "out", None)
    return getattr(command, "outs", None) or (() if out is None else (out,))


def _names(command, ids) -> bool:
    """True if `command` mentions a tensor id in `ids`."""
    if any(getattr(command, field, None) in ids for field in _TENSOR_FIELDS):
        return True
    return not ids.isdisjoint(ref_ids((getattr(command, "args", ()),
                                       getattr(command, "kwargs", {}))))


def _rebind(command, mapping: dict):
    changes = {field: mapping[getattr(command, field)] for field in _TENSOR_FIELDS
               if getattr(command, field, None) in mapping}
    for field in ("args", "kwargs"):
        if hasattr(command, field):
            changes[field] = _swap(getattr(command, field), mapping)
    return replace(command, **changes)


def _swap(value, mapping: dict):
    if isinstance(value, wire.Ref):
        return wire.Ref(mapping[value.id]) if value.id in mapping else value
    if isinstance(value, tuple):
        return tuple(_swap(v, mapping) for v in value)
    if isinstance(value, dict):
        return {k: _swap(v, mapping) for k, v in value.items()}
    return value
