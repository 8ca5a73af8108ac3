"""The nccl channel's native collectives: NCCL's own, on one communicator per group.

Over the nccl channel every collective is NCCL's, on the caller's device buffers and
enqueued on the current stream: all_reduce, broadcast, reduce, all_gather and
reduce_scatter are NCCL's collectives; gather, scatter and all_to_all are NCCL sends and
receives fused in one group (ncclGroupStart/End), as torch does; barrier is the check
below. The whole world uses the channel's communicator; a subgroup makes its own on its
first collective (NCCL needs one per set of ranks), bootstrapped through the store under
the group's key, as the channel's was.

Two things stay mwrt's. The agreement check comes first, as an NCCL all-gather of every
rank's call descriptor, whose result the host waits for (polling an event, so a rank that
never comes is a named timeout; the communicator is then aborted, as NCCL asks): ranks
that disagree get CollectiveMismatchError before any data moves. And what NCCL cannot do
is a named error raised alike on every rank after the check: reductions of dtypes NCCL
lacks (bool, int16, complex...) and the bitwise ReduceOps. AVG sums, then divides on the
device. Host arrays are refused before the check, with the fix; a rank that refuses is
then missing from the others' check, which times out naming the call.
"""

from __future__ import annotations

import threading

import numpy as np

from ..channels.nccl import (
    NcclUnsupportedError,
    communicator,
    converted,
    device_pointer,
    host_refused,
    wait_event,
)
from ..errors import ChannelError
from .native import NativeCollectives
from .reduce_ops import ReduceOp

_OPS = {ReduceOp.SUM: "NCCL_SUM", ReduceOp.AVG: "NCCL_SUM", ReduceOp.PRODUCT: "NCCL_PROD",
        ReduceOp.MIN: "NCCL_MIN", ReduceOp.MAX: "NCCL_MAX"}
_DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
           "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
           "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}
_REDUCING = ("all_reduce", "reduce", "reduce_scatter")


