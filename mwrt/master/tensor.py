"""DistributedTensor: the master's handle to an array that lives on a worker, or to one laid
over a mesh (one block at each place, placed Shard, Replicate or Partial per mesh dimension).

Every op returns at once: the master computes the result's shape and dtype with the
op's meta rule, names the result with a fresh id, and queues one command (one per place on
a mesh). Only copies to the master (`numpy()`, `item()`, `float()`…) wait for the workers.
The handle's placement decides how an op is issued: on one place by issue.call, over a mesh
by mesh/dispatch.call (its placement rules, then every place). Each method is written once,
here, above the verbs it calls; they make results of the class of their operands.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..arrays import HOST, as_dtype
from ..errors import MwrtError
from ..ops import Spec, torchspec
from ..protocol import wire
from . import context, methods, ordering
from .arrayfunc import array_function, array_ufunc
from .handle import Handle
from .issue import call
from .mesh.device_mesh import Mesh
from .mesh.dispatch import call as mesh_call
from .mesh.moves import gather_to_master, redistribute, resolve
from .mesh.naming import name_places
from .mesh.placement import REPLICATE, Shard, describe, shard_arg
from .methods import index_arg, is_element, operand, out_arg, shape_arg
from .streams import Stream
from .transfer import fetch, keep_read_ahead, move, share

_NAMES: dict[int, str] = {}  # id(handle) -> its name, while the handle lives


def _via(tensor: Handle) -> Callable[..., Any]:
    """How an op on `tensor` is issued: on its one place, or at every place of its mesh."""
    return call if tensor._mesh is None else mesh_call


class DistributedTensor(Handle):
    """A handle to an array on (node, device), or over a mesh; dropping the last handle
    frees it."""

    __slots__ = ()
    __array_priority__ = 1000
    vars().update(methods.generated(call, mesh_call))  # operators, reductions, exp, add_, …

    if TYPE_CHECKING:  # what methods.install generates, declared for type checkers
        def _op(self, other: Any) -> DistributedTensor: ...
        def _unary_op(self) -> DistributedTensor: ...
        def __getattr__(self, name: str) -> Any: ...  # reductions, exp, add_, …

        __add__ = __radd__ = __iadd__ = __sub__ = __rsub__ = __isub__ = _op
        __mul__ = __rmul__ = __imul__ = __truediv__ = __rtruediv__ = __itruediv__ = _op
        __floordiv__ = __rfloordiv__ = __ifloordiv__ = __mod__ = __rmod__ = __imod__ = _op
        __pow__ = __rpow__ = __ipow__ = __and__ = __rand__ = __iand__ = _op
        __or__ = __ror__ = __ior__ = __xor__ = __rxor__ = __ixor__ = _op
        __lshift__ = __rlshift__ = __ilshift__ = __rshift__ = __rrshift__ = __irshift__ = _op
        __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _op  # type: ignore[assignment]
        __neg__ = __pos__ = __abs__ = __invert__ = _unary_op

    # -- what the master knows without asking ---------------------------------------------

    @property
    def mesh(self) -> Any:
        """The mesh the tensor lies on (a one-place mesh for a tensor on one place)."""
        if self._mesh is None:
            return Mesh([(self._node.index, self._device)], (1,), ("node",))
        return self._mesh

    @property
    def placements(self) -> tuple:
        """One placement per mesh dimension: Shard(axis), Replicate() or Partial(op)."""
        return (REPLICATE,) if self._mesh is None else self._placements

    @property
    def placement(self) -> Any:
        """The placement on a 1-D mesh (the tuple of them on an n-D mesh)."""
        placements = self.placements
        return placements[0] if len(placements) == 1 else placements

    def shards(self) -> list:
        """The one-place tensors, one per place of the mesh (row-major): [self] on one place."""
        return [self] if self._mesh is None else list(self._locals)

    @property
    def spec(self) -> Spec:
        """Shape and dtype; asks the worker(s) once if they depend on data (masks, remote())."""
        if self._spec is None:
            self._spec = _asked_spec(self) if self._mesh is None else _global_spec(self)
        return self._spec

    shape = property(lambda self: self.spec.shape, doc="The shape, a tuple of ints.")
    dtype = property(lambda self: self.spec.dtype, doc="The NumPy dtype of the elements.")
    ndim = property(lambda self: len(self.spec.shape), doc="The number of dimensions.")
    itemsize = property(lambda self: self.spec.dtype.itemsize, doc="The bytes of one element.")

    def get_node(self) -> int:
        """The index of the node (worker) that holds this tensor."""
        return self._one_place("get_node")._node.index

    def get_device(self) -> int:
        """The device on its node that holds this tensor (-1, HOST: host memory)."""
        return self._one_place("get_device")._device

    @property
    def is_cuda(self) -> bool:
        """True if it lives on a GPU (on GPUs, for a mesh tensor)."""
        return (self._device if self._mesh is None else self._mesh.places[0][1]) != HOST

    def _one_place(self, what: str) -> DistributedTensor:
        if self._mesh is not None:
            raise TypeError(f"{what}: a mesh tensor lies on {self._mesh.size} places (got a "
                            f"tensor placed {describe(self._placements)}); ask one of its "
                            "shards (t.shards()[i])")
        return self

    def numel(self) -> int:
        """The number of elements (torch's name for size)."""
        return math.prod(self.spec.shape)

    def dim(self) -> int:
        """The number of dimensions (torch's name for ndim)."""
        return len(self.spec.shape)

    def element_size(self) -> int:
        """The bytes of one element (torch's name for itemsize)."""
        return self.spec.dtype.itemsize

    def __len__(self) -> int:
        """The length of the first dimension; a TypeError for a 0-d tensor."""
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        """Shape, dtype and place (placements and mesh), without asking the worker."""
        spec = "shape and dtype pending" if self._spec is None else \
            f"shape={self._spec.shape}, dtype={self._spec.dtype}"
        if self._mesh is not None:
            return (f"DistributedTensor({spec}, placements={describe(self._placements)}, "
                    f"mesh={self._mesh!r})")
        return (f"DistributedTensor({spec}, node={self._node.index}, device={self._device}, "
                f"id={self._id})")

    __hash__ = object.__hash__

    @property
    def name(self) -> str | None:
        """The name a master re-attaching to this named session finds it by (mwrt.attached())."""
        return _NAMES.get(id(self))

    @name.setter
    def name(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise TypeError(f"name: must be a non-empty str (got {value!r})")
        if self._mesh is not None:
            name_places(self, value)  # each block by name, and how they make the whole
        else:
            node = self._node
            node.issue(wire.Name(id=next(node.ids), ref=self._id, name=value))
        if id(self) not in _NAMES:  # by id: a weak dict would compare handles with == (an op)
            weakref.finalize(self, _NAMES.pop, id(self), None)
        _NAMES[id(self)] = value

    size = property(lambda self: methods.Size(math.prod(self.spec.shape), self.spec.shape),
                    doc="The number of elements (NumPy's); called, size() or size(dim) gives "
                        "the shape or one dimension (torch's).")
    nbytes = property(lambda self: self.size * self.spec.dtype.itemsize,
                      doc="The bytes its elements take on the worker.")
    T = property(lambda self: self.transpose(), doc="The transpose (axes reversed), a view.")
    mT = property(lambda self: self.swapaxes(-1, -2),
                  doc="The last two axes swapped (the Array API's matrix transpose), a view.")

    @property
    def kind(self) -> str:
        """The array behind the handle: "numpy" (host memory), "cupy" (a GPU) or "torch"."""
        device = self._device if self._mesh is None else self._mesh.place_devices[0]
        return "numpy" if device == HOST else "cupy"

    @property
    def device(self) -> context.Device:
        """Where it lives, as an Array API device: mwrt.Device(node, device)."""
        return context.Device(self._one_place("device")._node.index, self._device)

    def to_device(self, device: context.Device, /, *, stream: Any = None) -> DistributedTensor:
        """This tensor on `device` (an mwrt.Device, such as another tensor's .device)."""
        if not isinstance(device, context.Device):
            raise TypeError(f"to_device: expected an mwrt.Device such as t.device (got "
                            f"{device!r})")
        return self.to(node=device.node, device=device.device)

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        """The Array API namespace of mwrt tensors (mwrt.array_api)."""
        namespace = _ARRAY_API[0]
        if namespace is None:  # it registers itself when imported, as `mwrt.NAME` does
            raise MwrtError("__array_namespace__: mwrt.array_api is not loaded (a program "
                            "that never used the package's names, mwrt.NAME); import "
                            "mwrt.array_api first")
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"__array_namespace__: unsupported api_version {api_version!r} "
                             f"(expected None or a version up to "
                             f"{namespace.__array_api_version__})")
        return namespace

    # -- copies to the master (sync points) -----------------------------------------------

    def numpy(self, copy: bool = True) -> np.ndarray:
        """Copy to the master as a NumPy array; waits for the stream that last wrote it (a mesh
        tensor: each block sent straight here, all at once). `copy=False`, of a one-place
        tensor on a worker of this host: a read-only view of shared memory the worker filled
        (no copy on the master), freed when the array and its views are."""
        if self._mesh is not None:
            return gather_to_master(self)
        return fetch(self) if copy else share(self)

    get = numpy

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """The value as a NumPy array on the master (np.asarray(t)); waits, as numpy() does."""
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(1, 0), DLPack's CPU: __dlpack__ exports a copy in the master's memory."""
        return (1, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """A DLPack capsule of the value copied to the master (np.from_dlpack(t)); waits, as
        numpy() does. The worker's memory cannot be shared: copy=False is a BufferError."""
        if copy is False:
            raise BufferError("__dlpack__: a remote tensor's memory cannot be shared in "
                              "place (got copy=False); export a copy (copy=None or True)")
        if dl_device not in (None, (1, 0)):
            raise BufferError(f"__dlpack__: exports to the master's CPU only (got dl_device="
                              f"{dl_device}, expected (1, 0) or None)")
        return self.numpy().__dlpack__(max_version=max_version, copy=True)

    def item(self) -> Any:
        """The single element as a Python scalar."""
        if self.size != 1:
            raise ValueError(f"item: tensor has {self.size} elements (expected exactly 1)")
        return self.numpy().item()

    def tolist(self) -> Any:
        """The value as nested Python lists (a scalar for a 0-d tensor); waits for it."""
        return self.numpy().tolist()

    def __float__(self) -> float:
        """float(t) of a one-element tensor; waits for it."""
        return float(self.item())

    def __int__(self) -> int:
        """int(t) of a one-element tensor; waits for it."""
        return int(self.item())

    def __index__(self) -> int:
        """The value of a one-element integer tensor used as an index; waits for it."""
        if not np.issubdtype(self.dtype, np.integer):
            raise TypeError(f"__index__: only integer tensors can be indices (got {self.dtype})")
        return int(self.item())

    def __complex__(self) -> complex:
        """complex(t) of a one-element tensor; waits for it."""
        return complex(self.item())

    def __bool__(self) -> bool:
        """bool(t) of a one-element tensor; waits for it."""
        return bool(self.item())

    def __iter__(self) -> Iterator[DistributedTensor]:
        """The rows t[0], t[1], …: each a tensor on the worker, made as the loop asks."""
        return (self[i] for i in range(len(self)))

    # -- moves ----------------------------------------------------------------------------

    def to(self, node: int | None = None, device: int | None = None) -> DistributedTensor:
        """This tensor on (node, device): a copy made worker-side, or self if already there."""
        self._one_place("to")
        return move(self, self._node.index if node is None else node,
                    self._device if device is None else device)

    def dist_send(self, node: int | None = None, device: int | None = None) -> DistributedTensor:
        """Copy to another node (worker to worker); the device stays unless given."""
        return self.to(node=node, device=device)

    def cpu(self) -> DistributedTensor:
        """This tensor in its node's host memory (a copy if it is on a GPU)."""
        return self.to(device=HOST)

    def cuda(self, device: int | None = None) -> DistributedTensor:
        """On a GPU of the same node: `device`, or the current device if it is a GPU, else 0."""
        if device is None:
            device = self._device if self._device != HOST else max(context.current_device(), 0)
        return self.to(device=device)

    def record_stream(self, stream: Stream) -> None:
        """Keep the memory until `stream` has run what was issued so far (CUDA's rule; safe
        streams do this for every stream that used the tensor, so it is needed only for
        uses the master cannot see, such as a remote() function's side effects)."""
        for block in self.shards():
            ordering.keep_for(block, stream.id)

    # -- placements -----------------------------------------------------------------------

    def redistribute(self, *placements: Any, shard: Any = ...) -> DistributedTensor:
        """This tensor with other placements (`shard=axis`, `shard=None` to replicate, or
        Placements), moved worker to worker (all_reduce, all_gather, local slices)."""
        if self._mesh is None:
            raise TypeError(f"redistribute: a tensor on one place has no mesh to lay out (got "
                            f"a tensor on node {self._node.index}); put it on a mesh first "
                            "(mwrt.dist_send(t.numpy(), mesh=m, shard=axis))")
        if placements and shard is not ...:
            raise TypeError("redistribute: give placements or shard=, not both")
        if not placements and shard is ...:
            raise TypeError("redistribute: say where to (shard=axis, shard=None to replicate, "
                            "or Placements)")
        wanted = shard_arg(shard if shard is not ... else
                           (placements[0] if len(placements) == 1 else placements),
                           self.ndim, self._mesh.ndim, "redistribute")
        return redistribute(self, wanted)

    def replicate(self) -> DistributedTensor:
        """The whole tensor at every place (all_gather of shards, all_reduce of parts); a
        tensor on one place is itself."""
        return self if self._mesh is None else self.redistribute(shard=None)

    def reduce(self) -> DistributedTensor:
        """A Partial tensor made real: an all_reduce over the mesh, in place; returns self."""
        if self._mesh is not None:
            resolve(self)
        return self

    # -- shapes, copies, fills ------------------------------------------------------------

    def reshape(self, *shape: int | Sequence[int], order: str = "C") -> DistributedTensor:
        """The same elements in `shape` (ints or one tuple; -1 once inferred), read and
        placed in `order` ("C": last axis fastest, "F": first), a view where NumPy makes one."""
        return _via(self)("reshape", self, shape_arg(shape), **({} if order == "C" else
                                                          {"order": order}))

    view = reshape

    def flatten(self, order: str = "C") -> DistributedTensor:
        """A 1-D copy, its elements in `order` ("C" or "F", as NumPy's)."""
        return _via(self)("flatten", self, *(() if order == "C" else (order,)))

    def ravel(self) -> DistributedTensor:
        """A 1-D view where NumPy can make one, else a copy."""
        return _via(self)("ravel", self)

    def transpose(self, *axes: int | Sequence[int]) -> DistributedTensor:
        """The axes permuted (reversed if none are given), a view."""
        return _via(self)("transpose", self, *((shape_arg(axes),) if axes else ()))

    def permute(self, *axes: int | Sequence[int]) -> DistributedTensor:
        """The axes in the order given (torch's name for transpose(axes)), a view."""
        return _via(self)("transpose", self, shape_arg(axes))

    def squeeze(self, axis: int | tuple[int, ...] | None = None) -> DistributedTensor:
        """Without the length-1 axes (all of them, or those given), a view."""
        return _via(self)("squeeze", self, **({} if axis is None else {"axis": axis}))

    def expand_dims(self, axis: int | tuple[int, ...]) -> DistributedTensor:
        """With a new length-1 axis at `axis` (torch's unsqueeze), a view."""
        return _via(self)("expand_dims", self, axis)

    unsqueeze = expand_dims

    def swapaxes(self, a: int, b: int) -> DistributedTensor:
        """With axes `a` and `b` exchanged, a view."""
        return _via(self)("swapaxes", self, a, b)

    def moveaxis(self, source: int | Sequence[int], destination: int | Sequence[int]
                 ) -> DistributedTensor:
        """With axes moved from `source` to `destination`, a view."""
        return _via(self)("moveaxis", self, source, destination)

    def expand(self, *shape: int | Sequence[int]) -> DistributedTensor:
        """Broadcast to `shape` (torch's expand, NumPy's broadcast_to), a read-only view."""
        return _via(self)("broadcast_to", self, shape_arg(shape))

    def contiguous(self) -> DistributedTensor:
        """A C-contiguous array: self's array if it is one, else a copy (worker-side)."""
        if self._spec is not None and not self._spec.shape:  # np.ascontiguousarray: 1-d
            return _via(self)("reshape", self, ())
        return _via(self)("ascontiguousarray", self)

    def astype(self, dtype: DTypeLike) -> DistributedTensor:
        """A copy converted to `dtype` (a NumPy dtype, its name, or a Python type)."""
        return _via(self)("astype", self, as_dtype(dtype).str)

    def clone(self) -> DistributedTensor:
        """A copy on the same (node, device)."""
        return _via(self)("copy", self)

    copy = clone

    def copy_(self, src: DistributedTensor | ArrayLike) -> DistributedTensor:
        """Copy `src` (broadcast to this shape) into this tensor; returns self."""
        _via(self)("copy_", self, src)
        return self

    def fill_(self, value: complex) -> DistributedTensor:
        """Set every element to the scalar `value`; returns self."""
        _via(self)("fill_", self, value)
        return self

    def zero_(self) -> DistributedTensor:
        """Set every element to 0; returns self."""
        return self.fill_(0)

    def clip(self, min: Any = None, max: Any = None, out: Any = None, **kwargs: Any
             ) -> DistributedTensor:
        """The values limited to [min, max] (either may be None; torch's clamp); `out=`
        writes them into a tensor, as NumPy's."""
        bounds = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
        return _via(self)("clip", self, **bounds, **out_arg(out), **kwargs)

    clamp = clip

    def round(self, decimals: int = 0, out: Any = None) -> DistributedTensor:
        """The values rounded to `decimals` decimals (halves to even, as NumPy)."""
        return _via(self)("round", self, decimals, **out_arg(out))

    def sort(self, axis: int = -1, kind: str | None = None, order: Any = None, **kwargs: Any
             ) -> None:
        """Sort in place along `axis` (NumPy's ndarray.sort; np.sort(t) makes a copy)."""
        if self._mesh is not None:  # along an axis each block holds whole
            self.copy_(mesh_call("sort", self, axis, kind, order, **kwargs))
            return
        call("sort_", self, axis, kind, order, **kwargs)

    def argsort(self, axis: int | None = -1, kind: str | None = None, order: Any = None,
                **kwargs: Any) -> DistributedTensor:
        """The indices that sort along `axis` (NumPy's arguments)."""
        return _via(self)("argsort", self, axis, kind, order, **kwargs)

    def repeat(self, repeats: Any, axis: int | None = None) -> DistributedTensor:
        """Each element repeated `repeats` times (an int, or one count per element)."""
        return _via(self)("repeat", self, repeats, axis)

    def take(self, indices: Any, axis: int | None = None, out: Any = None,
             mode: str = "raise") -> DistributedTensor:
        """The elements at `indices` (along `axis`, or of the flattened tensor)."""
        return _via(self)("take", self, operand(indices), axis, **out_arg(out), mode=mode)

    def fill(self, value: Any) -> None:
        """Set every element to the scalar `value` in place (NumPy's ndarray.fill)."""
        _via(self)("fill_", self, value)

    def nonzero(self) -> tuple:
        """The indices of the non-zero elements, one tensor per axis (np.nonzero)."""
        return np.nonzero(self)

    real = property(lambda self: _via(self)("real", self),
                    lambda self, value: _via(self)("setpart_", self, "real", value),
                    doc="The real part (a view of a complex tensor, the tensor if real); "
                        "assigned, writes it in place.")
    imag = property(lambda self: _via(self)("imag", self),
                    lambda self, value: _via(self)("setpart_", self, "imag", value),
                    doc="The imaginary part (a view of a complex tensor, zeros if real); "
                        "assigned, writes it in place.")

    def diagonal(self, offset: int = 0, axis1: int = 0, axis2: int = 1) -> DistributedTensor:
        """The diagonal of axes (axis1, axis2), offset above (>0) or below (<0) the main one."""
        return _via(self)("diagonal", self, offset, axis1, axis2)

    def trace(self, offset: int = 0, axis1: int = 0, axis2: int = 1) -> DistributedTensor:
        """The sum of the diagonal (see diagonal)."""
        return _via(self)("trace", self, offset, axis1, axis2)

    def __getitem__(self, index: Any) -> DistributedTensor:
        """t[index] as NumPy indexes (ints, slices, ..., None, int/bool tensors), on the worker."""
        if self._mesh is not None:
            return mesh_call("getitem", self, index_arg(index))
        result = call("getitem", self, index_arg(index))
        if is_element(index) and result._spec is not None and not result._spec.shape:
            result.__class__ = Element  # NumPy gives a scalar: `t[0] += 1` rebinds
        return result

    def __setitem__(self, index: Any, value: Any) -> None:
        """t[index] = value (a scalar, a tensor in the same place, or a small array)."""
        _via(self)("setitem", self, index_arg(index), value)

    def __imatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """self @= other: the product written into this tensor (a view writes through), as
        NumPy's matmul(self, other, out=self)."""
        return _via(self)("matmul", self, operand(other), out=self)

    def __divmod__(self, other: Any) -> tuple:
        """divmod(self, other): (floor quotient, remainder), np.divmod on the worker."""
        return _via(self)("divmod", self, operand(other))

    def __rdivmod__(self, other: Any) -> tuple:
        """divmod(other, self), np.divmod on the worker."""
        return _via(self)("divmod", operand(other), self)

    def __matmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """self @ other: the matrix product (np.matmul), on the tensor's worker."""
        return _via(self)("matmul", self, other)

    def __rmatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """other @ self: the matrix product (np.matmul), on the tensor's worker."""
        return _via(self)("matmul", other, self)

    # -- NumPy protocols ------------------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, out: Any = None,
                        **kwargs: Any) -> Any:
        """NumPy ufuncs on tensors (np.exp(t), np.add(t, 1, out=t)) run on the worker."""
        return array_ufunc(ufunc, method, inputs, out, kwargs, call=_via(self))

    def __array_function__(self, func: Callable, types: Collection[type], args: tuple,
                           kwargs: dict) -> Any:
        """Other NumPy functions (np.linalg.inv(t), np.fft.fft(t), np.concatenate) on the
        worker that holds every tensor argument (see mwrt.master.arrayfunc)."""
        return array_function(func, args, kwargs)

    # -- torch's casts (last: above other methods, float and int would name these) --------

    def float(self) -> DistributedTensor:
        """A float32 copy (torch's float())."""
        return self.astype(np.float32)

    def double(self) -> DistributedTensor:
        """A float64 copy (torch's double())."""
        return self.astype(np.float64)

    def long(self) -> DistributedTensor:
        """An int64 copy (torch's long())."""
        return self.astype(np.int64)

    def int(self) -> DistributedTensor:
        """An int32 copy (torch's int())."""
        return self.astype(np.int32)


