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

import types

import numpy as np

from . import fakenccl
from .fakecuda import (
    Device,
    Event,
    OutOfMemoryError,
    PinnedMemory,
    Stream,
    charge,
    current_device,
    device_array_at,
    get_current_stream,
    get_elapsed_time,
    launch_on,
    memory,
    point_at,
    runtime,
)

# -- arrays -----------------------------------------------------------------------------------

class ndarray(np.ndarray):
    """An array in device memory: NumPy's layout, CuPy's manners (`.device`, `.get()`)."""

    def __array_finalize__(self, obj):
        # Views and method results live where their source lives.
        self._device = getattr(obj, "_device", None)
        if self._device is None:
            self._device = current_device()

    @property
    def device(self) -> Device:  # type: ignore[override]  # its GPU, as CuPy's: not NumPy's "cpu"
        return Device(self._device)

    @property
    def __cuda_array_interface__(self) -> dict:
        # What a GPU array declares (buffers.py stages such arrays through host memory).
        ptr = self.ctypes.data
        point_at(ptr, self)
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
            charge(value, device)
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
    device = current_device()
    result = func(*_unwrap(args, device, name), **_unwrap(kwargs, device, name))
    launch_on(0, name)  # on this thread's current stream
    return _wrap(result, device)


def asarray(a, dtype=None, order=None, blocking=False) -> ndarray:
    """`a` on the current device (a host-to-device copy unless it is there already)."""
    if isinstance(a, ndarray) and a._device == current_device():
        # astype keeps the subclass (NumPy's stubs say ndarray).
        return a if dtype is None else a.astype(dtype, copy=False)  # type: ignore[return-value]
    return array(a, dtype, order=order or "K")


def array(a, dtype=None, copy=True, order="K") -> ndarray:
    """A copy of `a` (host or device memory) on the current device."""
    host = a.get() if isinstance(a, ndarray) else a
    launch_on(0, "array")
    return _wrap(np.array(host, dtype=dtype, order=order, copy=True), current_device())


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


cuda = types.SimpleNamespace(
    Device=Device, Stream=Stream, Event=Event, get_elapsed_time=get_elapsed_time,
    get_current_stream=get_current_stream, runtime=runtime, memory=memory,
    alloc_pinned_memory=PinnedMemory, is_available=lambda: runtime.getDeviceCount() > 0,
    nccl=fakenccl,  # where CuPy keeps its NCCL bindings
)
__all__ = ["Device", "Event", "OutOfMemoryError", "PinnedMemory", "Stream", "array", "asarray",
           "asnumpy", "cuda", "device_array_at", "get_array_module", "get_current_stream",
           "get_elapsed_time", "launch_on", "memory", "ndarray", "random", "runtime"]
