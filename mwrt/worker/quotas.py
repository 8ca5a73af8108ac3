"""Per-session quotas on a worker: tensors, bytes, streams, queued commands; and giving back.

One master must not be able to starve the others of memory, threads or sockets, so each
session's share is bounded (settings in mwrt.config, defaults derived from the host) and
exceeding a bound is a QuotaError for that master alone. Op results are sized from the
op's meta rule before they run, so an oversized result is refused without being made.
The byte quotas are the host's: a GPU tensor is bounded by its device's memory, whose
exhaustion is a named out-of-memory error (the host's RAM says nothing of a GPU's).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import threading

import numpy as np

from .. import arrays, config
from ..errors import QuotaError, WireError
from ..ops import UNKNOWN, Spec, numpy_allowlist, numpy_functions
from ..protocol import wire


class TensorTable(dict):
    """A session's tensors by id, counting their bytes and refusing what exceeds its quota."""

    def __init__(self, node: int):
        super().__init__()
        self.node = node
        self.nbytes = 0
        self.max_tensors = config.get("session_tensors")
        self.max_bytes = config.get("session_bytes")
        self.max_tensor = config.get("max_tensor_bytes")
        self._lock = threading.Lock()  # stream threads store concurrently
        # Shape questions (Meta) asked before their tensor was made: tokens by tensor id;
        # the tokens answered before their stream reached them, which it then skips; and
        # the tensors a graph's replays make again under one id, whose shapes it answers.
        self.watched: dict[int, set[int]] = {}
        self._answered: set[int] = set()
        self._remade: set[int] = set()

    def __setitem__(self, tid, value) -> None:
        size = value.nbytes if type(value) is np.ndarray else _host_bytes(value)
        if size > self.max_tensor:  # a user function's result: sized only once made
            raise MemoryError(f"tensor {tid}: {size} bytes exceed the limit of "
                              f"{self.max_tensor} bytes (MWRT_MAX_TENSOR_BYTES)")
        with self._lock:
            old = dict.get(self, tid)
            if old is None:
                # Room is kept for the markers of failed ops, so the failure is still reported.
                if len(self) >= self.max_tensors and (
                        hasattr(value, "nbytes") or len(self) >= 2 * self.max_tensors):
                    raise QuotaError(
                        f"tensor {tid}: this master already holds {len(self)} tensors on node "
                        f"{self.node} (MWRT_SESSION_TENSORS = {self.max_tensors}); free "
                        "tensors it no longer needs")
            else:
                size -= _host_bytes(old)
            if size > 0 and self.nbytes + size > self.max_bytes:
                raise QuotaError(self._over(size))
            self.nbytes += size
            dict.__setitem__(self, tid, value)

    def watch(self, tid: int, token: int):
        """Tensor `tid` if made, else None, and `token` waits for it: whoever stores it next
        takes it from made(). None, too, for a tensor a replay makes again: which one the
        question asks of is known only in stream order."""
        with self._lock:
            if tid in self._remade:
                return None
            value = dict.get(self, tid)
            if value is None:
                self.watched.setdefault(tid, set()).add(token)
            return value

    def remade(self, ids) -> None:
        """Tensors `ids` will be made again (a graph's replays): shapes asked in order."""
        with self._lock:
            self._remade |= ids
            for tid in ids:
                self.watched.pop(tid, None)

    def answering(self, token: int) -> None:
        """Note that `token` is answered before its stream reaches it."""
        with self._lock:
            self._answered.add(token)

    def made(self, tid: int) -> set[int]:
        """The tokens that wait for tensor `tid`, just stored: the caller answers them."""
        with self._lock:
            tokens = self.watched.pop(tid, set())
            self._answered |= tokens
            return tokens

    def answered(self, tid: int, token: int) -> bool:
        """Whether `token` was answered before its stream reached it; else it waits no more
        and its stream answers it."""
        with self._lock:
            if token in self._answered:
                self._answered.discard(token)
                return True
            waiting = self.watched.get(tid, set())
            waiting.discard(token)
            if not waiting:
                self.watched.pop(tid, None)
            return False

    def pop(self, tid, *default):
        with self._lock:
            value = dict.pop(self, tid, *default)
            self.nbytes -= value.nbytes if type(value) is np.ndarray else _host_bytes(value)
            return value

    def __delitem__(self, tid) -> None:
        self.pop(tid)

    def clear(self) -> None:
        with self._lock:
            super().clear()
            self.watched.clear()
            self._answered.clear()
            self._remade.clear()
            self.nbytes = 0

    def check_room(self, nbytes: int) -> None:
        """Refuse, before allocating, a new tensor of `nbytes` that would exceed the quota."""
        if self.nbytes + nbytes > self.max_bytes:
            raise QuotaError(self._over(nbytes))

    def _over(self, nbytes: int) -> str:
        return (f"session: a new tensor of {nbytes} bytes would take this master's tensors on "
                f"node {self.node} to {self.nbytes + nbytes} bytes (got {self.nbytes} held, "
                f"expected at most MWRT_SESSION_BYTES = {self.max_bytes} in all); free tensors "
                "or raise the worker's MWRT_SESSION_BYTES")


