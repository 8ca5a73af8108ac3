"""A session's pool of warm receive buffers: a dist_send lands in memory already faulted in.

A fresh 64 MiB array copies at a third of the speed of one already touched (the kernel
zeroes and maps each page on first write: benchmarks/RESULTS.md), and a receive writes
every page of its destination once. So a large host receive takes its destination from
here: a buffer of the same size that an earlier received tensor freed, or a new one. The
array handed out is a view whose base is a `_Lease`; the lease, and with it the buffer,
comes back to the pool only when the last view of the array is gone (a tensor freed by
the master, a reshape made from it, a user function's reference), never while any
NumPy object can still read or write it. What the pool keeps is bounded by
MWRT_RECV_POOL_BYTES and by the session's quota (tensors plus pooled buffers stay within
MWRT_SESSION_BYTES); the oldest buffers go first.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict

import numpy as np

from .. import config


class _Lease:
    """The base object of a pooled array: alive while any view of the buffer is."""

    def __init__(self, buffer: np.ndarray, shape: tuple, dtype: np.dtype):
        self.buffer = buffer
        self.__array_interface__ = {"data": (buffer.ctypes.data, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}


class ReceivePool:
    """Freed receive buffers by size, reused for the next receive of that size."""

    def __init__(self, table=None, limit: int | None = None, min_bytes: int | None = None):
        self.table = table  # the session's TensorTable: pooled bytes count in its quota
        self.limit = config.get("recv_pool_bytes") if limit is None else limit
        self.min_bytes = config.get("recv_pool_min_bytes") if min_bytes is None else min_bytes
        self.held = 0  # bytes of free buffers waiting here
        self.reused = self.made = 0
        self._free: OrderedDict[int, list[np.ndarray]] = OrderedDict()  # nbytes -> buffers
        # A lease can die in any thread, in a garbage collection inside our own critical
        # section included: the lock must let that thread back in.
        self._lock = threading.RLock()
        self._closed = False

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialised C-ordered array of `shape`, `dtype`: warm when the pool has one."""
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < max(self.min_bytes, 1) or self.limit <= 0 or dtype.hasobject:
            return np.empty(shape, dtype)
        buffer = self._take(nbytes)
        if buffer is None:
            buffer = np.empty(nbytes, np.uint8)
            self.made += 1
        else:
            self.reused += 1
        lease = _Lease(buffer, shape, dtype)
        weakref.finalize(lease, self._give, buffer)
        return np.asarray(lease)

    def _take(self, nbytes: int) -> np.ndarray | None:
        with self._lock:
            self._evict()  # the session's tensors may have grown since buffers came back
            buffers = self._free.get(nbytes)
            if not buffers:
                return None
            buffer = buffers.pop()
            if not buffers:
                del self._free[nbytes]
            self.held -= nbytes
            return buffer

    def _give(self, buffer: np.ndarray) -> None:
        """Keep a buffer whose last view died, if the bounds leave room; else let it go."""
        nbytes = buffer.nbytes
        with self._lock:
            if self._closed or nbytes > self._room():
                return
            self._free.setdefault(nbytes, []).append(buffer)
            self._free.move_to_end(nbytes)
            self.held += nbytes
            self._evict()

    def _room(self) -> int:
        """Bytes the pool may hold: its own bound, and what the session's quota leaves."""
        room = self.limit
        if self.table is not None:
            room = min(room, self.table.max_bytes - self.table.nbytes)
        return room

    def _evict(self) -> None:
        """Drop the least recently returned sizes until the pool fits its room."""
        room = max(self._room(), 0)
        while self.held > room and self._free:
            nbytes, buffers = next(iter(self._free.items()))
            buffers.pop(0)
            self.held -= nbytes
            if not buffers:
                del self._free[nbytes]

    def trim(self) -> None:
        """Fit the pool into the room the session's quota now leaves (after it grew)."""
        with self._lock:
            self._evict()

    def stats(self) -> dict:
        """Pooled bytes and buffers, and how many receives reused one or made one."""
        with self._lock:
            return {"pool_bytes": self.held,
                    "pool_buffers": sum(len(b) for b in self._free.values()),
                    "pool_reused": self.reused, "pool_made": self.made}

    def close(self) -> None:
        """Drop every pooled buffer; leases still alive then free theirs as they die."""
        with self._lock:
            self._closed = True
            self._free.clear()
            self.held = 0
