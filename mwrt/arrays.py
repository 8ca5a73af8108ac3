"""The xp layer: the array namespace of a device (NumPy for host memory, CuPy for GPUs)."""

from __future__ import annotations

import numpy as np

HOST = -1

# torch-style typed constructors and the dtypes they make.
TYPED = {
    "FloatTensor": np.float32, "DoubleTensor": np.float64, "HalfTensor": np.float16,
    "IntTensor": np.int32, "LongTensor": np.int64, "ShortTensor": np.int16,
    "ByteTensor": np.uint8, "CharTensor": np.int8, "BoolTensor": np.bool_,
}


def namespace(device: int):
    """Return the module that makes arrays on `device`: numpy for -1, cupy for a GPU."""
    if device == HOST:
        return np
    try:
        import cupy
    except ImportError:
        raise RuntimeError(
            f"device {device}: CuPy is not installed on this worker; "
            "install mwrt[cuda12] or use device=-1 (host memory)"
        ) from None
    return cupy


def use_device(device: int):
    """A context manager that makes `device` current (a no-op for host memory)."""
    if device == HOST:
        import contextlib

        return contextlib.nullcontext()
    return namespace(device).cuda.Device(device)


def device_count() -> int:
    """Number of GPUs this process sees (0 without CuPy or CUDA)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


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
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    return get() if get is not None else np.asarray(array)
