"""The xp layer: the array namespace of a device (NumPy for host memory, CuPy for GPUs)."""

from __future__ import annotations

import importlib

import numpy as np

HOST = -1
# NumPy 2 keeps its floating-point error state (what np.errstate sets) in a context
# variable, read and set directly where np.geterr() and np.errstate cost microseconds an op
# (the master's issue, the worker's run); None on a NumPy without one.
ERROR_STATE = getattr(getattr(getattr(np, "_core", None), "_ufunc_config", None),
                      "_extobj_contextvar", None)

# torch-style typed constructors and the dtypes they make.
TYPED = {
    "FloatTensor": np.float32, "DoubleTensor": np.float64, "HalfTensor": np.float16,
    "IntTensor": np.int32, "LongTensor": np.int64, "ShortTensor": np.int16,
    "ByteTensor": np.uint8, "CharTensor": np.int8, "BoolTensor": np.bool_,
}


CUDA_FIX = "pip install mwrt[cuda12] there (CuPy for CUDA 12)"


def gpu_module():
    """The module that makes GPU arrays here: the stand-in with CuPy's API that the settings
    name (config.gpu_stand_in: the fake GPU under MWRT_FAKE_GPUS), else cupy, or None when
    CuPy is not installed."""
    from . import config

    stand_in = config.gpu_stand_in()
    if stand_in:  # by name: no test double stands below the real code
        return importlib.import_module(stand_in)
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def in_host_memory(value) -> bool:
    """Whether `value` lives in host memory: a NumPy array or scalar, not a GPU array (a
    stand-in's GPU arrays may subclass NumPy's; like CuPy's, they declare CUDA memory)."""
    return (isinstance(value, (np.ndarray, np.generic))
            and not hasattr(type(value), "__cuda_array_interface__"))


def namespace(device: int):
    """Return the module that makes arrays on `device`: numpy for -1, cupy for a GPU."""
    if device == HOST:
        return np
    module = gpu_module()
    if module is None:
        raise RuntimeError(f"device {device}: this worker has no GPU (CuPy is not installed); "
                           f"{CUDA_FIX}, or use device=-1 (host memory)")
    return module


def use_device(device: int):
    """A context manager that makes `device` current (a no-op for host memory)."""
    if device == HOST:
        import contextlib

        return contextlib.nullcontext()
    return namespace(device).cuda.Device(device)


_peers: set = set()  # (device, peer) pairs of this process with peer access turned on


def peers_enabled() -> set:
    """The (device, peer) pairs of this process with peer access turned on."""
    return set(_peers)


def copy_to_device(xp, array, device: int):
    """`array` (on another GPU of this process) copied to `device` by the GPUs themselves, on
    `device`'s current stream: directly where the pair has peer access, which is turned on
    the first time; staged by the driver otherwise. Never through the master."""
    with xp.cuda.Device(device):
        _enable_peer(xp, device, array.device.id)
        return xp.asarray(array)


def _enable_peer(xp, device: int, peer: int) -> None:
    """Turn on `device`'s access to `peer`'s memory once, where the hardware allows it."""
    if device == peer or (device, peer) in _peers:
        return
    runtime = xp.cuda.runtime
    if runtime.deviceCanAccessPeer(device, peer):
        try:
            runtime.deviceEnablePeerAccess(peer)  # for the current device: `device`
        except Exception as exc:  # on already (another library did it): what we want
            if "AlreadyEnabled" not in f"{type(exc).__name__} {exc}":
                raise
        _peers.add((device, peer))


def device_count() -> int:
    """Number of GPUs this process sees (0 without CuPy or CUDA)."""
    try:
        return gpu_module().cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy (None), no driver, no device: no GPU here
        return 0


def devices() -> list[dict]:
    """This process's GPUs: index, name, total and free memory (bytes), compute capability."""
    return [_describe(gpu_module(), index) for index in range(device_count())]


def _describe(xp, index: int) -> dict:
    """One GPU's description; a GPU that cannot be asked (a broken driver) says why."""
    try:
        with xp.cuda.Device(index):
            free, total = xp.cuda.runtime.memGetInfo()
        props = xp.cuda.runtime.getDeviceProperties(index)
    except Exception as exc:  # noqa: BLE001 - the worker starts; this GPU's use names the error
        return {"index": index, "name": "", "total_memory": 0, "free_memory": 0,
                "compute_capability": "", "error": f"{type(exc).__name__}: {exc}"}
    name = props["name"]
    return {"index": index, "name": name.decode() if isinstance(name, bytes) else name,
            "total_memory": int(total), "free_memory": int(free),
            "compute_capability": f"{props['major']}.{props['minor']}"}


def as_dtype(dtype) -> np.dtype:
    """Normalize a dtype-like (np.float32, 'float32', '<f4') with a clear error."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: not understood (got {dtype!r}; expected e.g. np.float32 or "
                        "'float32')") from None
    if dt.hasobject or dt.fields is not None:
        raise TypeError(f"dtype: only numeric and bool dtypes are supported (got {dt})")
    return dt


def as_shape(shape) -> tuple:
    """Normalize a shape given as ints or one tuple: (2, 3) or ((2, 3),)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = []
    for dim in shape:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"shape: dimensions must be ints (got {shape!r})")
        if dim < 0:
            raise ValueError(f"shape: dimensions must be >= 0 (got {tuple(shape)!r})")
        out.append(int(dim))
    return tuple(out)


def to_host(array) -> np.ndarray:
    """A NumPy array with the contents of `array` (copies from a GPU)."""
    if type(array) is np.ndarray:  # exactly: a stand-in's GPU arrays may subclass it
        return array
    get = getattr(array, "get", None)
    return get() if get is not None else np.asarray(array)
