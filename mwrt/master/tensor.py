"""DistributedTensor: the master's handle to an array that lives on a worker, or to one laid
over a mesh (one block at each place, placed Shard, Replicate or Partial per mesh dimension).

Every op returns at once: the master computes the result's shape and dtype with the
op's meta rule, names the result with a fresh id, and queues one command (one per place on
a mesh). Only copies to the master (`numpy()`, `item()`, `float()`…) wait for the workers.
The handle's placement decides how an op is issued: on one place by issue.call, over a mesh
by mesh/dispatch.call (its placement rules, then every place). Each method is written once,
here, above the verbs it calls; they make results of the class of their operands. What a
handle tells without issuing an op (its metadata, copies of its value to the master) is its
base's, TensorReads (tensorreads.py).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..arrays import HOST, as_dtype
from ..errors import MwrtError
from ..ops import Spec
from . import context, methods, ordering
from .arrayfunc import array_function, array_ufunc
from .flat import FlatIndex
from .handle import Handle
from .issue import call
from .layout import Flags
from .mesh.dispatch import call as mesh_call
from .mesh.moves import redistribute, resolve
from .mesh.placement import shard_arg
from .methods import index_arg, is_element, names_dtype, operand, out_arg, shape_arg
from .streams import Stream
from .tensorreads import TensorReads
from .transfer import move


def _via(tensor: Handle) -> Callable[..., Any]:
    """How an op on `tensor` is issued: on its one place, or at every place of its mesh."""
    return call if tensor._mesh is None else mesh_call


class DistributedTensor(TensorReads):
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

    __hash__ = object.__hash__  # the generated __eq__ would unset it

    # -- views by property, the Array API's device and namespace ------------------------

    T = property(lambda self: self.transpose(), doc="The transpose (axes reversed), a view.")
    mT = property(lambda self: self.swapaxes(-1, -2),
                  doc="The last two axes swapped (the Array API's matrix transpose), a view.")
    flat = property(FlatIndex, doc="NumPy's flat indexing: t.flat[::n + 1] = 0 writes the "
                                   "diagonal of an n x n tensor.")

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

    def __iter__(self) -> Iterator[DistributedTensor]:
        """The rows t[0], t[1], …: each a tensor on the worker, made as the loop asks."""
        return (self[i] for i in range(len(self)))

    def __contains__(self, value: Any) -> bool:
        """`value in t`, as NumPy (and torch) answer it: (t == value).any(); one wait, where
        a walk of the rows would wait once per row."""
        return bool((self == value).any())

    def __copy__(self) -> DistributedTensor:
        """copy.copy(t): a copy made on its worker, as copy.copy of a NumPy array copies."""
        return self.copy()

    def __deepcopy__(self, memo: dict) -> DistributedTensor:
        """copy.deepcopy(t) (of a structure holding it): a copy made on its worker."""
        return self.copy()

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

    def view(self, *shape_or_dtype: Any) -> DistributedTensor:
        """NumPy's view(dtype): the same bytes read as `dtype` (the last axis resized), a
        view; torch's view(shape): reshape."""
        if not shape_or_dtype or (len(shape_or_dtype) == 1 and names_dtype(shape_or_dtype[0])):
            dtype = shape_or_dtype[0] if shape_or_dtype else self.dtype
            return _via(self)("view", self, as_dtype(dtype).str)
        return self.reshape(*shape_or_dtype)

    def flatten(self, order: str = "C") -> DistributedTensor:
        """A 1-D copy, its elements in `order` ("C" or "F", as NumPy's)."""
        return _via(self)("flatten", self, *(() if order == "C" else (order,)))

    def ravel(self, order: str = "C") -> DistributedTensor:
        """A 1-D view where NumPy can make one, else a copy; elements in `order` ("C", "F")."""
        return _via(self)("ravel", self, *(() if order == "C" else (order,)))

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

    def astype(self, dtype: DTypeLike, order: str = "K", casting: Any = "unsafe",
               subok: bool = True, copy: bool = True) -> DistributedTensor:
        """A copy converted to `dtype` (a NumPy dtype, its name, or a Python type), with
        NumPy's arguments: copy=False gives the tensor itself where nothing changes, a
        `casting` rule it breaks is NumPy's TypeError (order: the worker keeps C order)."""
        target = as_dtype(dtype)
        if casting != "unsafe" and not np.can_cast(self.dtype, target, casting):
            raise TypeError(f"astype: cannot cast array data from {self.dtype!r} to "
                            f"{target!r} according to the rule {casting!r}")
        if not copy and target == self.dtype:
            return self
        return _via(self)("astype", self, target.str)

    def clone(self, order: str = "K") -> DistributedTensor:
        """A copy on the same (node, device) (NumPy's `order` is its memory layout, which the
        worker keeps C: the values are the same)."""
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

    def conj(self) -> DistributedTensor:
        """The complex conjugate, on the worker; a real tensor is its own, so this returns
        it (as NumPy's and torch's conj() do: what writes the result writes the tensor)."""
        return _via(self)("conj", self) if self.dtype.kind == "c" else self

    conjugate = conj

    def trace(self, offset: int = 0, axis1: int = 0, axis2: int = 1) -> DistributedTensor:
        """The sum of the diagonal (see diagonal)."""
        return _via(self)("trace", self, offset, axis1, axis2)

    def __getitem__(self, index: Any) -> DistributedTensor:
        """t[index] as NumPy indexes (ints, slices, ..., None, int/bool tensors), on the worker."""
        result = _via(self)("getitem", self, index_arg(index))
        if is_element(index) and type(result._spec) is Spec and not result._spec.shape:
            result.__class__ = Element.of_dtype(result._spec.dtype)  # a scalar: `t[0] += 1`
            # rebinds
        return result

    def __setitem__(self, index: Any, value: Any) -> None:
        """t[index] = value (a scalar, a tensor in the same place, or a small array)."""
        _via(self)("setitem", self, index_arg(index), value)

    def __imatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """self @= other: the product written into this tensor (a view writes through), as
        NumPy's matmul(self, other, out=self)."""
        taken = methods.operator_arg(other)
        return taken if taken is NotImplemented else _via(self)("matmul", self, taken, out=self)

    def __divmod__(self, other: Any) -> tuple:
        """divmod(self, other): (floor quotient, remainder), np.divmod on the worker."""
        taken = methods.operator_arg(other)
        return taken if taken is NotImplemented else _via(self)("divmod", self, taken)

    def __rdivmod__(self, other: Any) -> tuple:
        """divmod(other, self), np.divmod on the worker."""
        taken = methods.operator_arg(other)
        return taken if taken is NotImplemented else _via(self)("divmod", taken, self)

    def __matmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """self @ other: the matrix product (np.matmul), on the tensor's worker."""
        taken = methods.operator_arg(other)
        return taken if taken is NotImplemented else _via(self)("matmul", self, taken)

    def __rmatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        """other @ self: the matrix product (np.matmul), on the tensor's worker."""
        taken = methods.operator_arg(other)
        return taken if taken is NotImplemented else _via(self)("matmul", taken, self)

    # -- NumPy protocols ------------------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, out: Any = None,
                        **kwargs: Any) -> Any:
        """NumPy ufuncs on tensors (np.exp(t), np.add(t, 1, out=t)) run on the worker."""
        return array_ufunc(ufunc, method, inputs, out, kwargs, call=_via(self))

    def __array_function__(self, func: Callable, types: Collection[type], args: tuple,
                           kwargs: dict) -> Any:
        """Other NumPy functions (np.linalg.inv(t), np.fft.fft(t), np.concatenate) on the
        worker that holds every tensor argument (see mwrt.master.arrayfunc); np.zeros(3,
        like=t) makes its array on the master and sends it to t's place."""
        return array_function(func, args, kwargs, like=self)

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
    vars().update({f"__i{py}__": methods.rebinding(op, call, mesh_call)
                   for py, op in methods.BINARY_OPERATORS.items()})

    def __imatmul__(self, other: DistributedTensor | ArrayLike) -> DistributedTensor:
        return _via(self)("matmul", self, operand(other))

    def __round__(self, ndigits: int | None = None) -> Any:
        """round(t[i]): a Python int as round() of a NumPy scalar gives (waits for the value),
        or with `ndigits` a 0-d tensor rounded on the worker."""
        return round(self.item()) if ndigits is None else self.round(ndigits)

    @property
    def flags(self) -> Flags:
        """NumPy's flags of a scalar: those of the 0-d array on its worker, read-only (a
        scalar is immutable); asks it (a wait)."""
        return super().flags.of_scalar()

    @classmethod
    def of_dtype(cls, dtype: Any) -> type[Handle]:
        """The element class of `dtype`'s kind (an integer, a real or a complex number)."""
        return _KINDS.get(dtype.kind, Element)


class IntegralElement(Element):
    """An element of an integer dtype: numbers.Integral, as NumPy's np.int64 is."""

    __slots__ = ()


class RealElement(Element):
    """An element of a floating dtype: numbers.Real, as NumPy's np.float64 is (so that
    scikit-learn takes `Ridge(alpha=t.std())`)."""

    __slots__ = ()


class ComplexElement(Element):
    """An element of a complex dtype: numbers.Complex, as NumPy's np.complex128 is."""

    __slots__ = ()


_KINDS: dict[str, type[Element]] = {"i": IntegralElement, "u": IntegralElement,
                                    "f": RealElement, "c": ComplexElement}

# An element stands for NumPy's scalar (np.float64, np.int64), which is a number:
# np.isscalar(t[0]) and np.testing.assert_equal(t.sum(), 6.0) take it as NumPy's, and each
# kind is registered where NumPy registers its scalar types (numbers.Real for np.floating).
numbers.Number.register(Element)
numbers.Integral.register(IntegralElement)
numbers.Real.register(RealElement)
numbers.Complex.register(ComplexElement)

ShardedTensor = DistributedTensor  # the name mesh tensors had: one class holds both
