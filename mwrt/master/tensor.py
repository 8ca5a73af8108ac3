"""DistributedTensor: the master's handle to an array that lives on a worker.

Every op returns at once: the master computes the result's shape and dtype with the
op's meta rule, names the result with a fresh id, and queues one command. Only copies
to the master (`numpy()`, `item()`, `float()`…) wait for the worker.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..arrays import HOST, as_dtype
from ..ops import Spec
from ..protocol import wire
from . import context, methods, ordering
from .streams import Stream
from .upcalls import unbound

_NAMES: dict[int, str] = {}  # id(handle) -> its name, while the handle lives


class DistributedTensor:
    """A handle to an array on (node, device); dropping the last handle frees it."""

    # The record of its storage's uses (see ordering.py): _writer, the stream that last wrote
    # it, at command id _wtime; _streams, every stream that used it (its free waits for them
    # all); _ltime, its last use. A view keeps them on _base, the handle that owns the storage
    # (as NumPy's ndarray.base), and its own _writer and _wtime say where it was made.
    __slots__ = ("_node", "_device", "_id", "_spec", "_streams", "_writer", "_wtime", "_ltime",
                 "_base", "_ref", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, node: Any, device: int, tensor_id: int, spec: Spec | None,
                 stream: int) -> None:
        """A handle to tensor `tensor_id` (made by mwrt's constructors and ops, not users)."""
        self._node, self._device, self._id = node, device, tensor_id
        self._spec = spec
        self._streams: tuple[int, ...] = (stream,)
        self._writer, self._wtime = stream, tensor_id
        self._ltime = tensor_id  # below its command's id, above every earlier command's
        self._base: DistributedTensor | None = None  # a view: the owner of its storage
        self._ref = wire.ref(tensor_id)  # pre-encoded, so messages carry it at no cost
        if ordering.capture:
            ordering.capture[-1].made(self)

    @classmethod
    def at_places(cls, nodes, devices, tensor_id: int, specs, streams) -> list:
        """One handle per place to tensor `tensor_id`, the id every place's worker gives its
        block of a mesh op's result: __init__'s fields, with one pre-encoded reference for
        all (not while a graph is captured: its records would not see them)."""
        ref, new, handles = wire.ref(tensor_id), cls.__new__, []
        # Places on one stream share one (stream,): fewer objects for the GC to trace (it
        # took a quarter of a new result's cost per place at 32 nodes).
        last = None  # the stream of the place before, and its (stream,)
        used: tuple[int, ...] = ()
        for node, device, spec, stream in zip(nodes, devices, specs, streams):
            if stream != last:
                last, used = stream, (stream,)
            t = new(cls)
            t._node, t._device, t._id, t._spec, t._streams = node, device, tensor_id, spec, used
            t._writer, t._wtime, t._ltime, t._base, t._ref = stream, tensor_id, tensor_id, \
                None, ref
            handles.append(t)
        return handles

    def __reduce__(self) -> Any:
        """Refuses: a handle is this master's, and means nothing pickled elsewhere."""
        raise TypeError("DistributedTensor: a handle cannot be pickled, nor captured by a "
                        "function shipped with mwrt.remote; pass the tensor as an argument "
                        "(remote(fn)(t)), or its value (t.numpy())")

    def __del__(self) -> None:
        """Free the worker's array once the streams that used it are done with it."""
        try:
            owner = self._base  # (inline: a free follows nearly every op)
            self._node.release(self._id, (self if owner is None else owner)._streams)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing left to free
            pass

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

    def get_node(self) -> int:
        """The index of the node (worker) that holds this tensor."""
        return self._node.index

    def get_device(self) -> int:
        """The device on its node that holds this tensor (-1, HOST: host memory)."""
        return self._device

    @property
    def name(self) -> str | None:
        """The name a master re-attaching to this named session finds it by (mwrt.attached())."""
        return _NAMES.get(id(self))

    @name.setter
    def name(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise TypeError(f"name: must be a non-empty str (got {value!r})")
        node = self._node
        node.issue(wire.Name(id=next(node.ids), ref=self._id, name=value))
        if id(self) not in _NAMES:  # by id: a weak dict would compare handles with == (an op)
            weakref.finalize(self, _NAMES.pop, id(self), None)
        _NAMES[id(self)] = value

    @property
    def spec(self) -> Spec:
        """Shape and dtype; asks the worker once if they depend on data (masks, remote())."""
        if self._spec is None:
            node = self._node
            stream = ordering.read_stream(self)
            meta = wire.Meta(id=next(node.ids), stream=stream, ref=self._id,
                             token=next(node.tokens))
            reply, _ = node.request(meta, f"shape of tensor {self._id}")
            self._spec = Spec(tuple(reply.value["shape"]), np.dtype(reply.value["dtype"]))
        return self._spec

    shape = property(lambda self: self.spec.shape, doc="The shape, a tuple of ints.")
    dtype = property(lambda self: self.spec.dtype, doc="The NumPy dtype of the elements.")
    ndim = property(lambda self: len(self.spec.shape), doc="The number of dimensions.")
    # exact, and 10x np.prod's speed
    size = property(lambda self: methods.Size(math.prod(self.spec.shape), self.spec.shape),
                    doc="The number of elements (NumPy's); called, size() or size(dim) gives "
                        "the shape or one dimension (torch's).")
    nbytes = property(lambda self: self.size * self.spec.dtype.itemsize,
                      doc="The bytes its elements take on the worker.")
    itemsize = property(lambda self: self.spec.dtype.itemsize, doc="The bytes of one element.")
    T = property(lambda self: self.transpose(), doc="The transpose (axes reversed), a view.")
    is_cuda = property(lambda self: self._device != HOST, doc="True if it lives on a GPU.")
    mT = property(lambda self: self.swapaxes(-1, -2),
                  doc="The last two axes swapped (the Array API's matrix transpose), a view.")

    @property
    def device(self) -> context.Device:
        """Where it lives, as an Array API device: mwrt.Device(node, device)."""
        return context.Device(self._node.index, self._device)

    def to_device(self, device: context.Device, /, *, stream: Any = None) -> DistributedTensor:
        """This tensor on `device` (an mwrt.Device, such as another tensor's .device)."""
        if not isinstance(device, context.Device):
            raise TypeError(f"to_device: expected an mwrt.Device such as t.device (got "
                            f"{device!r})")
        return self.to(node=device.node, device=device.device)

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        """The Array API namespace of mwrt tensors (mwrt.array_api)."""
        namespace = _ARRAY_API[0]
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"__array_namespace__: unsupported api_version {api_version!r} "
                             f"(expected None or a version up to "
                             f"{namespace.__array_api_version__})")
        return namespace

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
        """Shape, dtype and place, without asking the worker."""
        spec = "shape and dtype pending" if self._spec is None else \
            f"shape={self._spec.shape}, dtype={self._spec.dtype}"
        return (f"DistributedTensor({spec}, node={self._node.index}, device={self._device}, "
                f"id={self._id})")

    __hash__ = object.__hash__

    # -- copies to the master (sync points) -----------------------------------------------

    def numpy(self) -> np.ndarray:
        """Copy to the master as a NumPy array; waits for the stream that last wrote it."""
        return fetch(self)

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
        record = ordering.record(self)
        if stream.id not in record._streams:
            record._streams = record._streams + (stream.id,)

    # -- shapes, copies, fills ------------------------------------------------------------

    def reshape(self, *shape: int | Sequence[int], order: str = "C") -> DistributedTensor:
        """The same elements in `shape` (ints or one tuple; -1 once inferred), read and
        placed in `order` ("C": last axis fastest, "F": first), a view where NumPy makes one."""
        return call("reshape", self, _shape_arg(shape), **({} if order == "C" else
                                                          {"order": order}))

    view = reshape

    def flatten(self, order: str = "C") -> DistributedTensor:
        """A 1-D copy, its elements in `order` ("C" or "F", as NumPy's)."""
        return call("flatten", self, *(() if order == "C" else (order,)))

    def ravel(self) -> DistributedTensor:
        """A 1-D view where NumPy can make one, else a copy."""
        return call("ravel", self)

    def transpose(self, *axes: int | Sequence[int]) -> DistributedTensor:
        """The axes permuted (reversed if none are given), a view."""
        return call("transpose", self, *((_shape_arg(axes),) if axes else ()))

    def permute(self, *axes: int | Sequence[int]) -> DistributedTensor:
        """The axes in the order given (torch's name for transpose(axes)), a view."""
        return call("transpose", self, _shape_arg(axes))

    def squeeze(self, axis: int | tuple[int, ...] | None = None) -> DistributedTensor:
        """Without the length-1 axes (all of them, or those given), a view."""
        return call("squeeze", self, **({} if axis is None else {"axis": axis}))

    def expand_dims(self, axis: int | tuple[int, ...]) -> DistributedTensor:
        """With a new length-1 axis at `axis` (torch's unsqueeze), a view."""
        return call("expand_dims", self, axis)

    unsqueeze = expand_dims

    def swapaxes(self, a: int, b: int) -> DistributedTensor:
        """With axes `a` and `b` exchanged, a view."""
        return call("swapaxes", self, a, b)

    def moveaxis(self, source: int | Sequence[int], destination: int | Sequence[int]
                 ) -> DistributedTensor:
        """With axes moved from `source` to `destination`, a view."""
        return call("moveaxis", self, source, destination)

    def expand(self, *shape: int | Sequence[int]) -> DistributedTensor:
        """Broadcast to `shape` (torch's expand, NumPy's broadcast_to), a read-only view."""
        return call("broadcast_to", self, _shape_arg(shape))

    def contiguous(self) -> DistributedTensor:
        """A C-contiguous array: self's array if it is one, else a copy (worker-side)."""
        return call("ascontiguousarray", self)

    def astype(self, dtype: DTypeLike) -> DistributedTensor:
        """A copy converted to `dtype` (a NumPy dtype, its name, or a Python type)."""
        return call("astype", self, as_dtype(dtype).str)

    def clone(self) -> DistributedTensor:
        """A copy on the same (node, device)."""
        return call("copy", self)

    copy = clone

    def copy_(self, src: DistributedTensor | ArrayLike) -> DistributedTensor:
        """Copy `src` (broadcast to this shape) into this tensor; returns self."""
        call("copy_", self, src)
        return self

    def fill_(self, value: complex) -> DistributedTensor:
        """Set every element to the scalar `value`; returns self."""
        call("fill_", self, value)
        return self

    def zero_(self) -> DistributedTensor:
        """Set every element to 0; returns self."""
        return self.fill_(0)

    def clip(self, min: Any = None, max: Any = None, out: Any = None, **kwargs: Any
             ) -> DistributedTensor:
        """The values limited to [min, max] (either may be None; torch's clamp); `out=`
        writes them into a tensor, as NumPy's."""
        bounds = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
        return call("clip", self, **bounds, **_out(out), **kwargs)

    clamp = clip

    def round(self, decimals: int = 0, out: Any = None) -> DistributedTensor:
        """The values rounded to `decimals` decimals (halves to even, as NumPy)."""
        return call("round", self, decimals, **_out(out))

    def sort(self, axis: int = -1, kind: str | None = None, order: Any = None, **kwargs: Any
             ) -> None:
        """Sort in place along `axis` (NumPy's ndarray.sort; np.sort(t) makes a copy)."""
        call("sort_", self, axis, kind, order, **kwargs)

    def argsort(self, axis: int | None = -1, kind: str | None = None, order: Any = None,
                **kwargs: Any) -> DistributedTensor:
        """The indices that sort along `axis` (NumPy's arguments)."""
        return call("argsort", self, axis, kind, order, **kwargs)

    def repeat(self, repeats: Any, axis: int | None = None) -> DistributedTensor:
        """Each element repeated `repeats` times (an int, or one count per element)."""
        return call("repeat", self, repeats, axis)

    def take(self, indices: Any, axis: int | None = None, out: Any = None,
             mode: str = "raise") -> DistributedTensor:
        """The elements at `indices` (along `axis`, or of the flattened tensor)."""
        return call("take", self, methods.operand(indices), axis, **_out(out), mode=mode)

    def fill(self, value: Any) -> None:
        """Set every element to the scalar `value` in place (NumPy's ndarray.fill)."""
        call("fill_", self, value)

    def nonzero(self) -> tuple:
        """The indices of the non-zero elements, one tensor per axis (np.nonzero)."""
        return np.nonzero(self)

    real = property(lambda self: call("real", self),
                    lambda self, value: call("setpart_", self, "real", value),
                    doc="The real part (a view of a complex tensor, the tensor if real); "
                        "assigned, writes it in place.")
    imag = property(lambda self: call("imag", self),
                    lambda self, value: call("setpart_", self, "imag", value),
                    doc="The imaginary part (a view of a complex tensor, zeros if real); "
                        "assigned, writes it in place.")

    def diagonal(self, offset: int = 0, axis1: int = 0, axis2: int = 1) -> DistributedTensor:
        """The diagonal of axes (axis1, axis2), offset above (>0) or below (<0) the main one."""
        return call("diagonal", self, offset, axis1, axis2)

    def trace(self, offset: int = 0, axis1: int = 0, axis2: int = 1) -> DistributedTensor:
        """The sum of the diagonal (see diagonal)."""
        return call("trace", self, offset, axis1, axis2)

    def __getitem__(self, index: Any) -> DistributedTensor:
        """t[index] as NumPy indexes (ints, slices, ..., None, int/bool tensors), on the worker."""
        result = call("getitem", self, _index_arg(index))
        if is_element(index) and result._spec is not None and not result._spec.shape:
            result.__class__ = Element  # NumPy gives a scalar: `t[0] += 1` rebinds
        return result

    def __setitem__(self, index: Any, value: Any) -> None:
        """t[index] = value (a scalar, a tensor in the same place, or a small array)."""
        call("setitem", self, _index_arg(index), value)

    def __imatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """self @= other: the product written into this tensor (a view writes through), as
        NumPy's matmul(self, other, out=self)."""
        return call("matmul", self, methods.operand(other), out=self)

    def __divmod__(self, other: Any) -> tuple:
        """divmod(self, other): (floor quotient, remainder), np.divmod on the worker."""
        return call("divmod", self, methods.operand(other))

    def __rdivmod__(self, other: Any) -> tuple:
        """divmod(other, self), np.divmod on the worker."""
        return call("divmod", methods.operand(other), self)

    def __matmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """self @ other: the matrix product (np.matmul), on the tensor's worker."""
        return call("matmul", self, other)

    def __rmatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """other @ self: the matrix product (np.matmul), on the tensor's worker."""
        return call("matmul", other, self)

    # -- NumPy protocols ------------------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, out: Any = None,
                        **kwargs: Any) -> Any:
        """NumPy ufuncs on tensors (np.exp(t), np.add(t, 1, out=t)) run on the worker."""
        return array_ufunc(ufunc, method, inputs, out, kwargs)

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


