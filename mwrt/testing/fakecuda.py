"""The fake GPU's CUDA runtime, for tests: devices, their memory, streams, events, pinned
memory and the data pointers that device arrays give out.

It sits below both `fakegpu` (the arrays, CuPy's array module) and `fakenccl` (which is
handed raw pointers and stream handles, as NCCL is, and finds the arrays and streams here);
`fakegpu.cuda` is this runtime with `fakenccl` as its `nccl`. Kernels run at once on the
calling thread, so a stream is always done; each stream counts the kernels launched on it.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
import types
import weakref

import numpy as np

from .. import config

_local = threading.local()  # per thread, as in CUDA: the current device and its streams
_lock = threading.Lock()
_used: dict[int, int] = collections.defaultdict(int)  # bytes allocated per device
_ptrs = itertools.count(0x7F00_0000_1000, 0x100)
# Data pointer -> the array whose __cuda_array_interface__ gave it out: how mwrt.testing.fakenccl,
# which is handed pointers as NCCL is, finds the memory and checks it is a device array's.
# Views share pointers (a reshape for a collective dies while its array lives): keep each.
_pointed: dict[int, list] = {}
_pointed_lock = threading.RLock()  # its own, reentrant: a collected view's callback takes it


def _forget(ptr: int, ref) -> None:
    with _pointed_lock:
        refs = _pointed.get(ptr, [])
        if ref in refs:
            refs.remove(ref)
        if not refs:
            _pointed.pop(ptr, None)


def _count() -> int:
    return max(config.get("fake_gpus"), 0)


def _limit() -> int:
    return config.get("fake_gpu_bytes")


# -- memory -----------------------------------------------------------------------------------

class OutOfMemoryError(MemoryError):
    """As CuPy's cuda.memory.OutOfMemoryError: a device has not that many bytes left."""

    def __init__(self, size: int, total: int, limit: int):
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: "
                         f"{total:,} bytes, limit set to: {limit:,} bytes).")


def _release(device: int, nbytes: int) -> None:
    with _lock:
        _used[device] -= nbytes


def charge(raw: np.ndarray, device: int) -> None:
    """Count `raw`'s bytes against `device` until `raw` is collected, or raise OOM."""
    nbytes = raw.nbytes
    with _lock:
        if _used[device] + nbytes > _limit():
            raise OutOfMemoryError(nbytes, _used[device], _limit())
        _used[device] += nbytes
    weakref.finalize(raw, _release, device, nbytes)



def point_at(ptr: int, array) -> None:
    """Note that `array` gave out data pointer `ptr` (its __cuda_array_interface__), until it
    is collected: device_array_at finds it by that pointer."""
    with _pointed_lock:
        refs = _pointed.setdefault(ptr, [])
        if not any(r() is array for r in refs):
            refs.append(weakref.ref(array, functools.partial(_forget, ptr)))


def device_array_at(ptr: int):
    """The largest live device array whose __cuda_array_interface__ gave out pointer `ptr`."""
    with _pointed_lock:
        found = [a for a in (r() for r in _pointed.get(ptr, ())) if a is not None]
    return max(found, key=lambda a: a.nbytes, default=None)


# -- devices, streams, events -----------------------------------------------------------------

def current_device() -> int:
    """This thread's current device (CUDA's cudaGetDevice)."""
    return getattr(_local, "device", 0)


class Device:
    """CUDA device `id`: a context manager that makes it current on this thread."""

    def __init__(self, device=None):
        self.id = current_device() if device is None else int(device)
        if not 0 <= self.id < _count():
            raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id} "
                               f"(this fake GPU host has {_count()}; MWRT_FAKE_GPUS)")
        self._saved: list = []

    def __enter__(self):
        self._saved.append(current_device())
        self.use()
        return self

    def __exit__(self, *exc):
        _local.device = self._saved.pop()

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return self.id

    def __repr__(self):
        return f"<CUDA Device {self.id}>"

    def use(self) -> None:
        _local.device = self.id

    def synchronize(self) -> None:
        """Kernels of the fake device finish as they launch: nothing to wait for."""

    @property
    def compute_capability(self) -> str:
        return "80"

    @property
    def mem_info(self) -> tuple:
        with _lock:
            return max(_limit() - _used[self.id], 0), _limit()


