"""ShardedTensor: a DistributedTensor over a mesh, one local tensor at each of its places.

Its placements (one per mesh dimension) say how the local tensors make the whole: Shard(axis)
blocks, Replicate() copies, Partial(op) parts. Ops on it run at every place (dispatch.py);
what needs other places' data moves worker to worker (moves.py). Like DistributedTensor,
every op returns at once and copies to the master (numpy(), item()) are the sync points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from ...arrays import HOST, as_dtype
from ...ops import Spec
from .. import methods
from ..arrayfunc import array_ufunc
from ..tensor import DistributedTensor
from . import dispatch, moves
from .dispatch import array_function
from .dispatch import call as _call
from .moves import gather_to_master, global_spec, redistribute, resolve
from .placement import describe, shard_arg


class ShardedTensor:
    """A tensor laid over a mesh: a local DistributedTensor per place, and placements."""

    __slots__ = ("__weakref__", "_locals", "_mesh", "_partial_base", "_partial_views",
                 "_placements", "_spec")
    __array_priority__ = 1001  # above DistributedTensor's: NumPy defers to this class
    _sharded = True  # what issue.py and remote.py look for, without importing this module

    def __init__(self, mesh, placements: tuple, local_tensors: list, spec: Spec | None):
        """A handle over `local_tensors` (made by mwrt's mesh ops, not users)."""
        self._mesh, self._placements = mesh, placements
        self._locals, self._spec = list(local_tensors), spec
        # A view of a Partial tensor is made real by its base's all_reduce (moves.resolve):
        # the base it views, and, on a base, weak references to its views.
        self._partial_base = self._partial_views = None

    def __reduce__(self) -> Any:
        """Refuses: a handle is this master's, and means nothing pickled elsewhere."""
        raise TypeError("ShardedTensor: a handle cannot be pickled; pass the tensor as an "
                        "argument (remote(fn)(t)), or its value (t.numpy())")

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...  # the generated operators and methods

    # -- what the master knows without asking ---------------------------------------------

    @property
    def mesh(self):
        """The mesh the tensor lies on."""
        return self._mesh

    @property
    def placements(self) -> tuple:
        """One placement per mesh dimension: Shard(axis), Replicate() or Partial(op)."""
        return self._placements

    @property
    def placement(self) -> Any:
        """The placement on a 1-D mesh (the tuple of them on an n-D mesh)."""
        return self._placements[0] if len(self._placements) == 1 else self._placements

    def shards(self) -> list:
        """The local DistributedTensors, one per place of the mesh (row-major)."""
        return list(self._locals)

    @property
    def spec(self) -> Spec:
        """Global shape and dtype; asks the workers once if they depend on data."""
        if self._spec is None:
            self._spec = global_spec(self)
        return self._spec

    shape = property(lambda self: self.spec.shape, doc="The global shape, a tuple of ints.")
    dtype = property(lambda self: self.spec.dtype, doc="The NumPy dtype of the elements.")
    ndim = property(lambda self: len(self.spec.shape), doc="The number of dimensions.")
    size = property(lambda self: methods.Size(math.prod(self.spec.shape), self.spec.shape),
                    doc="The number of elements of the whole tensor.")
    nbytes = property(lambda self: self.size * self.spec.dtype.itemsize,
                      doc="The bytes of the whole tensor (not counting replicas).")
    itemsize = property(lambda self: self.spec.dtype.itemsize, doc="The bytes of one element.")
    T = property(lambda self: self.transpose(), doc="The transpose (axes reversed).")
    is_cuda = property(lambda self: self._mesh.places[0][1] != HOST,
                       doc="True if it lives on GPUs.")

    # What reads only the shape, numpy() and the methods both classes have is shared.
    numel, dim, __len__ = DistributedTensor.numel, DistributedTensor.dim, DistributedTensor.__len__
    __array__, item, tolist = DistributedTensor.__array__, DistributedTensor.item, \
        DistributedTensor.tolist
    __float__, __int__, __bool__ = (DistributedTensor.__float__, DistributedTensor.__int__,
                                    DistributedTensor.__bool__)
    __iter__, zero_ = DistributedTensor.__iter__, DistributedTensor.zero_

    def __repr__(self) -> str:
        """Shape, dtype, placements and mesh, without asking the workers."""
        spec = "shape and dtype pending" if self._spec is None else \
            f"shape={self._spec.shape}, dtype={self._spec.dtype}"
        return (f"ShardedTensor({spec}, placements={describe(self._placements)}, "
                f"mesh={self._mesh!r})")

    __hash__ = object.__hash__

    # -- copies to the master (sync points) -----------------------------------------------

    def numpy(self) -> np.ndarray:
        """The whole value on the master: each shard sent straight here, all at once."""
        return gather_to_master(self)

    get = numpy

    # -- placements -----------------------------------------------------------------------

    def redistribute(self, *placements: Any, shard: Any = ...) -> ShardedTensor:
        """This tensor with other placements (`shard=axis`, `shard=None` to replicate, or
        Placements), moved worker to worker (all_reduce, all_gather, local slices)."""
        if placements and shard is not ...:
            raise TypeError("redistribute: give placements or shard=, not both")
        if not placements and shard is ...:
            raise TypeError("redistribute: say where to (shard=axis, shard=None to replicate, "
                            "or Placements)")
        wanted = shard_arg(shard if shard is not ... else
                           (placements[0] if len(placements) == 1 else placements),
                           self.ndim, self._mesh.ndim, "redistribute")
        return redistribute(self, wanted)

    def replicate(self) -> ShardedTensor:
        """The whole tensor at every place (all_gather of shards, all_reduce of parts)."""
        return self.redistribute(shard=None)

    def reduce(self) -> ShardedTensor:
        """A Partial tensor made real: an all_reduce over the mesh, in place; returns self."""
        resolve(self)
        return self

    # -- shapes, copies, fills ------------------------------------------------------------

    def reshape(self, *shape: int | Sequence[int]) -> ShardedTensor:
        """The same elements in `shape` (the sharded axis and those before it kept)."""
        return _call("reshape", self, _shape_arg(shape))

    view = reshape

    def flatten(self) -> ShardedTensor:
        """A 1-D copy (of a 1-D or replicated tensor)."""
        return _call("flatten", self)

    def ravel(self) -> ShardedTensor:
        """A 1-D view where NumPy can make one (of a 1-D or replicated tensor)."""
        return _call("ravel", self)

    def transpose(self, *axes: int | Sequence[int]) -> ShardedTensor:
        """The axes permuted (reversed if none are given); the sharded axis follows."""
        return _call("transpose", self, *((_shape_arg(axes),) if axes else ()))

    def permute(self, *axes: int | Sequence[int]) -> ShardedTensor:
        """The axes in the order given (torch's name for transpose(axes))."""
        return _call("transpose", self, _shape_arg(axes))

    def squeeze(self, axis: int | tuple[int, ...] | None = None) -> ShardedTensor:
        """Without the length-1 axes (all, or those given); never the sharded one."""
        return _call("squeeze", self, **({} if axis is None else {"axis": axis}))

    def expand_dims(self, axis: int | tuple[int, ...]) -> ShardedTensor:
        """With a new length-1 axis at `axis` (torch's unsqueeze)."""
        return _call("expand_dims", self, axis)

    unsqueeze = expand_dims

    def swapaxes(self, a: int, b: int) -> ShardedTensor:
        """With axes `a` and `b` exchanged."""
        return _call("swapaxes", self, a, b)

    def moveaxis(self, source: Any, destination: Any) -> ShardedTensor:
        """With axes moved from `source` to `destination`."""
        return _call("moveaxis", self, source, destination)

    def contiguous(self) -> ShardedTensor:
        """Each block a C-contiguous array (a copy where it is not one)."""
        return _call("ascontiguousarray", self)

    def astype(self, dtype: DTypeLike) -> ShardedTensor:
        """A copy converted to `dtype`, block by block."""
        return _call("astype", self, as_dtype(dtype).str)




    def clone(self) -> ShardedTensor:
        """A copy, placed as this tensor is."""
        return _call("copy", self)

    copy = clone

    def copy_(self, src: Any) -> ShardedTensor:
        """Copy `src` (broadcast to this shape) into this tensor; returns self."""
        _call("copy_", self, src)
        return self

    def fill_(self, value: complex) -> ShardedTensor:
        """Set every element to the scalar `value`; returns self."""
        _call("fill_", self, value)
        return self

    def clip(self, a_min: Any = None, a_max: Any = None) -> ShardedTensor:
        """The values limited to [a_min, a_max] (torch's clamp)."""
        return _call("clip", self, a_min, a_max)

    clamp = clip

    def round(self, decimals: int = 0) -> ShardedTensor:
        """The values rounded to `decimals` decimals (halves to even, as NumPy)."""
        return _call("round", self, decimals)

    def sort(self, axis: int = -1) -> ShardedTensor:
        """A sorted copy along `axis` (an unsharded one)."""
        return _call("sort", self, axis)

    def argsort(self, axis: int = -1) -> ShardedTensor:
        """The indices that sort along `axis` (an unsharded one)."""
        return _call("argsort", self, axis)

    def __getitem__(self, index: Any) -> ShardedTensor:
        """t[index]: basic indices (an int along the sharded axis gives a replicated row)."""
        return _call("getitem", self, _index_arg(index))

    def __setitem__(self, index: Any, value: Any) -> None:
        """t[index] = value: each place sets the part of `index` in its block."""
        _call("setitem", self, _index_arg(index), value)

    def __matmul__(self, other: Any) -> ShardedTensor:
        """self @ other, by matmul's placement rules."""
        return _call("matmul", self, other)

    def __rmatmul__(self, other: Any) -> ShardedTensor:
        """other @ self, by matmul's placement rules."""
        return _call("matmul", other, self)

    # -- NumPy protocols ------------------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, out: Any = None,
                        **kwargs: Any) -> Any:
        """NumPy ufuncs on mesh tensors run at every place, by the placement rules."""
        return array_ufunc(ufunc, method, inputs, out, kwargs, call=_call)

    def __array_function__(self, func: Callable, types: Collection[type], args: tuple,
                           kwargs: dict) -> Any:
        """Other NumPy functions: registry ops by the placement rules; on replicated tensors
        any function, at every place."""
        return array_function(func, args, kwargs)

    # Last: above, the name int would be this method in the others' annotations.
    float, double = DistributedTensor.float, DistributedTensor.double
    long, int = DistributedTensor.long, DistributedTensor.int


def _shape_arg(shape):
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape


def _index_arg(index):
    if isinstance(index, list):
        return np.asarray(index)
    if isinstance(index, tuple):
        return tuple(np.asarray(i) if isinstance(i, list) else i for i in index)
    return index


dispatch.ShardedTensor = moves.ShardedTensor = ShardedTensor  # the class of their results
methods.install(ShardedTensor, _call)
