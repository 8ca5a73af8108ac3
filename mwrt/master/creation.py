"""Making tensors on workers: typed constructors, empty/zeros/ones/full/arange/rand/randn."""

from __future__ import annotations

import math

import numpy as np

from ..arrays import TYPED, as_dtype, as_shape
from ..ops import Spec
from ..protocol import wire
from . import context
from .cluster import current


def _create(kind: str, shape: tuple, dtype, node, device, args=()):
    from .tensor import DistributedTensor

    dtype = as_dtype(dtype)
    target = current().node(context.current_node() if node is None else node)
    device = target.check_device(context.current_device() if device is None else device)
    stream = context.stream_for(target.index, device)
    tensor = DistributedTensor(target, device, next(target.ids), Spec(shape, dtype), stream)
    target.issue(wire.Create(id=next(target.ids), stream=stream, out=tensor._id, kind=kind,
                             shape=shape, dtype=dtype.str, device=device, args=tuple(args)))
    return tensor


def empty(*shape, dtype=np.float32, node=None, device=None):
    """An uninitialized tensor of `shape` on (node, device)."""
    return _create("empty", as_shape(shape), dtype, node, device)


def zeros(*shape, dtype=np.float32, node=None, device=None):
    return _create("zeros", as_shape(shape), dtype, node, device)


def ones(*shape, dtype=np.float32, node=None, device=None):
    return _create("ones", as_shape(shape), dtype, node, device)


def full(shape, fill_value, dtype=None, node=None, device=None):
    """A tensor of `shape` filled with `fill_value`; dtype from it if not given, float32 for a
    float fill (as ones/zeros/rand make), so full(4, 3.0) and ones(4) can meet in a
    collective."""
    shape = as_shape(shape if isinstance(shape, tuple) else (shape,))
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
        dtype = np.float32 if dtype == np.float64 else np.complex64 if dtype == np.complex128 \
            else dtype
    return _create("full", shape, dtype, node, device, (fill_value,))


def arange(start, stop=None, step=1, dtype=None, node=None, device=None):
    """Evenly spaced values in [start, stop), like np.arange."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be 0")
    length = max(0, math.ceil((stop - start) / step))
    if dtype is None:  # NumPy's inference from all three, on at most one element
        dtype = np.arange(start, stop, step * max(length, 1)).dtype
    return _create("arange", (length,), dtype, node, device, (start, stop, step))


def rand(*shape, dtype=np.float32, node=None, device=None):
    """Uniform [0, 1) samples; reproducible after mwrt.manual_seed()."""
    seed = int(current().rng.integers(2**63))
    return _create("rand", as_shape(shape), dtype, node, device, (seed,))


def randn(*shape, dtype=np.float32, node=None, device=None):
    """Standard normal samples; reproducible after mwrt.manual_seed()."""
    seed = int(current().rng.integers(2**63))
    return _create("randn", as_shape(shape), dtype, node, device, (seed,))


def manual_seed(seed: int) -> None:
    """Seed the generator that rand/randn draw their per-tensor seeds from."""
    current().rng = np.random.default_rng(seed)


def _typed(name: str, dtype):
    def constructor(*shape, node=None, device=None):
        return _create("empty", as_shape(shape), dtype, node, device)
    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = f"An uninitialized {np.dtype(dtype)} tensor (torch's {name})."
    return constructor


TYPED_CONSTRUCTORS = {name: _typed(name, dtype) for name, dtype in TYPED.items()}
