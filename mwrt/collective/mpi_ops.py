"""The mpi channel's native collectives: MPI's own, on one communicator per group.

An MPI library brings collectives tuned to its cluster (shared memory inside a node,
hierarchical and network-aware between nodes), so over the mpi channel every collective
runs as MPI's, in place on the caller's flat buffer. Two things stay mwrt's. The agreement
check comes first, as an MPI_Allgather of every rank's call descriptor: ranks that disagree
get a CollectiveMismatchError, where MPI would have undefined behaviour. And every wait
has a deadline: the nonblocking forms (MPI_Iallreduce, ...) are polled, so a rank that
never comes is a named timeout, not a hang. Reductions MPI cannot do on a dtype (float16,
bool) decline to the generic algorithms, alike on every rank, since the ranks agreed on
the dtype and op; AVG sums, then divides, as torch does.

The data phase itself is MPI's blocking collective: once the check has shown every rank in
the call, only a rank dying mid-call could keep it waiting (and MPI's launcher ends the
job then), while MPICH's nonblocking collectives ran up to 2x slower than its blocking ones
here.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from mpi4py import MPI

from ..channels.mpi import poll
from .native import NativeCollectives
from .reduce_ops import ReduceOp

_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD,
        ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX, ReduceOp.BAND: MPI.BAND,
        ReduceOp.BOR: MPI.BOR, ReduceOp.BXOR: MPI.BXOR}
_REDUCIBLE = frozenset("bBhHiIlLqQfdFD")  # dtype chars MPI reduces: ints, floats, complex


def _buf(arr):
    """An MPI buffer of `arr`'s elements (bytes where the dtype has no MPI reduction)."""
    if arr.dtype.char in _REDUCIBLE:
        return arr
    return [arr.view(np.uint8), MPI.BYTE]


class MpiCollectives(NativeCollectives):
    """Every collective of a group over the mpi channel, as MPI's own."""

    kinds = frozenset(["all_reduce", "broadcast", "reduce", "gather", "scatter", "all_gather",
                       "reduce_scatter", "all_to_all", "barrier"])
    checks_calls = True  # an Allgather of the descriptors, before any data moves
    in_order = True  # MPI orders collectives on a communicator by issue: one at a time

    def __init__(self, channel, group):
        super().__init__(channel, group)
        self._comm, self._lock = None, threading.Lock()

    @property
    def comm(self):
        """The group's communicator: the channel's for the whole world, else made (a
        collective call of the members) on the group's first collective."""
        with self._lock:
            if self._comm is None:
                world = self.channel.comm
                self._comm = world if self.group.ranks == list(range(world.Get_size())) else \
                    world.Create_group(world.Get_group().Incl(self.group.ranks))
            return self._comm

    def run(self, kind: str, call, *args) -> bool:
        if kind in ("all_reduce", "reduce", "reduce_scatter"):
            arr = args[1] if kind == "reduce_scatter" else args[0]
            if arr.dtype.char not in _REDUCIBLE:
                return False
        mine = np.frombuffer(call.take_check(), np.uint8)
        every = np.empty((self.group.size, mine.size), np.uint8)
        self._wait(self.comm.Iallgather(mine, every), kind, call, "the call check")
        call.check([row.tobytes() for row in every])
        getattr(self, "_" + kind)(*args)
        if (kind in ("all_reduce", "reduce") and args[1] is ReduceOp.AVG) or \
                (kind == "reduce_scatter" and args[2] is ReduceOp.AVG):
            np.divide(args[0], self.group.size, out=args[0])
        return True

    def _wait(self, request, kind: str, call, what: str) -> None:
        g = self.group
        poll(request.Test, time.monotonic() + g.timeout,
             f"mpi {kind} #{call.seq} on {g.name}, rank {g.rank} ({what})", g.timeout,
             lambda: self.channel.closed, "did every rank of the group make this call?")

    # -- MPI's collective for each kind, with the generic algorithm's arguments ----------

    def _all_reduce(self, arr, op):
        self.comm.Allreduce(MPI.IN_PLACE, arr, _OPS[op])

    def _broadcast(self, arr, root):
        self.comm.Bcast(_buf(arr), root)

    def _reduce(self, arr, op, root):
        send = MPI.IN_PLACE if self.group.rank == root else arr
        self.comm.Reduce(send, arr if self.group.rank == root else None, _OPS[op], root)

    def _gather(self, arr, dst, root):
        self.comm.Gather(_buf(arr), _buf(dst) if self.group.rank == root else None, root)

    def _scatter(self, arr, source, root):
        self.comm.Scatter(_buf(source) if self.group.rank == root else None, _buf(arr), root)

    def _all_gather(self, dst, arr):
        self.comm.Allgather(_buf(arr), _buf(dst))

    def _reduce_scatter(self, dst, source, op):
        self.comm.Reduce_scatter_block(source, dst, _OPS[op])

    def _all_to_all(self, dst, source):
        self.comm.Alltoall(_buf(source), _buf(dst))

    def _barrier(self):
        pass  # the check's Allgather already met every rank
