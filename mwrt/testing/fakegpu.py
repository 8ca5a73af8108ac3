"""A GPU that runs anywhere, for tests: host memory posing as CUDA device k, shaped like
the parts of CuPy that mwrt uses.

A worker started with MWRT_FAKE_GPUS=n gets this module where it would get `cupy`
(arrays.namespace), so every GPU code path of mwrt (placement, per-device executors,
staging through host memory, streams and events) runs on a machine without a GPU. Like
CuPy, its arrays are not NumPy's: they carry `.device` and `.get()`, refuse NumPy operands
and operands of another device, and a device has a memory limit (MWRT_FAKE_GPU_BYTES) past
which allocation raises `cuda.memory.OutOfMemoryError`. Kernels run at once on the calling
thread (a stream is always done), and each stream counts the ops launched on it.

Where it cannot be CuPy: its arrays subclass NumPy's, so `np.asarray(a)` and the buffer
protocol see their memory (CuPy refuses both), and only new buffers made by its functions
and ufuncs count against the memory limit (not those of methods such as `astype`).
"""

from __future__ import annotations

import collections
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


def _charge(raw: np.ndarray, device: int) -> None:
    """Count `raw`'s bytes against `device` until `raw` is collected, or raise OOM."""
    nbytes = raw.nbytes
    with _lock:
        if _used[device] + nbytes > _limit():
            raise OutOfMemoryError(nbytes, _used[device], _limit())
        _used[device] += nbytes
    weakref.finalize(raw, _release, device, nbytes)


# -- arrays -----------------------------------------------------------------------------------

class ndarray(np.ndarray):
    """An array in device memory: NumPy's layout, CuPy's manners (`.device`, `.get()`)."""

    def __array_finalize__(self, obj):
        # Views and method results live where their source lives.
        self._device = getattr(obj, "_device", None)
        if self._device is None:
            self._device = _current_device()

    @property
    def device(self) -> "Device":
        return Device(self._device)

    @property
    def __cuda_array_interface__(self) -> dict:
        # What a GPU array declares (buffers.py stages such arrays through host memory).
        ptr = self.ctypes.data
        with _pointed_lock:
            refs = _pointed.setdefault(ptr, [])
            if not any(r() is self for r in refs):
                refs.append(weakref.ref(self, lambda ref, p=ptr: _forget(p, ref)))
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (ptr, False), "strides": None}

    def get(self, stream=None, order="C", out=None, blocking=True) -> np.ndarray:
        """A NumPy copy in host memory (CuPy's device-to-host copy)."""
        host = np.array(self.view(np.ndarray), order=order)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr, stream=None) -> None:
        """Copy host array `arr` into this array (CuPy's host-to-device copy)."""
        self.view(np.ndarray)[...] = arr

    def __repr__(self):
        return f"array({self.get()!r:.2000}, device={self._device})"

    def __str__(self):
        return str(self.get())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        result = _launch(getattr(ufunc, method), inputs, kwargs, ufunc.__name__)
        out = kwargs.get("out")
        if out is not None:  # in place: the caller's arrays are the result, as in CuPy
            return out[0] if len(out) == 1 else out
        return result

    def __array_function__(self, func, types, args, kwargs):
        return _launch(func, args, kwargs, func.__name__)

    def __reduce__(self):  # pickling (a remote function's result) yields host memory
        return np.array, (self.get(),)


def _unwrap(value, device: int, what: str):
    """`value` with every fake array a plain NumPy view; refuses what CuPy refuses."""
    if isinstance(value, ndarray):
        if value._device != device:
            raise ValueError(f"The device where the array resides ({value._device}) is different "
                             f"from the current device ({device}). Peer access has been "
                             "activated; call cupy.cuda.Device(k) or move the array first.")
        return value.view(np.ndarray)
    if isinstance(value, np.ndarray):
        raise TypeError(f"{what}: unsupported type {type(value)} (a NumPy array mixed with "
                        "GPU arrays); move it with cupy.asarray first")
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v, device, what) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v, device, what) for k, v in value.items()}
    return value


def _wrap(value, device: int):
    """Results as device arrays: a new buffer is charged to `device`, scalars become 0-d."""
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray) and not isinstance(value, ndarray):
        if value.base is None and value.size:
            _charge(value, device)
        out = value.view(ndarray)
        out._device = device
        return out
    if isinstance(value, tuple):
        return tuple(_wrap(v, device) for v in value)
    if isinstance(value, list):
        return [_wrap(v, device) for v in value]
    return value