class NcclCollectives(NativeCollectives):
    """Every collective of a group over the nccl channel, as NCCL's own."""

    kinds = frozenset(["all_reduce", "broadcast", "reduce", "gather", "scatter", "all_gather",
                       "reduce_scatter", "all_to_all", "barrier"])
    checks_calls = True  # an NCCL all-gather of the descriptors, before any data moves
    in_order = True  # NCCL orders a communicator's calls by issue: one at a time

    def __init__(self, channel, group):
        super().__init__(channel, group)
        self.nccl, self.xp = channel.nccl, channel.xp
        self._comm, self._lock = None, threading.Lock()

    @property
    def comm(self):
        """The group's communicator: the channel's for the default group, else made on the
        group's first collective (every member is in that call), as torch makes one per
        group: two groups' calls then never queue behind each other."""
        with self._lock:
            if self._comm is None:
                g, ch = self.group, self.channel
                if g.group_id == 0 and g.ranks == list(range(ch.world_size)):
                    self._comm = ch.comm
                else:
                    store, prefix = (g.store, g.prefix) if g.store is not None else \
                        (ch.store, ch.prefix)
                    key = f"{prefix}/nccl/group{g.group_id}/{'-'.join(map(str, g.ranks))}"
                    self._comm = communicator(self.nccl, store, key, g.rank, g.size, g.timeout,
                                              f"nccl {g.name}")
            return self._comm

    def run(self, kind: str, call, *args) -> bool:
        g, ch = self.group, self.channel
        for arr in args:
            if arr is not None and not isinstance(arr, (int, ReduceOp)) and \
                    not hasattr(arr, "__cuda_array_interface__"):
                raise host_refused(arr, f"{kind} on {g.name}")
        with self.xp.cuda.Device(ch.device), ch.lock:
            self._check(kind, call)
            if kind in _REDUCING:
                arr, op = (args[0], args[2]) if kind == "reduce_scatter" else args[:2]
                dtype, nop = self._dtype(kind, arr), self._op(kind, op)
                getattr(self, "_" + kind)(*args, dtype=dtype, nop=nop)
                if op is ReduceOp.AVG and (kind != "reduce" or g.rank == args[2]):
                    self.xp.divide(arr, g.size, out=arr)
            else:
                self._guarded(kind, getattr(self, "_" + kind), *args)
        return True

    def _check(self, kind: str, call) -> None:
        """All-gather every rank's descriptor, wait for it (with the timeout), compare."""
        g, xp = self.group, self.xp
        mine = np.frombuffer(call.take_check(), np.uint8)
        src = xp.asarray(mine)
        every = xp.empty(g.size * mine.size, xp.uint8)
        what = f"nccl {kind} #{call.seq} on {g.name}, rank {g.rank} (the call check)"
        self._guarded(kind, lambda: self.comm.allGather(
            self._ptr(src, kind), self._ptr(every, kind), mine.size, self.nccl.NCCL_UINT8,
            self.channel.stream_ptr()))
        event = xp.cuda.Event(disable_timing=True)
        event.record(xp.cuda.get_current_stream())
        try:
            self._guarded(kind, wait_event, event, g.timeout, what,
                          "did every rank of the group make this call?", self.comm)
        except ChannelError:
            self.comm.abort()  # NCCL's way out of a call that will never complete
            raise
        rows = xp.asnumpy(every).reshape(g.size, mine.size)
        call.check([row.tobytes() for row in rows])

    def _guarded(self, kind: str, fn, *args) -> None:
        """Run NCCL calls; an NcclError becomes mwrt's channel error naming the call."""
        try:
            fn(*args)
        except self.nccl.NcclError as exc:
            raise converted(exc, f"nccl {kind} on {self.group.name}, rank "
                                 f"{self.group.rank}") from None

    def _ptr(self, arr, kind: str) -> int:
        return device_pointer(arr, self.channel.device, f"nccl {kind}")[0]

    def _dtype(self, kind: str, arr) -> int:
        name = _DTYPES.get(np.dtype(arr.dtype).name)
        if name is None:
            raise NcclUnsupportedError(f"nccl {kind}: NCCL cannot reduce {arr.dtype} (it reduces "
                            f"{', '.join(_DTYPES)}); cast it (arr.astype(cupy.float32)), or "
                            "use the tcp channel")
        return getattr(self.nccl, name)

    def _op(self, kind: str, op: ReduceOp) -> int:
        if op not in _OPS:
            raise NcclUnsupportedError(f"nccl {kind}: NCCL has no ReduceOp.{op.name} (it has "
                             f"{', '.join(o.name for o in _OPS)}); use the tcp channel for "
                             "bitwise reductions")
        return getattr(self.nccl, _OPS[op])

    # -- NCCL's call for each kind, with the generic algorithm's arguments -----------------

    def _bytes(self, arr, kind: str) -> tuple[int, int]:
        ptr, nbytes = device_pointer(arr, self.channel.device, f"nccl {kind}")
        return ptr, nbytes

    def _all_reduce(self, arr, op, *, dtype, nop):
        p = self._ptr(arr, "all_reduce")
        self._guarded("all_reduce", self.comm.allReduce, p, p, arr.size, dtype, nop,
                      self.channel.stream_ptr())

    def _reduce(self, arr, op, root, *, dtype, nop):
        p = self._ptr(arr, "reduce")
        self._guarded("reduce", self.comm.reduce, p, p, arr.size, dtype, nop, root,
                      self.channel.stream_ptr())

    def _reduce_scatter(self, dst, source, op, *, dtype, nop):
        self._guarded("reduce_scatter", self.comm.reduceScatter,
                      self._ptr(source, "reduce_scatter"), self._ptr(dst, "reduce_scatter"),
                      dst.size, dtype, nop, self.channel.stream_ptr())

    def _broadcast(self, arr, root):
        p, n = self._bytes(arr, "broadcast")
        self.comm.broadcast(p, p, n, self.nccl.NCCL_UINT8, root, self.channel.stream_ptr())

    def _all_gather(self, dst, arr):
        p, n = self._bytes(arr, "all_gather")
        self.comm.allGather(p, self._ptr(dst, "all_gather"), n, self.nccl.NCCL_UINT8,
                            self.channel.stream_ptr())

    def _gather(self, arr, dst, root):
        rows = None if dst is None else dst.reshape(self.group.size, -1)
        self._exchange([(arr, root)] if self.group.rank != root else [],
                       [] if rows is None else [(rows[p], p) for p in range(self.group.size)],
                       arr if rows is not None else None, rows)

    def _scatter(self, arr, source, root):
        rows = None if source is None else source.reshape(self.group.size, -1)
        self._exchange([] if rows is None else [(rows[p], p) for p in range(self.group.size)],
                       [(arr, root)] if self.group.rank != root else [],
                       None if rows is None else rows[root], None, arr)

    def _all_to_all(self, dst, source):
        n = self.group.size
        out, src = dst.reshape(n, -1), source.reshape(n, -1)
        self._exchange([(src[p], p) for p in range(n)], [(out[p], p) for p in range(n)],
                       src[self.group.rank], out)

    def _barrier(self):
        pass  # the check's all-gather already met every rank

    def _exchange(self, sends, recvs, mine, rows, into=None) -> None:
        """Sends and receives among group ranks fused in one NCCL group; this rank's own
        row (`mine`) is copied on the device instead."""
        me, stream = self.group.rank, self.channel.stream_ptr()
        if mine is not None:
            (into if into is not None else rows[me])[...] = mine
        self.nccl.groupStart()
        try:
            for buf, peer in sends:
                if peer != me and buf.nbytes:
                    p, n = self._bytes(buf, "send")
                    self.comm.send(p, n, self.nccl.NCCL_UINT8, peer, stream)
            for buf, peer in recvs:
                if peer != me and buf.nbytes:
                    p, n = self._bytes(buf, "recv")
                    self.comm.recv(p, n, self.nccl.NCCL_UINT8, peer, stream)
        finally:
            self.nccl.groupEnd()