def _host_bytes(value) -> int:
    """The bytes of host memory `value` holds (0 for a GPU array or a failure's marker)."""
    if type(value) is np.ndarray:  # (exactly: a stand-in's GPU arrays may subclass it)
        return value.nbytes
    if arrays.in_host_memory(value) or getattr(value, "is_cpu", False):  # torch's host tensors
        return value.nbytes
    return 0


def check_tensor(shape, dtype, what: str, table: TensorTable | None = None,
                 device: int = arrays.HOST) -> None:
    """Refuse a host tensor over MWRT_MAX_TENSOR_BYTES, or over the session's quota, and an
    array of Python objects anywhere, unmade."""
    refuse_objects(dtype, what)
    if device != arrays.HOST:
        return
    check_bytes(math.prod(shape) * dtype.itemsize, what, table, f"{dtype}{list(shape)}")


def check_bytes(nbytes: int, what: str, table: TensorTable | None = None,
                kind: str = "") -> None:
    """Refuse `nbytes` of new host memory over MWRT_MAX_TENSOR_BYTES or the session's room."""
    limit = config.get("max_tensor_bytes") if table is None else table.max_tensor
    if nbytes > limit:
        raise MemoryError(f"{what}: tensor of {nbytes} bytes ({kind or 'at most'}) exceeds the "
                          f"limit of {limit} bytes (MWRT_MAX_TENSOR_BYTES)")
    if table is not None:
        table.check_room(nbytes)


def refuse_objects(dtype, what: str) -> None:
    """Refuse an array of Python objects: its work and memory have no bound a quota could set
    (a product of Python ints gains digits), and the wire cannot carry it."""
    if dtype.hasobject:
        raise TypeError(f"{what}: object dtype is refused on a worker (got {dtype}, expected a "
                        "numeric or bool dtype); compute with Python objects on the master")


_PLAIN = (int, float, bool, str, type(None))


def specs(table, value):
    """A command's arguments as its meta rule takes them: tensor Refs become Specs."""
    kind = type(value)
    if kind is wire.Ref:
        found = table[value.id]
        return Spec(found.shape, found.dtype)
    if kind in _PLAIN:
        return value
    if kind is tuple:
        return tuple([specs(table, v) for v in value])
    if kind is dict:
        return {k: specs(table, v) for k, v in value.items()} if value else value
    return value


def check_result(name: str, result, args: tuple, kwargs: dict, table: TensorTable,
                 most: int | None = None) -> None:
    """Refuse an op's results, sized by its meta rule (`result`, on the command's Specs
    `args` and `kwargs`), before the op runs; `most`: largest_result(result), if known."""
    room = min(table.max_tensor, table.max_bytes - table.nbytes)
    if most is not None and most <= room:
        return
    for spec in result if type(result) is tuple else (result,):
        if type(spec) is Spec:
            refuse_objects(spec.dtype, name)
            if math.prod(spec.shape) * spec.dtype.itemsize > room:
                check_tensor(spec.shape, spec.dtype, name, table)
        elif spec is UNKNOWN:  # a mask's selection: at most what it selects from
            check_bytes(_spec_bytes((args, kwargs)), name, table)


def largest_result(result) -> int | None:
    """The bytes of an op's largest result by its meta rule, where every result has a Spec
    of numbers (check_result's test then reduces to this against the room left); else None."""
    most = 0
    for spec in result if type(result) is tuple else (result,):
        if type(spec) is not Spec or spec.dtype.hasobject:
            return None
        most = max(most, math.prod(spec.shape) * spec.dtype.itemsize)
    return most


def numpy_bytes(args: tuple, kwargs: dict) -> int:
    """At most how many bytes the `numpy` op's results take: np.<path>'s shape rule where it
    has one (without the rule's dtype probe, which would run NumPy on these arguments),
    else its bound in numpy_allowlist.ALLOWED. Arguments that would make Python objects are
    refused."""
    path, rest = args[0], args[2:]
    numpy_allowlist.refuse_objects(f"{path!s:.60}", rest, kwargs)
    shape_fn = numpy_functions.SHAPES.get(path) if isinstance(path, str) else None
    shapes = shape_fn(*rest, **kwargs) if shape_fn is not None else UNKNOWN
    if shapes is UNKNOWN:
        return numpy_allowlist.result_bytes(path, rest, kwargs)
    shapes = shapes if isinstance(shapes, list) else [shapes]
    return sum(math.prod(s) for s in shapes) * numpy_allowlist.width(rest, kwargs)


