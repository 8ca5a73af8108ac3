"""Moving a GPU tensor's bytes through pinned host memory, in chunks that overlap.

A data channel carries host buffers (tcp, shm), so a GPU tensor's bytes are staged: copied
between device memory and page-locked ("pinned") host buffers, which the GPU's copy
engine reads and writes asynchronously, and which the channel sends from and receives
into. Pinned memory is costly to allocate, so a worker keeps a pool of it and reuses it.

A large transfer travels in chunks, so that copying and sending overlap: while chunk k
goes over the channel, chunk k+1 is copied from the device into the other of two pinned
buffers (and the reverse on the receiving side: while chunk k is copied to the device,
chunk k+1 arrives). The protocol: a transfer of n bytes whose tag carries a chunk size c
(bits CHUNK_SHIFT.., set by the master, which knows both ends, whenever a GPU is at one
of them) travels as ceil(n / c) messages on that tag, each c bytes but the last; a tag
without one travels as one message. Both ends read the chunk size from the tag, so they
agree without sharing a setting, and the master's own end (a host array) runs the same
loops with no copies (HostSlots), which is how the tests without a GPU cover them.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from . import arrays, config

CHUNK_SHIFT = 48  # tag bits 48..55: log2 of the chunk size; 0: one message
_MIN_CHUNK, _MAX_CHUNK = 1 << 12, 1 << 30
_KEEP_PER_SIZE = 4  # buffers of one size the pool keeps: two transfers, double-buffered


# -- the protocol: chunk sizes in tags ------------------------------------------------------

def tag_for(tag: int, nbytes: int, gpu: bool) -> int:
    """`tag`, carrying the chunk size (MWRT_STAGING_CHUNK_BYTES) when a GPU is at one end of
    a transfer of `nbytes` that takes more than one chunk."""
    if not gpu:
        return tag
    chunk = config.get("staging_chunk_bytes")
    if not _MIN_CHUNK <= chunk <= _MAX_CHUNK:
        raise ValueError(f"MWRT_STAGING_CHUNK_BYTES: must be in [{_MIN_CHUNK}, {_MAX_CHUNK}] "
                         f"(got {chunk})")
    shift = chunk.bit_length() - 1  # a power of two: the tag has 8 bits for it
    if nbytes <= 1 << shift:
        return tag
    return tag | shift << CHUNK_SHIFT


def chunked(tag: int) -> bool:
    """Whether a transfer with `tag` travels in chunks (a GPU is at one end of it)."""
    return bool((tag >> CHUNK_SHIFT) & 0xFF)


def staged(cmd) -> bool:
    """Whether a RecvFrom goes through staging: to a GPU, or in chunks (from one)."""
    return cmd.device != arrays.HOST or chunked(cmd.tag)


def spans(nbytes: int, tag: int) -> list[tuple[int, int]]:
    """The (start, stop) byte ranges of a transfer's messages (one, for 0 bytes too)."""
    shift = (tag >> CHUNK_SHIFT) & 0xFF
    chunk = 1 << shift if shift else max(nbytes, 1)
    if shift and not _MIN_CHUNK <= chunk <= _MAX_CHUNK:
        raise ValueError(f"transfer tag {tag:#x}: chunk size {chunk} out of range "
                         f"[{_MIN_CHUNK}, {_MAX_CHUNK}] (a master of another version?)")
    return [(a, min(a + chunk, nbytes)) for a in range(0, max(nbytes, 1), chunk)]


# -- the pinned pool ------------------------------------------------------------------------

class PinnedPool:
    """Pinned host buffers by size class (powers of two), kept for reuse across transfers."""

    def __init__(self, alloc):
        self._alloc = alloc
        self._free: dict[int, list] = {}
        self._lock = threading.Lock()
        self._allocations = self._in_use = 0

    def take(self, nbytes: int) -> np.ndarray:
        """A pinned uint8 buffer of at least `nbytes`; give() it back when its copies are done."""
        size = max(1 << max(nbytes - 1, 0).bit_length(), _MIN_CHUNK)
        with self._lock:
            self._in_use += 1
            kept = self._free.get(size)
            if kept:
                return kept.pop()
            self._allocations += 1
        try:
            return np.frombuffer(self._alloc(size), np.uint8, size)
        except BaseException:
            with self._lock:
                self._in_use -= 1
            raise

    def give(self, buf: np.ndarray, keep: bool = True) -> None:
        """Return `buf`; the pool keeps a few of each size and lets the rest go (and any that
        a failed transfer may still be writing: keep=False)."""
        with self._lock:
            self._in_use -= 1
            kept = self._free.setdefault(buf.nbytes, [])
            if keep and len(kept) < _KEEP_PER_SIZE:
                kept.append(buf)

    def statistics(self) -> dict:
        """Buffers allocated so far, taken and not given back, and kept (bytes)."""
        with self._lock:
            kept = sum(size * len(bufs) for size, bufs in self._free.items())
            return {"allocations": self._allocations, "in_use": self._in_use, "kept_bytes": kept}