def _out(out) -> dict:
    return {} if out is None else {"out": out}


def _shape_arg(shape):
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape


def _index_arg(index):
    """Lists in an index become arrays (the wire carries lists as tuples); tensors as slice
    bounds become ints (x[:n] with n a 0-d tensor: its value decides the shape)."""
    if isinstance(index, tuple):
        return tuple([_index_part(i) for i in index])
    return _index_part(index)


def _index_part(part):
    kind = type(part)
    if kind is slice:
        start, stop, step = part.start, part.stop, part.step
        if type(start) is DistributedTensor or type(stop) is DistributedTensor or \
                type(step) is DistributedTensor:
            return slice(*(b if b is None else operator.index(b) for b in (start, stop, step)))
        return part
    if kind is not list:
        return part
    array = np.asarray(part)  # an empty list indexes as intp in NumPy, not as float64
    return array.astype(np.intp) if array.size == 0 and array.dtype == np.float64 else array


def is_element(index: Any) -> bool:
    """True if `index` picks one element by integers alone (NumPy returns a scalar)."""
    if isinstance(index, tuple):
        return bool(index) and all(_is_int(i) for i in index)
    return _is_int(index)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


# -- up-calls (see upcalls.py) ------------------------------------------------------------
# Issuing an op, copies and NumPy's protocols make handles of this class, so they stand
# above it; mwrt.master binds them here as it loads (with the generated methods).
call: Callable[..., Any] = unbound("call", "mwrt.master.issue")
fetch: Callable[..., Any] = unbound("fetch", "mwrt.master.transfer")
move: Callable[..., Any] = unbound("move", "mwrt.master.transfer")
array_function: Callable[..., Any] = unbound("array_function", "mwrt.master.arrayfunc")
array_ufunc: Callable[..., Any] = unbound("array_ufunc", "mwrt.master.arrayfunc")
Element: Any = unbound("Element", "mwrt.master.element")  # the class of t[i]'s handle