_ARRAY_API: list = [None]  # mwrt.array_api, which stands above the master, puts itself here


def set_array_namespace(module: Any) -> None:
    """Make `module` the namespace tensors answer __array_namespace__() with."""
    _ARRAY_API[0] = module


class Element(DistributedTensor, element=True):
    """One element taken by integer indices (t[0], t[1, 2]), where NumPy gives a scalar: a
    scalar is immutable, so augmented assignment makes a new value. `t[0] += 2.5` and `b[0]
    |= 1` read the element, compute with NumPy's promotion, and assign back with NumPy's
    casting on assignment (an int tensor keeps 3, a bool one True), as NumPy does."""

    __slots__ = ()
    vars().update({f"__i{py}__": methods.rebinding(op, call)
                   for py, op in methods.BINARY_OPERATORS.items()})

    def __imatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        return call("matmul", self, operand(other))

    def __round__(self, ndigits: int | None = None) -> Any:
        """round(t[i]): a Python int as round() of a NumPy scalar gives (waits for the value),
        or with `ndigits` a 0-d tensor rounded on the worker."""
        return round(self.item()) if ndigits is None else self.round(ndigits)


ShardedTensor = DistributedTensor  # the name mesh tensors had: one class holds both


def _asked_spec(tensor: DistributedTensor) -> Spec:
    """The shape and dtype of a one-place tensor, asked of its worker."""
    node = tensor._node
    meta = wire.Meta(id=next(node.ids), stream=ordering.read_stream(tensor), ref=tensor._id,
                     token=next(node.tokens))
    reply, frames = node.request(meta, f"shape of tensor {tensor._id}")
    if type(reply) is wire.Data:  # small: its bytes came too, for a read next
        spec = Spec(tuple(reply.shape), np.dtype(reply.dtype))
        keep_read_ahead(tensor, frames[0], spec)
        return spec
    if "stride" in reply.value:  # a torch tensor's metadata
        torch_spec: Any = torchspec.spec_from(reply.value)  # a torch handle's
        return torch_spec
    return Spec(tuple(reply.value["shape"]), np.dtype(reply.value["dtype"]))


def _global_spec(tensor: DistributedTensor) -> Spec:
    """The global shape of a mesh tensor whose blocks' shapes the workers know: the blocks'
    lengths summed along each sharded axis."""
    mesh: Mesh = tensor._mesh
    specs = [x.spec for x in tensor._locals]
    shape = list(specs[0].shape)
    for d, p in enumerate(tensor._placements):
        if type(p) is Shard:
            line = mesh.groups(d)[0]
            shape[p.axis] = sum(specs[i].shape[p.axis] for i in line)
    return Spec(tuple(shape), specs[0].dtype)
