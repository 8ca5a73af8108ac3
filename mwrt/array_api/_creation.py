"""The standard's creation functions, with `device=` (a Device: `t.device`, or None for the
current place), and its data-type functions, which the master answers from dtypes alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..master import creation
from ..master.creation import put
from ..master.tensor import DistributedTensor
from ._info import place
from ._run import op, run, tensor

_FLOAT, _COMPLEX, _INT = np.dtype(np.float64), np.dtype(np.complex128), np.dtype(np.int64)


def _dtype(dtype, default=_FLOAT) -> np.dtype:
    return default if dtype is None else np.dtype(dtype)


def _shape(shape) -> tuple:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _like(x, dtype, device):
    x = tensor(x, "like")
    node, dev = place(device if device is not None else x.device)
    return x.shape, _dtype(dtype, x.dtype), node, dev


def to_device(x: DistributedTensor, device, /, *, stream=None) -> DistributedTensor:
    """`x` on `device` (a copy worker to worker, or `x` itself if it is there already)."""
    node, dev = place(device)
    x = tensor(x, "to_device")
    return x.to(node=node, device=dev)


def _is_on(x: DistributedTensor, device) -> bool:
    """Whether `x` lives on `device` already ("cpu": its own node's host memory)."""
    node, dev = place(device)
    here = x.device
    return (here.node if node is None else node, dev) == (here.node, here.device)


def asarray(obj, /, *, dtype=None, device=None, copy=None) -> DistributedTensor:
    """A tensor of `obj`: a tensor as it is (or converted, moved, copied as asked), else a
    value of the master's (scalar, nested lists, NumPy array, buffer) sent to `device`."""
    if isinstance(obj, DistributedTensor):
        out = obj
        if device is not None and not _is_on(out, device):
            if copy is False:
                raise ValueError("asarray: copy=False, but the tensor lives on another device")
            out, copy = to_device(out, device), None
        if dtype is not None and out.dtype != np.dtype(dtype):
            if copy is False:
                raise ValueError(f"asarray: copy=False, but {out.dtype} -> {np.dtype(dtype)} "
                                 "needs a copy")
            return op("astype", out, np.dtype(dtype).str)
        return op("copy", out) if copy else out
    if copy is False:
        raise ValueError("asarray: copy=False, but a value on the master must be copied to "
                         "a worker")
    array = np.asarray(obj, dtype=None if dtype is None else np.dtype(dtype))
    node, dev = place(device)
    return put(array, node=node, device=dev)


def from_dlpack(x, /, *, device=None, copy=None) -> DistributedTensor:
    """A tensor of a DLPack-exporting array of the master's (copied to `device`)."""
    if isinstance(x, DistributedTensor):
        return asarray(x, device=device, copy=copy)
    if copy is False:
        raise BufferError("from_dlpack: copy=False, but an array of the master's must be "
                          "copied to a worker")
    return asarray(np.from_dlpack(x), device=device)


def arange(start, /, stop=None, step=1, *, dtype=None, device=None) -> DistributedTensor:
    """Values from `start` to `stop` (excluded) by `step`."""
    node, dev = place(device)
    return creation.arange(start, stop, step, dtype=None if dtype is None else np.dtype(dtype),
                           node=node, device=dev)


def _filled(kind: str, shape, dtype, device) -> DistributedTensor:
    node, dev = place(device)
    return getattr(creation, kind)(_shape(shape), dtype=_dtype(dtype), node=node, device=dev)


def empty(shape, *, dtype=None, device=None) -> DistributedTensor:
    """A tensor for values written later, zero-filled (a worker never hands out old bytes)."""
    return _filled("empty", shape, dtype, device)


def zeros(shape, *, dtype=None, device=None) -> DistributedTensor:
    """A tensor of zeros; float64 unless `dtype`."""
    return _filled("zeros", shape, dtype, device)


def ones(shape, *, dtype=None, device=None) -> DistributedTensor:
    """A tensor of ones; float64 unless `dtype`."""
    return _filled("ones", shape, dtype, device)


def full(shape, fill_value, *, dtype=None, device=None) -> DistributedTensor:
    """A tensor of `fill_value`; its dtype from the value's kind unless `dtype`."""
    if isinstance(fill_value, DistributedTensor):
        fill_value = fill_value.item()
    if dtype is None:
        dtype = np.dtype(bool) if isinstance(fill_value, (bool, np.bool_)) else \
            _INT if isinstance(fill_value, int) else \
            _COMPLEX if isinstance(fill_value, complex) else \
            np.asarray(fill_value).dtype if isinstance(fill_value, np.generic) else _FLOAT
    node, dev = place(device)
    return creation.full(_shape(shape), fill_value, dtype=np.dtype(dtype), node=node,
                         device=dev)


def empty_like(x, /, *, dtype=None, device=None) -> DistributedTensor:
    """A zero-filled tensor of `x`'s shape (and dtype, and device, unless given), as empty()."""
    shape, dtype, node, dev = _like(x, dtype, device)
    return creation.empty(shape, dtype=dtype, node=node, device=dev)


def zeros_like(x, /, *, dtype=None, device=None) -> DistributedTensor:
    """Zeros of `x`'s shape (and dtype, and device, unless given)."""
    shape, dtype, node, dev = _like(x, dtype, device)
    return creation.zeros(shape, dtype=dtype, node=node, device=dev)


def ones_like(x, /, *, dtype=None, device=None) -> DistributedTensor:
    """Ones of `x`'s shape (and dtype, and device, unless given)."""
    shape, dtype, node, dev = _like(x, dtype, device)
    return creation.ones(shape, dtype=dtype, node=node, device=dev)


def full_like(x, /, fill_value, *, dtype=None, device=None) -> DistributedTensor:
    """`fill_value` in `x`'s shape (and dtype, and device, unless given)."""
    shape, dtype, node, dev = _like(x, dtype, device)
    return creation.full(shape, fill_value, dtype=dtype, node=node, device=dev)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None) -> DistributedTensor:
    """Ones on diagonal `k`, zeros elsewhere."""
    node, dev = place(device)
    return creation.eye(n_rows, n_cols, k, dtype=_dtype(dtype), node=node, device=dev)


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True
             ) -> DistributedTensor:
    """`num` evenly spaced values from `start` to `stop`."""
    node, dev = place(device)
    return creation.linspace(start, stop, num, dtype=dtype, endpoint=endpoint, node=node,
                             device=dev)


