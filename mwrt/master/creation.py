"""Making tensors on workers: typed constructors, empty/zeros/ones/full/arange/rand/randn,
dist_send (copies of the master's arrays) and remote() functions.

Each takes `mesh=` and `shard=` (or works inside `with mesh:`) to make a mesh tensor: a
block at every place of the mesh (mesh/mesh_creation.py), replicated unless `shard=` names the
axis to split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..arrays import TYPED, as_dtype, as_shape
from . import context, transfer
from .cluster import current
from .mesh import mesh_creation as on_mesh
from .mesh.device_mesh import Mesh, current_mesh, wanted
from .mesh.placement import ShardArg
from .remote import RemoteFunction
from .tensor import DistributedTensor
from .torchcreation import put as put_torch

Shape = int | Sequence[int]


def _create(kind: str, shape: tuple, dtype, node, device, args=(), mesh=None, shard=None):
    if node is None and (mesh is not None or shard is not None or current_mesh() is not None):
        return on_mesh.create(kind, shape, dtype, cast(Mesh, wanted(mesh, shard)), shard, args)
    dtype = as_dtype(dtype)
    target = current().node(context.current_node() if node is None else node)
    device = target.check_device(context.current_device() if device is None else device)
    return on_mesh.create_at(kind, shape, dtype, target, device, args)


def put(array: ArrayLike, node: int | None = None, device: int | None = None, *,
        mesh: Mesh | None = None, shard: ShardArg = None) -> DistributedTensor:
    """Copy a NumPy array from the master to (node, device); returns its DistributedTensor.
    With `mesh=` (or inside `with mesh:`), a mesh tensor: split along axis `shard` over
    the mesh's places (uneven as np.array_split), or replicated without it. A torch tensor
    stays torch on the worker: a TorchTensor."""
    if not isinstance(array, (np.ndarray, np.generic)):
        if type(array).__module__.partition(".")[0] == "torch":
            return put_torch(array, node, device, mesh=mesh, shard=shard)
        array = transfer.host_array(array)
    if node is None and (mesh is not None or shard is not None or current_mesh() is not None):
        return on_mesh.put(np.asarray(array), cast(Mesh, wanted(mesh, shard)), shard)
    array = np.asarray(array, order="C")  # keeps 0-d arrays 0-d
    as_dtype(array.dtype)
    target = current().node(context.current_node() if node is None else node)
    device = context.current_device() if device is None else device
    return on_mesh.put_at(array, target, device)


def remote(fn: Callable | None = None, *, outputs: int = 1, spec: Any = None) -> Any:
    """Decorator or call: `mwrt.remote(fn)(t)` runs fn(t's array) on t's worker.

    Results' shapes and dtypes resolve when first needed; give them up front as
    `spec=(shape, dtype)` (a list of them for several outputs) and nothing ever waits.
    """
    if fn is None:
        return lambda f: RemoteFunction(f, outputs, spec, DistributedTensor)
    return RemoteFunction(fn, outputs, spec, DistributedTensor)


def empty(*shape: Shape, dtype: DTypeLike = np.float32, node: int | None = None,
          device: int | None = None, mesh: Mesh | None = None,
          shard: ShardArg = None) -> DistributedTensor:
    """A tensor of `shape` on (node, device) for values written later, zero-filled by its
    worker (which never hands out freed memory: it may hold another master's bytes)."""
    return _create("empty", as_shape(shape), dtype, node, device, (), mesh, shard)


def zeros(*shape: Shape, dtype: DTypeLike = np.float32, node: int | None = None,
          device: int | None = None, mesh: Mesh | None = None,
          shard: ShardArg = None) -> DistributedTensor:
    """A tensor of `shape` filled with zeros on (node, device); float32 unless `dtype`."""
    return _create("zeros", as_shape(shape), dtype, node, device, (), mesh, shard)


def ones(*shape: Shape, dtype: DTypeLike = np.float32, node: int | None = None,
         device: int | None = None, mesh: Mesh | None = None,
         shard: ShardArg = None) -> DistributedTensor:
    """A tensor of `shape` filled with ones on (node, device); float32 unless `dtype`."""
    return _create("ones", as_shape(shape), dtype, node, device, (), mesh, shard)


def full(shape: Shape, fill_value: complex, dtype: DTypeLike | None = None, node: int | None = None,
         device: int | None = None, mesh: Mesh | None = None,
         shard: ShardArg = None) -> DistributedTensor:
    """A tensor of `shape` filled with `fill_value`; dtype from it if not given, float32 for a
    float fill (as ones/zeros/rand make), so full(4, 3.0) and ones(4) can meet in a
    collective."""
    shape = as_shape(shape if isinstance(shape, tuple) else (shape,))
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
        dtype = np.float32 if dtype == np.float64 else np.complex64 if dtype == np.complex128 \
            else dtype
    return _create("full", shape, dtype, node, device, (fill_value,), mesh, shard)


def arange(start: float, stop: float | None = None, step: float = 1, dtype: DTypeLike | None = None,
           node: int | None = None, device: int | None = None, mesh: Mesh | None = None,
           shard: ShardArg = None) -> DistributedTensor:
    """Evenly spaced values in [start, stop), like np.arange."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be 0")
    length = max(0, math.ceil((stop - start) / step))
    if dtype is None:  # NumPy's inference from all three, on at most one element
        dtype = np.arange(start, stop, step * max(length, 1)).dtype
    return _create("arange", (length,), dtype, node, device, (start, stop, step), mesh, shard)


def eye(n_rows: int, n_cols: int | None = None, k: int = 0, dtype: DTypeLike = np.float64,
        node: int | None = None, device: int | None = None) -> DistributedTensor:
    """Ones on diagonal `k` (0: the main one), zeros elsewhere, like np.eye."""
    shape = as_shape((n_rows, n_rows if n_cols is None else n_cols))
    return _create("eye", shape, dtype, node, device, (int(k),))


def linspace(start: complex, stop: complex, num: int, dtype: DTypeLike | None = None,
             endpoint: bool = True, node: int | None = None,
             device: int | None = None) -> DistributedTensor:
    """`num` evenly spaced values from `start` to `stop` (included if `endpoint`), like
    np.linspace; float64 (complex128 for a complex bound) unless `dtype`."""
    if dtype is None:
        dtype = np.complex128 if isinstance(start, complex) or isinstance(stop, complex) \
            else np.float64
    return _create("linspace", as_shape((num,)), dtype, node, device,
                   (start, stop, bool(endpoint)))


def fftfreq(n: int, d: float = 1.0, dtype: DTypeLike = np.float64, real: bool = False,
            node: int | None = None, device: int | None = None) -> DistributedTensor:
    """The sample frequencies of an FFT of length `n` (np.fft.fftfreq; rfftfreq's if `real`)."""
    length = n // 2 + 1 if real else n
    return _create("rfftfreq" if real else "fftfreq", as_shape((length,)), dtype, node,
                   device, (int(n), d))


def rand(*shape: Shape, dtype: DTypeLike = np.float32, node: int | None = None,
         device: int | None = None, mesh: Mesh | None = None,
         shard: ShardArg = None) -> DistributedTensor:
    """Uniform [0, 1) samples; reproducible after mwrt.manual_seed()."""
    seed = int(current().rng.integers(2**63))
    return _create("rand", as_shape(shape), dtype, node, device, (seed,), mesh, shard)


def randn(*shape: Shape, dtype: DTypeLike = np.float32, node: int | None = None,
          device: int | None = None, mesh: Mesh | None = None,
          shard: ShardArg = None) -> DistributedTensor:
    """Standard normal samples; reproducible after mwrt.manual_seed()."""
    seed = int(current().rng.integers(2**63))
    return _create("randn", as_shape(shape), dtype, node, device, (seed,), mesh, shard)


def manual_seed(seed: int) -> None:
    """Seed the generator that rand/randn draw their per-tensor seeds from."""
    current().rng = np.random.default_rng(seed)


def _typed(name: str, dtype) -> Callable[..., DistributedTensor]:
    def constructor(*shape: Shape, node: int | None = None, device: int | None = None,
                    mesh: Mesh | None = None, shard: ShardArg = None) -> DistributedTensor:
        return _create("empty", as_shape(shape), dtype, node, device, (), mesh, shard)
    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = (f"A {np.dtype(dtype)} tensor (torch's {name}), zero-filled by its "
                           "worker as empty() is.")
    return constructor


TYPED_CONSTRUCTORS = {name: _typed(name, dtype) for name, dtype in TYPED.items()}
