"""The shm channel's native collectives: each rank reads its peers' buffers in place (CMA).

Every collective has the signature of the generic one in mwrt.collectives that it
replaces (`native_<kind>(group, ...)`), returns NotImplemented where single-copy reads
are not allowed (then the generic algorithm runs, the same on every rank), and checks
the call's agreement itself through the control blocks (`checks_calls`). Reductions
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

from ..collective.reduce_ops import ReduceOp, combine
from . import cma
from .cma import _A, _B


def _native(publish, kind: str | None = None):
    """Make body(c, group, *args) a native collective that publishes `publish(*args)`."""
    def wrap(body):
        kind_ = kind or body.__name__

        def native(channel, group, *args):
            c = channel._cma_for(group)
            if c is None:
                return NotImplemented
            a, b = publish(*args)
            base = c.begin(kind_, a=a, b=b)
            body(c, group, *args)
            c.finish(base, kind_)  # nobody touches our buffers once every rank is here

        native.checks_calls = True  # ProcessGroup.run_native leaves the check to us
        native.__name__ = native.__qualname__ = f"native_{kind_}"
        native.__doc__ = body.__doc__
        return native
    return wrap


def _reduce_chunk(c, group, arr, op, targets) -> None:
    """Reduce this rank's chunk of `arr` from every peer, writing it into `targets`' buffers."""
    lo, hi = arr.size * group.rank // group.size, arr.size * (group.rank + 1) // group.size
    c.reduce_from(c.others, _A, arr[lo:hi], lo, op, "reduce",
                  avg=group.size if op is ReduceOp.AVG else 0, write_to=targets)


def all_reduce(channel, group, arr, op):
    """Up to the staging size through the shared staging areas, else by single-copy reads."""
    c = channel._cma_for(group)
    if c is None:
        return NotImplemented
    if arr.nbytes > c.stage_bytes:
        return _all_reduce_in_place(channel, group, arr, op)
    n, r, avg = group.size, group.rank, group.size if op is ReduceOp.AVG else 0
    chunks = [slice(arr.size * p // n, arr.size * (p + 1) // n) for p in range(n)]
    mine = c.staged(r, arr.dtype, arr.size)
    for p in c.others:
        mine[chunks[p]] = arr[chunks[p]]  # what rank p reduces, where it can read it
    base = c.begin("all_reduce", a=arr)
    own, theirs = arr[chunks[r]], [c.staged(p, arr.dtype, arr.size)[chunks[r]] for p in c.others]
    for part in theirs:  # the peers' chunk r, read where it lies, in rank order (as in place)
        combine(op, own, part, mine_is_lower=False)
    if avg:
        np.divide(own, avg, out=own)
    for part in theirs:
        part[:] = own
    c.finish(base, "all_reduce")  # every reduced chunk is in our staging area now
    for p in c.others:
        arr[chunks[p]] = mine[chunks[p]]


all_reduce.checks_calls = True


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
        c.read_part(root, _A, arr, 0, "broadcast")


@_native(lambda arr, out, root: (arr, None))
def gather(c, group, arr, out, root):
    """The root reads every peer's buffer into its row."""
    if group.rank == root:
        rows = out.reshape(group.size, arr.size)
        rows[root] = arr
        for p in c.others:
            c.read_part(p, _A, rows[p], 0, "gather")


@_native(lambda arr, src, root: (arr, src))
def scatter(c, group, arr, src, root):
    """Every rank reads its row of the root's source."""
    if group.rank == root:
        arr[:] = src.reshape(group.size, arr.size)[root]
    else:
        c.read_part(root, _B, arr, group.rank * arr.nbytes, "scatter")


@_native(lambda out, arr: (arr, None))
def all_gather(c, group, out, arr):
    """Every rank reads every peer's buffer into its row."""
    rows = out.reshape(group.size, arr.size)
    rows[group.rank] = arr
    for p in c.others:
        c.read_part(p, _A, rows[p], 0, "all_gather")


@_native(lambda out, src, op: (None, src))
def reduce_scatter(c, group, out, src, op):
    """Every rank reduces its row of the peers' sources into `out`."""
    start = group.rank * out.size
    out[:] = src[start:start + out.size]
    c.reduce_from(c.others, _B, out, start, op, "reduce_scatter",
                  avg=group.size if op is ReduceOp.AVG else 0)


@_native(lambda out, src: (None, src))
def all_to_all(c, group, out, src):
    """Every rank reads its row of every peer's source."""
    n = group.size
    rows, count = out.reshape(n, -1), out.size // n
    rows[group.rank] = src.reshape(n, -1)[group.rank]
    for p in c.others:
        c.read_part(p, _B, rows[p], group.rank * count * out.itemsize, "all_to_all")


@_native(lambda: (None, None))
def barrier(c, group):
    """Publishing and the closing stage are the whole barrier."""


class CmaCollectives:
    """Mixin for a channel whose ranks share a host: native_<kind> by cross-memory access."""

    _cma_groups: dict  # (group id, ranks) -> CmaGroup, or None where CMA is refused

    def _cma_for(self, group):
        key = (group.group_id, tuple(group.ranks))
        if key not in self._cma_groups:
            self._cma_groups[key] = cma.setup(self, group)
        return self._cma_groups[key]

    def leave(self) -> None:
        for cma_group in self._cma_groups.values():
            if cma_group is not None:
                cma_group.leave()

    def _close_cma(self) -> None:
        self.leave()
        for cma_group in self._cma_groups.values():
            if cma_group is not None:
                cma_group.close()

    native_all_reduce, native_reduce, native_broadcast = all_reduce, reduce, broadcast
    native_gather, native_scatter, native_all_gather = gather, scatter, all_gather
    native_reduce_scatter, native_all_to_all = reduce_scatter, all_to_all
    native_barrier = barrier
