"""Scratch buffers that collectives reuse from call to call.

A ring all_reduce receives megabytes into scratch every call; fresh pages cost a fault
each and a write into them runs at ~4 GB/s against ~11 into reused ones (BASELINE.md),
which made a 16 MiB tcp all_reduce a third slower. A few buffers are kept per process
(at most KEEP, the largest), each lent to one caller at a time and taken back only
when the caller finished without an error.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

KEEP = 4
_free: list[np.ndarray] = []
_lock = threading.Lock()


@contextmanager
def scratch(count: int, dtype):
    """`with scratch(count, dtype) as tmp`: a flat array of `count` elements, ours until exit."""
    nbytes = count * np.dtype(dtype).itemsize
    with _lock:  # the smallest that fits; by index: arrays compare elementwise, not by identity
        fits = [i for i, b in enumerate(_free) if b.nbytes >= nbytes]
        buf = _free.pop(min(fits, key=lambda i: _free[i].nbytes)) if fits else None
    if buf is None:
        buf = np.empty(max(nbytes, 1), np.uint8)
    yield buf[:nbytes].view(dtype)
    # Only after success: a failed collective may leave a receive posted into the buffer.
    with _lock:
        _free.append(buf)
        if len(_free) > KEEP:
            _free.pop(min(range(len(_free)), key=lambda i: _free[i].nbytes))