def check_inplace(table: TensorTable, args: tuple, kwargs: dict, host: bool) -> None:
    """Refuse the `numpy_` op's arguments (target, path, *rest) that make Python objects, or
    (on the host) more memory beside the target than a tensor may take."""
    args, kwargs = specs(table, args), specs(table, kwargs)
    target, path, rest = args[0], f"{args[1]!s:.60}", args[2:]
    numpy_allowlist.refuse_objects(path, rest, kwargs)
    if host:
        check_bytes(numpy_allowlist.inplace_bytes(target, rest, kwargs), f"np.{path}", table,
                    "its arguments' arrays beside its target")


def _spec_bytes(value) -> int:
    if type(value) is Spec:
        return math.prod(value.shape) * value.dtype.itemsize
    if isinstance(value, (tuple, list)):
        return sum(map(_spec_bytes, value))
    if isinstance(value, dict):
        return sum(map(_spec_bytes, value.values()))
    return 0


class Inflight:
    """Bytes of commands a session has queued on its streams and not yet run."""

    def __init__(self, node: int):
        self.node = node
        self.nbytes = 0
        self.limit = config.get("session_inflight_bytes")
        self._lock = threading.Lock()

    def admit(self, nbytes: int) -> None:
        """Count a received batch of `nbytes`; QuotaError if the session is too far behind."""
        with self._lock:
            if self.nbytes + nbytes > self.limit:
                raise QuotaError(
                    f"session: node {self.node} already queues {self.nbytes} bytes of this "
                    f"master's commands (got a batch of {nbytes} more, expected at most "
                    f"MWRT_SESSION_INFLIGHT_BYTES = {self.limit}); the batch did not run. "
                    "Keep the master's MWRT_MAX_BACKLOG_BYTES below it")
            self.nbytes += nbytes

    def track(self, holder: Frames, nbytes: int) -> None:
        """Give `nbytes` back once every stream has dropped `holder` (the batch's frames)."""
        holder.inflight, holder.nbytes = self, nbytes

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.nbytes -= nbytes


def admit(session, commands, data, body_bytes: int) -> list:
    """Count a batch against its session's queue quota; refuse frames no Put reads."""
    if data:
        used = {c.frame for c in commands if isinstance(c, wire.Put)}
        unread = len(set(range(len(data))) - used)
        if unread:
            raise WireError(f"wire: a batch carries {len(data)} data frames, {unread} of which "
                            "no Put reads (expected one Put per frame); it did not run")
    nbytes = body_bytes + sum(map(len, data))
    session.inflight.admit(nbytes)
    # The streams share one list: when the last of them drops it, the bytes are freed.
    held = Frames(data)
    session.inflight.track(held, nbytes)
    return held


class Frames(list):
    """A batch's data frames, as one object the streams share: when the last of them drops
    it, its bytes go back to the session's Inflight (a __del__, where a weakref.finalize
    cost ~20 us of the socket thread's time per batch)."""

    __slots__ = ("inflight", "nbytes")
    inflight: Inflight | None
    nbytes: int

    def __del__(self) -> None:
        inflight = getattr(self, "inflight", None)
        if inflight is not None:
            inflight._release(self.nbytes)


class StreamPool:
    """The daemon's streams across sessions: each holds a thread and a ZeroMQ socket."""

    def __init__(self):
        self.capacity = config.stream_capacity()
        self.per_session = min(config.get("session_streams"), self.capacity)
        self.used = 0
        self._lock = threading.Lock()

    def take(self, session, stream_id: int) -> None:
        """Reserve one stream for `session`, or QuotaError naming the bound it hit."""
        with self._lock:
            if len(session.streams) >= self.per_session:
                raise QuotaError(
                    f"stream {stream_id}: this master already has {len(session.streams)} "
                    f"streams on node {session.node} (MWRT_SESSION_STREAMS = "
                    f"{self.per_session}); reuse streams instead of making new ones")
            if self.used >= self.capacity:
                raise QuotaError(
                    f"stream {stream_id}: node {session.node} already runs {self.used} streams "
                    f"for all its masters (its capacity); reuse streams, or retry later")
            self.used += 1

    def give(self, count: int) -> None:
        with self._lock:
            self.used -= count


def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def give_back_memory() -> None:
    """Free what a closed session left: break reference cycles, and hand the C heap's free
    pages to the OS (glibc keeps freed arrays below its mmap threshold in the heap)."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