_pools: dict = {}  # per GPU module: a test process may use mwrt.testing.fakegpu, then CuPy
_pools_lock = threading.Lock()


def pool() -> PinnedPool:
    """This process's pool, allocating with the GPU module's alloc_pinned_memory."""
    xp = arrays.gpu_module()
    with _pools_lock:
        found = _pools.get(xp)
        if found is None:
            found = _pools[xp] = PinnedPool(xp.cuda.alloc_pinned_memory)
        return found


# -- slots: where each chunk sits between the channel and the array --------------------------

class HostSlots:
    """A host array's chunks are its own slices: nothing to stage, every receive posted."""

    def __init__(self, flat: np.ndarray, count: int):
        self.flat, self.window = flat, count

    def slot(self, k: int, a: int, b: int):
        return self.flat[a:b]

    def fill(self, k: int, a: int, b: int) -> None:
        """The slice is the data already."""

    def ready(self, k: int, a: int, b: int):
        """The slice, as it is."""
        return self.flat[a:b]

    def land(self, k: int, a: int, b: int) -> None:
        """The bytes arrived in place."""

    def release(self, k: int) -> None:
        """A slice is never reused."""

    def close(self, ok: bool) -> None:
        """Nothing was borrowed."""


class PinnedSlots:
    """Two pinned buffers from the pool that a device array's chunks pass through, with the
    copies between them and the device issued on `stream` and awaited by event."""

    window = 2

    def __init__(self, xp, flat, stream, spans_: list, chunk: int):
        self.xp, self.flat, self.stream = xp, flat, stream
        count = min(len(spans_), self.window)
        self.bufs = [pool().take(chunk) for _ in range(count)]
        self.events: list = [None] * count

    def slot(self, k: int, a: int, b: int) -> np.ndarray:
        return self.bufs[k % len(self.bufs)][:b - a]

    def fill(self, k: int, a: int, b: int) -> None:
        """Start copying device bytes [a, b) into slot k (device to host, on the stream)."""
        if b > a:
            _download(self.flat[a:b], self.slot(k, a, b), self.stream)
        self.events[k % len(self.bufs)] = self.stream.record()

    def ready(self, k: int, a: int, b: int) -> np.ndarray:
        """Slot k, once its copy from the device has run."""
        self.events[k % len(self.bufs)].synchronize()
        return self.slot(k, a, b)

    def land(self, k: int, a: int, b: int) -> None:
        """Start copying slot k to device bytes [a, b) (host to device, on the stream)."""
        if b > a:
            self.flat[a:b].set(self.slot(k, a, b), stream=self.stream)
        self.events[k % len(self.bufs)] = self.stream.record()

    def release(self, k: int) -> None:
        """Slot k may be refilled once its copy to the device has run."""
        self.events[k % len(self.bufs)].synchronize()

    def close(self, ok: bool) -> None:
        """Give the buffers back once their copies are done; after a failure, a receive or
        a copy may still write into them, so the pool lets them go instead."""
        if ok:
            self.stream.synchronize()
        for buf in self.bufs:
            pool().give(buf, keep=ok)


def _download(src, out: np.ndarray, stream) -> None:
    """Device `src` into host `out`, asynchronously on `stream` (CuPy >= 13 says blocking=False;
    before it, a given stream made the copy asynchronous by itself)."""
    try:
        src.get(stream=stream, out=out, blocking=False)
    except TypeError:
        src.get(stream=stream, out=out)


def _flat_bytes(xp, array):
    """A C-contiguous uint8 view of `array`'s bytes (a device copy first if it is strided)."""
    array = xp.ascontiguousarray(array)
    return array.reshape(-1).view(xp.uint8)


