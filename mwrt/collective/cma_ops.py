"""The shm channel's native collectives: each rank reads its peers' buffers in place (CMA).

`CmaCollectives` is what the shm and auto channels declare as `native_collectives`. Every
collective takes the generic one's arguments (mwrt.collective.api), after the group's CMA
state and the call's sequence number, descriptor and check; the whole set declines where
single-copy reads are not allowed (then the generic algorithms run, the same on every
rank), and checks the call's agreement itself through the control blocks. Reductions
split the buffer into one chunk per rank: rank r reduces chunk r reading every peer's
chunk r, piece by piece, and writes each reduced piece straight into the peers' buffers
while it is still in cache (only rank r ever touches chunk r of anyone's buffer, and it
reads a piece before it writes it); each value is computed once and copied, so every
rank ends with the same bits, and the closing stage says every write has landed.

An all_reduce up to the staging size (MWRT_SHM_STAGE_BYTES) takes the same steps
through the staging areas instead: shared segments every rank mapped at setup, so
peers' data is read and written with plain in-cache copies, which beat the
syscall's page pinning by 2x at 1 MiB (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import numpy as np

from . import cma_collectives
from .cma_collectives import BUF_A, BUF_B
from .native import NativeCollectives
from .reduce_ops import ReduceOp, combine

_OPS = {}  # kind -> fn(c, group, seq, mine, check, *args)


def _native(publish, kind: str | None = None):
    """Make body(c, group, *args) a collective that publishes `publish(*args)` first."""
    def wrap(body):
        kind_ = kind or body.__name__

        def native(c, group, seq, mine, check, *args):
            a, b = publish(*args)
            base = c.begin(kind_, seq, mine, check, a=a, b=b)
            body(c, group, *args)
            c.finish(base, kind_)  # nobody touches our buffers once every rank is here

        native.__name__ = native.__qualname__ = kind_
        native.__doc__ = body.__doc__
        if kind is None:
            _OPS[kind_] = native
        return native
    return wrap


def _reduce_chunk(c, group, arr, op, targets) -> None:
    """Reduce this rank's chunk of `arr` from every peer, writing it into `targets`' buffers."""
    lo, hi = arr.size * group.rank // group.size, arr.size * (group.rank + 1) // group.size
    c.reduce_from(c.others, BUF_A, arr[lo:hi], lo, op, "reduce",
                  avg=group.size if op is ReduceOp.AVG else 0, write_to=targets)


def all_reduce(c, group, seq, mine, check, arr, op):
    """Up to the staging size through the shared staging areas, else by single-copy reads."""
    if arr.nbytes > c.stage_bytes:
        return _all_reduce_in_place(c, group, seq, mine, check, arr, op)
    n, r, avg = group.size, group.rank, group.size if op is ReduceOp.AVG else 0
    chunks = [slice(arr.size * p // n, arr.size * (p + 1) // n) for p in range(n)]
    staged = c.staged(r, arr.dtype, arr.size)
    for p in c.others:
        staged[chunks[p]] = arr[chunks[p]]  # what rank p reduces, where it can read it
    base = c.begin("all_reduce", seq, mine, check, a=arr)
    own, theirs = arr[chunks[r]], [c.staged(p, arr.dtype, arr.size)[chunks[r]] for p in c.others]
    for part in theirs:  # the peers' chunk r, read where it lies, in rank order (as in place)
        combine(op, own, part, mine_is_lower=False)
    if avg:
        np.divide(own, avg, out=own)
    for part in theirs:
        part[:] = own
    c.finish(base, "all_reduce")  # every reduced chunk is in our staging area now
    for p in c.others:
        arr[chunks[p]] = staged[chunks[p]]


_OPS["all_reduce"] = all_reduce


@_native(lambda arr, op: (arr, None), "all_reduce")
def _all_reduce_in_place(c, group, arr, op):
    """Every rank reduces its chunk and writes it into every peer's buffer."""
    _reduce_chunk(c, group, arr, op, c.others)


@_native(lambda arr, op, root: (arr, None))
def reduce(c, group, arr, op, root):
    """Every rank reduces its chunk and writes it into the root's buffer."""
    _reduce_chunk(c, group, arr, op, [root] if root != group.rank else [])


@_native(lambda arr, root: (arr, None))
def broadcast(c, group, arr, root):
    """Every rank reads the root's buffer."""
    if group.rank != root:
        c.read_part(root, BUF_A, arr, 0, "broadcast")


@_native(lambda arr, out, root: (arr, None))
def gather(c, group, arr, out, root):
    """The root reads every peer's buffer into its row."""
    if group.rank == root:
        rows = out.reshape(group.size, arr.size)
        rows[root] = arr
        for p in c.others:
            c.read_part(p, BUF_A, rows[p], 0, "gather")


@_native(lambda arr, src, root: (arr, src))
def scatter(c, group, arr, src, root):
    """Every rank reads its row of the root's source."""
    if group.rank == root:
        arr[:] = src.reshape(group.size, arr.size)[root]
    else:
        c.read_part(root, BUF_B, arr, group.rank * arr.nbytes, "scatter")


@_native(lambda out, arr: (arr, None))
def all_gather(c, group, out, arr):
    """Every rank reads every peer's buffer into its row."""
    rows = out.reshape(group.size, arr.size)
    rows[group.rank] = arr
    for p in c.others:
        c.read_part(p, BUF_A, rows[p], 0, "all_gather")


@_native(lambda out, src, op: (None, src))
def reduce_scatter(c, group, out, src, op):
    """Every rank reduces its row of the peers' sources into `out`."""
    start = group.rank * out.size
    out[:] = src[start:start + out.size]
    c.reduce_from(c.others, BUF_B, out, start, op, "reduce_scatter",
                  avg=group.size if op is ReduceOp.AVG else 0)


@_native(lambda out, src: (None, src))
def all_to_all(c, group, out, src):
    """Every rank reads its row of every peer's source."""
    n = group.size
    rows, count = out.reshape(n, -1), out.size // n
    rows[group.rank] = src.reshape(n, -1)[group.rank]
    for p in c.others:
        c.read_part(p, BUF_B, rows[p], group.rank * count * out.itemsize, "all_to_all")


@_native(lambda: (None, None))
def barrier(c, group):
    """Publishing and the closing stage are the whole barrier."""


class CmaCollectives(NativeCollectives):
    """Every collective of a group whose ranks share this host, by cross-memory access."""

    kinds = frozenset(_OPS)
    checks_calls = True  # through the control blocks, before any data moves
    in_order = True  # one control block per rank and group: one call at a time, by seq

    def __init__(self, channel, group):
        super().__init__(channel, group)
        self._state: cma_collectives.CmaGroup | None = None
        self._made = False

    @property
    def state(self) -> cma_collectives.CmaGroup | None:
        """The group's CMA state, set up with every rank on first use; None where refused."""
        if not self._made:
            key = ("cma", self.group.group_id, tuple(self.group.ranks))
            self._state, self._made = self.channel.attachment(key, self._setup), True
        return self._state

    def _setup(self) -> cma_collectives.CmaGroup | None:
        if not all(map(self.channel.shares_host, self.group.ranks)):
            return None  # single-copy reads need every rank on this host
        return cma_collectives.setup(self.channel, self.group)

    def run(self, kind: str, call, *args) -> bool:
        c = self.state
        if c is None:
            return False
        _OPS[kind](c, self.group, call.seq, call.take_check(), call.check, *args)
        return True


__all__ = ["CmaCollectives"]
