"""The shm channel's native collectives: each rank reads its peers' buffers in place (CMA).

Every function has the signature of the generic one in mwrt.collectives that it
replaces (`native_<kind>(group, ...)`), returns NotImplemented where single-copy reads
are not allowed (then the generic algorithm runs, the same on every rank), and checks
the call's agreement itself through the control blocks (`checks_calls`). Reductions
split the buffer into one chunk per rank: rank r reduces chunk r reading every peer's
chunk r, piece by piece, and writes each reduced piece straight into the peers' buffers
while it is still in cache (only rank r ever touches chunk r of anyone's buffer, and it
reads a piece before it writes it); each value is computed once and copied, so every
rank ends with the same bits, and the closing stage says every write has landed.
"""

from __future__ import annotations

import numpy as np

from ..reduce_ops import ReduceOp
from . import cma
from .cma import _A, _B


def _checks_calls(fn):
    fn.checks_calls = True  # ProcessGroup.run_native leaves the agreement check to us
    return fn


class CmaCollectives:
    """Mixin for a channel whose ranks share a host: native_<kind> by cross-memory reads."""

    _cma_groups: dict  # (group id, ranks) -> CmaGroup, or None where CMA is refused

    def _cma_for(self, group):
        key = (group.group_id, tuple(group.ranks))
        if key not in self._cma_groups:
            self._cma_groups[key] = cma.setup(self, group)
        return self._cma_groups[key]

    @staticmethod
    def _reduce_chunk(c, arr, op, to_all: bool, root: int, what: str) -> None:
        """Reduce this rank's chunk of `arr` from every peer and write it into theirs (or root's)."""
        g = c.group
        lo, hi = arr.size * g.rank // g.size, arr.size * (g.rank + 1) // g.size
        targets = c.others if to_all else [root] if root != g.rank else []
        c.reduce_from(c.others, _A, arr[lo:hi], lo, op, what,
                      avg=g.size if op is ReduceOp.AVG else 0, write_to=targets)

    @_checks_calls
    def native_all_reduce(self, group, arr, op):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        base = c.begin("all_reduce", a=arr)
        self._reduce_chunk(c, arr, op, True, -1, "all_reduce")
        c.finish(base, "all_reduce")  # every rank has written its chunk into every buffer

    @_checks_calls
    def native_reduce(self, group, arr, op, root):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        base = c.begin("reduce", a=arr)
        self._reduce_chunk(c, arr, op, False, root, "reduce")
        c.finish(base, "reduce")

    @_checks_calls
    def native_broadcast(self, group, arr, root):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        base = c.begin("broadcast", a=arr)
        if group.rank != root:
            c.read_part(root, _A, arr, 0, "broadcast")
        c.finish(base, "broadcast")

    @_checks_calls
    def native_gather(self, group, arr, out, root):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        base = c.begin("gather", a=arr)
        if group.rank == root:
            rows = out.reshape(group.size, arr.size)
            rows[root] = arr
            for p in c.others:
                c.read_part(p, _A, rows[p], 0, "gather")
        c.finish(base, "gather")

    @_checks_calls
    def native_scatter(self, group, arr, src, root):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        base = c.begin("scatter", a=arr, b=src)
        if group.rank == root:
            arr[:] = src.reshape(group.size, arr.size)[root]
        else:
            c.read_part(root, _B, arr, group.rank * arr.nbytes, "scatter")
        c.finish(base, "scatter")

    @_checks_calls
    def native_all_gather(self, group, out, arr):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        base = c.begin("all_gather", a=arr)
        rows = out.reshape(group.size, arr.size)
        rows[group.rank] = arr
        for p in c.others:
            c.read_part(p, _A, rows[p], 0, "all_gather")
        c.finish(base, "all_gather")

    @_checks_calls
    def native_reduce_scatter(self, group, out, src, op):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        base = c.begin("reduce_scatter", b=src)
        start = group.rank * out.size
        out[:] = src[start:start + out.size]
        c.reduce_from(c.others, _B, out, start, op, "reduce_scatter")
        if op is ReduceOp.AVG:
            np.divide(out, group.size, out=out)
        c.finish(base, "reduce_scatter")

    @_checks_calls
    def native_all_to_all(self, group, out, src):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        base = c.begin("all_to_all", b=src)
        n = group.size
        rows, count = out.reshape(n, -1), out.size // n
        rows[group.rank] = src.reshape(n, -1)[group.rank]
        for p in c.others:
            c.read_part(p, _B, rows[p], group.rank * count * out.itemsize, "all_to_all")
        c.finish(base, "all_to_all")

    @_checks_calls
    def native_barrier(self, group):
        c = self._cma_for(group)
        if c is None:
            return NotImplemented
        c.finish(c.begin("barrier"), "barrier")