def _slots_for(array, tag: int, stream, what: str):
    """The transfer's spans, and the slots a host (exactly NumPy) or device array needs."""
    nbytes = array.nbytes
    parts = spans(nbytes, tag)
    if type(array) is np.ndarray:
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return parts, HostSlots(flat, len(parts))
    xp = arrays.gpu_module()
    if stream is None:
        raise ValueError(f"{what}: a GPU array needs the stream its copies run on")
    chunk = parts[0][1] - parts[0][0]
    return parts, PinnedSlots(xp, _flat_bytes(xp, array), stream, parts, chunk)


# -- the two loops ----------------------------------------------------------------------------

def send_array(channel, array, peer: int, tag: int, stream=None) -> None:
    """Send `array` (host or device) to `peer` as the tag's chunks, staging device bytes."""
    parts, slots = _slots_for(array, tag, stream, "send")
    ok = False
    try:
        slots.fill(0, *parts[0])
        for k, (a, b) in enumerate(parts):
            if k + 1 < len(parts):  # the next copy runs while this chunk is sent
                slots.fill(k + 1, *parts[k + 1])
            channel.send(slots.ready(k, a, b), peer, tag)
        ok = True
    finally:
        slots.close(ok)


class Receive:
    """A receive of an array's chunks, posted as soon as the command arrives (finish() later,
    on the stream). A device array is made at finish(), on the stream's device; until then
    the first chunks land in pinned buffers."""

    def __init__(self, channel, shape, dtype, device: int, peer: int, tag: int, out=None):
        self.channel, self.peer, self.tag = channel, peer, tag
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), device
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.parts = spans(nbytes, tag)
        self.pinned: PinnedSlots | None = None  # a device array's, bound to it at finish()
        self.slots: HostSlots | PinnedSlots
        if device == arrays.HOST:
            self.out = np.empty(self.shape, self.dtype) if out is None else out
            self.slots = HostSlots(self.out.reshape(-1).view(np.uint8), len(self.parts))
        else:
            self.out = None
            chunk = self.parts[0][1] - self.parts[0][0]
            self.slots = self.pinned = PinnedSlots(None, None, None, self.parts, chunk)
        self.works = [self._post(k) for k in range(min(self.slots.window, len(self.parts)))]

    def _post(self, k: int):
        return self.channel.irecv(self.slots.slot(k, *self.parts[k]), self.peer, self.tag)

    def finish(self, xp=None, stream=None, timeout: float | None = None):
        """Wait for every chunk, copying each to the device as it comes; return the array."""
        ok = False
        try:
            if self.pinned is not None:
                self.out = xp.empty(self.shape, self.dtype)
                slots = self.pinned
                slots.xp, slots.flat, slots.stream = xp, _flat_bytes(xp, self.out), stream
            for k, (a, b) in enumerate(self.parts):
                self.works[k].wait(timeout)
                self.slots.land(k, a, b)
                if k + self.slots.window < len(self.parts):
                    self.slots.release(k)
                    self.works.append(self._post(k + self.slots.window))
            ok = True
        finally:
            if not ok:
                self.cancel()
            self.slots.close(ok)
        return self.out

    def cancel(self) -> None:
        """Withdraw the receives still pending (their buffers are not reused)."""
        for work in self.works:
            if not work.is_completed():
                work.cancel()


# -- small arrays, beside commands (Put, Get) ------------------------------------------------

def upload(xp, host: np.ndarray, stream):
    """A device copy of host array `host`, through one pinned buffer of the pool."""
    out = xp.empty(host.shape, host.dtype)
    parts = spans(host.nbytes, 0)
    slots = PinnedSlots(xp, _flat_bytes(xp, out), stream, parts, host.nbytes)
    ok = False
    try:
        slots.slot(0, *parts[0])[:] = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        slots.land(0, *parts[0])
        ok = True
    finally:
        slots.close(ok)
    return out


def download(array, stream) -> np.ndarray:
    """A NumPy copy of device array `array`, through one pinned buffer of the pool."""
    xp = arrays.gpu_module()
    host = np.empty(array.shape, array.dtype)
    parts = spans(array.nbytes, 0)
    slots = PinnedSlots(xp, _flat_bytes(xp, array), stream, parts, array.nbytes)
    ok = False
    try:
        slots.fill(0, *parts[0])
        host.reshape(-1).view(np.uint8)[:] = slots.ready(0, *parts[0])
        ok = True
    finally:
        slots.close(ok)
    return host