class Stream:
    """A CUDA stream: `with stream:` or `.use()` sends this thread's kernels to it."""

    null: Stream

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.device_id = current_device()
        self.ptr = 0 if null else next(_ptrs)
        self.non_blocking = non_blocking
        self.launched = 0  # kernels run on this stream
        self.synchronized = 0  # host waits for it (tests: the executor never makes one)
        self.waited: list = []  # the events it was told to wait for (stream.wait_event)
        self.last_ops: collections.deque = collections.deque(maxlen=64)
        self._saved: list = []
        if self.ptr:
            _streams[self.ptr] = self

    def __enter__(self):
        self._saved.append(get_current_stream())
        return self.use()

    def __exit__(self, *exc):
        self._saved.pop().use()

    def __repr__(self):
        return f"<Stream {self.ptr:#x} (device: {self.device_id})>"

    def _launched(self, name: str) -> None:
        self.launched += 1
        self.last_ops.append(name)

    def use(self) -> Stream:
        streams = getattr(_local, "streams", None)
        if streams is None:
            streams = _local.streams = {}
        streams[current_device()] = self
        return self

    @property
    def done(self) -> bool:
        return True

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Everything launched on the fake stream has run already (the wait is counted)."""
        self.synchronized += 1

    def record(self, event=None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event) -> None:
        """Later kernels wait for `event`: here every recorded one has happened (and CUDA
        ignores a wait on an unrecorded event); the wait is noted."""
        self.waited.append(event)

    def launch_host_func(self, callback, arg) -> None:
        callback(arg)


_streams: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # ptr -> live Stream


def launch_on(ptr: int, name: str) -> None:
    """Count kernel `name` as launched on the stream whose raw handle is `ptr` (0: this
    thread's current stream): how fakegpu counts its kernels and fakenccl its calls."""
    found = _streams.get(ptr) if ptr else get_current_stream()
    if found is None:
        raise RuntimeError(f"cudaErrorInvalidResourceHandle: no live stream {ptr:#x}")
    found._launched(name)


def get_current_stream(device=None) -> Stream:
    device = current_device() if device is None else device
    streams = getattr(_local, "streams", None) or {}
    found = streams.get(device)
    if found is None:  # each device of each thread starts on its null stream
        found = Stream(null=True)
        found.device_id = device
        _local.streams = {**streams, device: found}
    return found


class Event:
    """A CUDA event: records a point of a stream; `get_elapsed_time` gives milliseconds."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.disable_timing = disable_timing
        self.stream = None
        self.time: float | None = None

    def record(self, stream=None) -> None:
        self.stream = get_current_stream() if stream is None else stream
        self.time = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.time is not None

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        """A recorded fake event has happened already."""


def get_elapsed_time(start: Event, end: Event) -> float:
    if start.time is None or end.time is None:
        raise RuntimeError("cudaErrorInvalidResourceHandle: an event was not recorded")
    if start.disable_timing or end.disable_timing:
        raise RuntimeError("cudaErrorInvalidResourceHandle: an event has timing disabled")
    return (end.time - start.time) * 1000.0


class PinnedMemory(bytearray):
    """Page-locked host memory (here: ordinary memory), as cuda.alloc_pinned_memory gives."""

    @property
    def ptr(self) -> int:
        return np.frombuffer(self, np.uint8).ctypes.data if len(self) else 0

    @property
    def size(self) -> int:
        return len(self)


_peer_access: set = set()  # (device, peer) pairs turned on, as the CUDA context keeps them


def _can_access_peer(device: int, peer: int) -> int:
    Device(device), Device(peer)  # CUDA's error for a device that does not exist
    return int(device != peer)  # host memory posing as two GPUs: every pair can


def _enable_peer_access(peer: int) -> None:
    """Turn on the current device's access to `peer`'s memory (CUDA's error when on)."""
    pair = (current_device(), int(peer))
    with _lock:
        if pair in _peer_access:
            raise RuntimeError("cudaErrorPeerAccessAlreadyEnabled: peer access is already "
                               "enabled")
        _peer_access.add(pair)


def _device_count() -> int:
    return _count()


def _mem_get_info() -> tuple:
    return Device().mem_info


def _device_properties(device: int) -> dict:
    Device(device)  # the same error as CUDA's for a device that does not exist
    return {"name": f"mwrt fake GPU {device}".encode(), "totalGlobalMem": _limit(),
            "major": 8, "minor": 0, "multiProcessorCount": 1}


Stream.null = Stream(null=True)
runtime = types.SimpleNamespace(getDeviceCount=_device_count, memGetInfo=_mem_get_info,
                                getDeviceProperties=_device_properties,
                                deviceCanAccessPeer=_can_access_peer,
                                deviceEnablePeerAccess=_enable_peer_access)
memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
