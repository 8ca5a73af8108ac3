"""Buffers for collectives: a flat NumPy view of the caller's array, or a staged copy.

NumPy arrays, the buffer protocol and DLPack (torch CPU tensors) are used in place. A GPU
array is copied to the host unless the channel moves device memory itself, and a torch
bfloat16 tensor, which NumPy has no dtype for, is widened to float32 (exactly) and
rounded back to nearest-even when the collective ends: the same bits on every rank,
since every rank rounds the same float32 values.
"""

from __future__ import annotations

import sys

import numpy as np


def as_flat(buf, what: str, writable: bool = True) -> np.ndarray:
    """A flat NumPy view of `buf`'s memory: NumPy, buffer protocol, or DLPack (torch CPU);
    a torch bfloat16 tensor's bits as uint16, for collectives that only move data."""
    if isinstance(buf, np.ndarray):
        arr = buf
    elif getattr(buf, "requires_grad", False):  # a parameter: its data, as torch's backends
        return as_flat(buf.detach(), what, writable)  # move it (DLPack refuses it)
    elif is_bfloat16(buf) and not hasattr(buf, "__cuda_array_interface__"):
        arr = np.from_dlpack(buf.view(sys.modules["torch"].int16)).view(np.uint16)
    elif hasattr(buf, "__dlpack__") and not hasattr(buf, "__cuda_array_interface__"):
        try:
            arr = np.from_dlpack(buf)  # torch CPU tensors: a zero-copy view, no torch import
        except (BufferError, RuntimeError, TypeError) as exc:
            dtype = getattr(buf, "dtype", "?")
            raise TypeError(f"{what}: NumPy cannot view this array (dtype {dtype}: {exc}); "
                            "cast it (t.float()) and copy the result back, or move its bits "
                            "as a same-size integer view (t.view(torch.int16))") from None
    else:
        try:
            arr = np.asarray(memoryview(buf))
        except TypeError:
            raise TypeError(f"{what}: expected an array (NumPy, buffer protocol, DLPack), got "
                            f"{type(buf).__name__}") from None
    if not arr.flags.c_contiguous:
        fix = "t.contiguous()" if hasattr(buf, "contiguous") else "np.ascontiguousarray(arr)"
        raise ValueError(f"{what}: array is not C-contiguous (shape {arr.shape}); pass "
                         f"{fix} and copy the result back")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what}: array is read-only; pass a writable array")
    return arr.reshape(-1)


class host_view:
    """`with host_view(buf, group, what) as arr`: a flat host array for `buf`; `reduces`:
    the collective computes on it (a bfloat16 tensor is then staged as float32)."""

    # The hook for GPU buffers: a channel that moves device memory itself declares
    # `device_buffers = True` and brings native collectives; otherwise a CuPy array is
    # copied to the host, the collective runs there, and the result is copied back. A
    # class, not a generator: small collectives pay for every microsecond of it.

    __slots__ = ("arr", "bits", "buf", "staged", "writable")

    def __init__(self, buf, group, what: str, writable: bool = True, reduces: bool = False):
        self.buf, self.writable, self.staged = buf, writable, False
        self.bits: np.ndarray | None = None
        self.arr: np.ndarray
        if hasattr(buf, "__cuda_array_interface__") and group.device_buffers:
            if not buf.flags.c_contiguous:  # a reshape would copy: results would be lost
                raise ValueError(f"{what}: array is not C-contiguous (shape {buf.shape}); pass "
                                 "cupy.ascontiguousarray(arr) and copy the result back")
            self.arr = buf.reshape(-1)  # the channel moves device memory: a flat view
        elif hasattr(buf, "__cuda_array_interface__"):
            if not hasattr(buf, "get"):
                raise TypeError(f"{what}: a GPU array other than CuPy's ({type(buf).__name__}); "
                                "pass a CuPy array, or a CPU copy and copy the result back")
            self.arr, self.staged = np.ascontiguousarray(buf.get()).reshape(-1), True
        elif reduces and is_bfloat16(buf):
            self.bits = as_flat(buf, what, writable)
            self.arr, self.staged = widen_bfloat16(self.bits), True
        else:
            self.arr = as_flat(buf, what, writable)

    def __enter__(self) -> np.ndarray:
        return self.arr

    def __exit__(self, exc_type, *_) -> None:
        if self.staged and self.writable and exc_type is None:
            if self.bits is not None:
                self.bits[:] = narrow_to_bfloat16(self.arr)
            else:
                self.buf.set(self.arr.reshape(self.buf.shape))


def is_bfloat16(buf) -> bool:
    # Only a torch tensor can be (torch is imported, then); str(dtype) costs 3 µs a call.
    return not isinstance(buf, np.ndarray) and str(getattr(buf, "dtype", "")) == "torch.bfloat16"


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32 values: exact, bfloat16 is float32's top half."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def narrow_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bits, rounded to nearest even as torch does; NaN stays NaN."""
    u = values.view(np.uint32)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bits[np.isnan(values)] = 0x7FC0
    return bits