def meshgrid(*arrays, indexing="xy") -> list:
    """Coordinate matrices of 1-D tensors ("xy": Cartesian, "ij": matrix indexing)."""
    if not arrays:
        return []
    out = run("meshgrid", *arrays, indexing=indexing)
    return list(out) if isinstance(out, tuple) else [out]


def tril(x, /, *, k=0) -> DistributedTensor:
    """`x` with the elements above diagonal `k` zeroed (of the last two axes)."""
    return op("tril", x, k)


def triu(x, /, *, k=0) -> DistributedTensor:
    """`x` with the elements below diagonal `k` zeroed (of the last two axes)."""
    return op("triu", x, k)


# -- data types: answered on the master -------------------------------------------------

def _dtype_of(x):
    return x.dtype if isinstance(x, DistributedTensor) else x


def astype(x, dtype, /, *, copy=True, device=None) -> DistributedTensor:
    """`x` as `dtype`: `x` itself if copy=False and nothing changes, else a converted copy."""
    x = tensor(x, "astype")
    if device is not None:
        x = to_device(x, device)
    if not copy and x.dtype == np.dtype(dtype):
        return x
    return op("astype", x, np.dtype(dtype).str)


def can_cast(from_, to, /) -> bool:
    """Whether the standard's promotion allows `from_` (a dtype or tensor) to `to`."""
    return bool(np.can_cast(_dtype_of(from_), to))


@dataclass(frozen=True)
class finfo_object:
    """Machine limits of a floating dtype, as Python numbers (the standard's finfo object)."""

    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: np.dtype


def finfo(type, /) -> finfo_object:
    """Machine limits of a floating dtype (or a tensor's)."""
    info = np.finfo(_dtype_of(type))
    return finfo_object(int(info.bits), float(info.eps), float(info.max), float(info.min),
                        float(info.smallest_normal), np.dtype(info.dtype))


def iinfo(type, /):
    """Machine limits of an integer dtype (or a tensor's)."""
    return np.iinfo(_dtype_of(type))


def isdtype(dtype, kind) -> bool:
    """Whether `dtype` is of `kind` (a dtype, a kind's name, or a tuple of them)."""
    return bool(np.isdtype(dtype, kind))


def result_type(*arrays_and_dtypes):
    """The dtype the standard's promotion gives these tensors, dtypes and Python scalars."""
    return np.result_type(*(_dtype_of(a) for a in arrays_and_dtypes))