def _launch(func, args, kwargs, name: str):
    """Run NumPy's `func` as a kernel on the current device and stream."""
    device = _current_device()
    result = func(*_unwrap(args, device, name), **_unwrap(kwargs, device, name))
    get_current_stream()._launched(name)
    return _wrap(result, device)


def device_array_at(ptr: int) -> "ndarray | None":
    """The largest live device array whose __cuda_array_interface__ gave out pointer `ptr`."""
    with _pointed_lock:
        found = [a for a in (r() for r in _pointed.get(ptr, ())) if a is not None]
    return max(found, key=lambda a: a.nbytes, default=None)


def asarray(a, dtype=None, order=None, blocking=False) -> ndarray:
    """`a` on the current device (a host-to-device copy unless it is there already)."""
    if isinstance(a, ndarray) and a._device == _current_device():
        return a if dtype is None else a.astype(dtype, copy=False)
    return array(a, dtype, order=order or "K")


def array(a, dtype=None, copy=True, order="K") -> ndarray:
    """A copy of `a` (host or device memory) on the current device."""
    host = a.get() if isinstance(a, ndarray) else a
    get_current_stream()._launched("array")
    return _wrap(np.array(host, dtype=dtype, order=order, copy=True), _current_device())


def asnumpy(a, stream=None, order="C", out=None) -> np.ndarray:
    return a.get(order=order, out=out) if isinstance(a, ndarray) else np.asarray(a, order=order)


def get_array_module(*args):
    return __import__(__name__, fromlist=["_"]) if any(
        isinstance(a, ndarray) for a in args) else np


class _Generator:
    """`random.default_rng(seed)`: NumPy's generator, drawing onto the current device."""

    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)

    def __getattr__(self, name):
        draw = getattr(self._rng, name)
        return lambda *a, **k: _launch(draw, a, k, f"random.{name}")


random = types.SimpleNamespace(default_rng=_Generator)


class _Submodule:
    """NumPy's `linalg`, `fft`…: their functions as kernels, as CuPy's submodules have them."""

    def __init__(self, module: types.ModuleType):
        self._module = module

    def __getattr__(self, name: str):
        func = getattr(self._module, name)
        if isinstance(func, type) or not callable(func):
            return func
        where = f"{self._module.__name__.removeprefix('numpy.')}.{name}"
        return lambda *a, **k: _launch(func, a, k, where)


def __getattr__(name: str):
    """Every other array function: NumPy's, as a kernel on the current device."""
    func = getattr(np, name)
    if isinstance(func, types.ModuleType):
        return _Submodule(func)
    if isinstance(func, type) or not callable(func):
        return func  # dtypes and constants are the same objects in CuPy
    return lambda *a, **k: _launch(func, a, k, name)


# -- devices, streams, events -----------------------------------------------------------------

def _current_device() -> int:
    return getattr(_local, "device", 0)


class Device:
    """CUDA device `id`: a context manager that makes it current on this thread."""

    def __init__(self, device=None):
        self.id = _current_device() if device is None else int(device)
        if not 0 <= self.id < _count():
            raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id} "
                               f"(this fake GPU host has {_count()}; MWRT_FAKE_GPUS)")
        self._saved: list = []

    def __enter__(self):
        self._saved.append(_current_device())
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

    null: "Stream"

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.device_id = _current_device()
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

    def use(self) -> "Stream":
        streams = getattr(_local, "streams", None)
        if streams is None:
            streams = _local.streams = {}
        streams[_current_device()] = self
        return self

    @property
    def done(self) -> bool:
        return True

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Everything launched on the fake stream has run already (the wait is counted)."""
        self.synchronized += 1

    def record(self, event=None) -> "Event":
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
    thread's null stream): how mwrt.testing.fakenccl records its calls on the stream given them."""
    found = _streams.get(ptr) if ptr else get_current_stream()
    if found is None:
        raise RuntimeError(f"cudaErrorInvalidResourceHandle: no live stream {ptr:#x}")
    found._launched(name)


def get_current_stream(device=None) -> Stream:
    device = _current_device() if device is None else device
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
    pair = (_current_device(), int(peer))
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
cuda = types.SimpleNamespace(
    Device=Device, Stream=Stream, Event=Event, get_elapsed_time=get_elapsed_time,
    get_current_stream=get_current_stream, runtime=runtime, memory=memory,
    alloc_pinned_memory=PinnedMemory, is_available=lambda: _count() > 0,
)

from . import fakenccl as _nccl  # noqa: E402 - it uses the names above

cuda.nccl = _nccl  # where CuPy keeps its NCCL bindings
