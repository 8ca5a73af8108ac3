"""DistributedTensor: the master's handle to an array that lives on a worker.

Every op returns at once: the master computes the result's shape and dtype with the
op's meta rule, names the result with a fresh id, and queues one command. Only copies
to the master (`numpy()`, `item()`, `float()`…) wait for the worker.
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..arrays import HOST, as_dtype
from ..ops import UNKNOWN, Spec
from ..ops.elementwise import BINARY_OPERATORS, COMPARISONS, UNARY_OPERATORS
from ..protocol import wire
from . import context, ordering

# ufunc.reduce -> the reduction with the same meaning
_UFUNC_REDUCE = {"add": "sum", "multiply": "prod", "minimum": "min", "maximum": "max",
                 "logical_and": "all", "logical_or": "any"}


class DistributedTensor:
    """A handle to an array on (node, device); dropping the last handle frees it."""

    # _writer: the stream that last wrote it, at command id _wtime; _streams: every stream that
    # used it (its free waits for them all); _ltime: its last use (see ordering.py).
    __slots__ = ("_node", "_device", "_id", "_spec", "_streams", "_writer", "_wtime", "_ltime",
                 "_ref", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, node, device: int, tensor_id: int, spec, stream: int):
        self._node, self._device, self._id = node, device, tensor_id
        self._spec, self._streams = spec, (stream,)
        self._writer, self._wtime = stream, tensor_id
        self._ltime = tensor_id  # below its command's id, above every earlier command's
        self._ref = wire.ref(tensor_id)  # pre-encoded, so messages carry it at no cost
        if ordering.capture:
            ordering.capture[-1].made(self)

    def __reduce__(self):
        raise TypeError("DistributedTensor: a handle cannot be pickled, nor captured by a "
                        "function shipped with mwrt.remote; pass the tensor as an argument "
                        "(remote(fn)(t)), or its value (t.numpy())")

    def __del__(self):
        try:
            self._node.release(self._id, self._streams)
        except Exception:  # interpreter shutdown: nothing left to free
            pass

    # -- what the master knows without asking ---------------------------------------------

    def get_node(self) -> int:
        return self._node.index

    def get_device(self) -> int:
        return self._device

    @property
    def spec(self) -> Spec:
        """Shape and dtype; asks the worker once if they depend on data (masks, remote())."""
        if self._spec is None:
            node = self._node
            meta = wire.Meta(id=next(node.ids), stream=self._writer, ref=self._id,
                             token=next(node.tokens))
            reply, _ = node.request(meta, f"shape of tensor {self._id}")
            self._spec = Spec(tuple(reply.value["shape"]), np.dtype(reply.value["dtype"]))
        return self._spec

    shape = property(lambda self: self.spec.shape)
    dtype = property(lambda self: self.spec.dtype)
    ndim = property(lambda self: len(self.spec.shape))
    size = property(lambda self: math.prod(self.spec.shape))  # exact, and 10x np.prod's speed
    nbytes = property(lambda self: self.size * self.spec.dtype.itemsize)
    itemsize = property(lambda self: self.spec.dtype.itemsize)
    T = property(lambda self: self.transpose())
    is_cuda = property(lambda self: self._device != HOST)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        spec = "shape and dtype pending" if self._spec is None else \
            f"shape={self._spec.shape}, dtype={self._spec.dtype}"
        return (f"DistributedTensor({spec}, node={self._node.index}, device={self._device}, "
                f"id={self._id})")

    __hash__ = object.__hash__

    # -- copies to the master (sync points) -----------------------------------------------

    def numpy(self) -> np.ndarray:
        """Copy to the master as a NumPy array; waits for the stream that last wrote it."""
        from .transfer import fetch

        return fetch(self)

    get = numpy

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def item(self):
        """The single element as a Python scalar."""
        if self.size != 1:
            raise ValueError(f"item: tensor has {self.size} elements (expected exactly 1)")
        return self.numpy().item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if not np.issubdtype(self.dtype, np.integer):
            raise TypeError(f"__index__: only integer tensors can be indices (got {self.dtype})")
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # -- moves ----------------------------------------------------------------------------

    def to(self, node: int | None = None, device: int | None = None) -> "DistributedTensor":
        """This tensor on (node, device): a copy made worker-side, or self if already there."""
        from .transfer import move

        return move(self, self._node.index if node is None else node,
                    self._device if device is None else device)

    def dist_send(self, node: int | None = None, device: int | None = None):
        """Copy to another node (worker to worker); the device stays unless given."""
        return self.to(node=node, device=device)

    def cpu(self) -> "DistributedTensor":
        return self.to(device=HOST)

    def cuda(self, device: int | None = None) -> "DistributedTensor":
        """On a GPU of the same node: `device`, or the current device if it is a GPU, else 0."""
        if device is None:
            device = self._device if self._device != HOST else max(context.current_device(), 0)
        return self.to(device=device)

    def record_stream(self, stream) -> None:
        """Keep the memory until `stream` has run what was issued so far (CUDA's rule; safe
        streams do this for every stream that used the tensor, so it is needed only for
        uses the master cannot see, such as a remote() function's side effects)."""
        if stream.id not in self._streams:
            self._streams = self._streams + (stream.id,)

    # -- shapes, copies, fills ------------------------------------------------------------

    def reshape(self, *shape):
        return call("reshape", self, _shape_arg(shape))

    view = reshape

    def flatten(self):
        return call("flatten", self)

    def ravel(self):
        return call("ravel", self)

    def transpose(self, *axes):
        return call("transpose", self, *((_shape_arg(axes),) if axes else ()))

    def permute(self, *axes):
        return call("transpose", self, _shape_arg(axes))

    def squeeze(self, axis=None):
        return call("squeeze", self, **({} if axis is None else {"axis": axis}))

    def expand_dims(self, axis):
        return call("expand_dims", self, axis)

    unsqueeze = expand_dims

    def swapaxes(self, a, b):
        return call("swapaxes", self, a, b)

    def astype(self, dtype):
        return call("astype", self, as_dtype(dtype).str)

    def float(self):
        return self.astype(np.float32)

    def double(self):
        return self.astype(np.float64)

    def long(self):
        return self.astype(np.int64)

    def int(self):
        return self.astype(np.int32)

    def clone(self):
        return call("copy", self)

    copy = clone

    def copy_(self, src):
        call("copy_", self, src)
        return self

    def fill_(self, value):
        call("fill_", self, value)
        return self

    def zero_(self):
        return self.fill_(0)

    def clip(self, a_min=None, a_max=None):
        return call("clip", self, a_min, a_max)

    clamp = clip

    def __getitem__(self, index):
        return call("getitem", self, _index_arg(index))

    def __setitem__(self, index, value):
        call("setitem", self, _index_arg(index), value)

    def __matmul__(self, other):
        return call("matmul", self, other)

    def __rmatmul__(self, other):
        return call("matmul", other, self)

    def matmul(self, other):
        """Matrix product with `other` (self @ other), as torch's and NumPy's."""
        return call("matmul", self, other)

    # -- NumPy protocols ------------------------------------------------------------------

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        name = ufunc.__name__
        if method == "reduce" and name in _UFUNC_REDUCE and out is None:
            kwargs.setdefault("axis", 0)  # ufunc.reduce's default, unlike sum()'s
            return call(_UFUNC_REDUCE[name], *inputs, **kwargs)
        if method != "__call__":
            return NotImplemented
        if out is None:
            return call(name, *inputs, **kwargs)
        target = out[0] if isinstance(out, tuple) else out
        if len(inputs) and target is inputs[0] and ops.has(f"{name}_"):
            call(f"{name}_", *inputs, **kwargs)
        else:
            target.copy_(call(name, *inputs, **kwargs))
        return target

    def __array_function__(self, func, types, args, kwargs):
        name = func.__name__
        if not ops.has(name):
            return NotImplemented
        return call(name, *args, **kwargs)


def _shape_arg(shape):
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape


def _index_arg(index):
    """Lists in an index become arrays (the wire carries lists as tuples)."""
    if isinstance(index, list):
        return np.asarray(index)
    if isinstance(index, tuple):
        return tuple(np.asarray(i) if isinstance(i, list) else i for i in index)
    return index


def _reduction(name):
    def method(self, axis=None, keepdims=False, **kwargs):
        if keepdims:
            kwargs["keepdims"] = True
        return call(name, self, **({} if axis is None else {"axis": axis}), **kwargs)
    method.__name__ = name
    return method


def _binary(name):
    def forward(self, other):
        return call(name, self, other)

    def reverse(self, other):
        return call(name, other, self)

    def inplace(self, other):
        call(name + "_", self, other)
        return self
    return forward, reverse, inplace


def _unary(name):
    return lambda self: call(name, self)


for _py, _uf in BINARY_OPERATORS.items():
    _f, _r, _i = _binary(_uf)
    setattr(DistributedTensor, f"__{_py}__", _f)
    setattr(DistributedTensor, f"__r{_py}__", _r)
    setattr(DistributedTensor, f"__i{_py}__", _i)
    setattr(DistributedTensor, f"{_uf}_", _i)
for _py, _uf in COMPARISONS.items():
    setattr(DistributedTensor, f"__{_py}__", _binary(_uf)[0])
for _py, _uf in UNARY_OPERATORS.items():
    setattr(DistributedTensor, f"__{_py}__", _unary(_uf))
for _name in ["sum", "mean", "prod", "min", "max", "argmin", "argmax", "std", "var", "any",
              "all", "cumsum", "cumprod"]:
    setattr(DistributedTensor, _name, _reduction(_name))
for _name in ["exp", "log", "sqrt", "sin", "cos", "tanh", "abs", "sign", "floor", "ceil"]:
    setattr(DistributedTensor, _name, _unary(_name if _name != "abs" else "absolute"))
DistributedTensor.add_ = DistributedTensor.__iadd__
DistributedTensor.mul_ = DistributedTensor.__imul__
DistributedTensor.sub_ = DistributedTensor.__isub__
DistributedTensor.div_ = DistributedTensor.__itruediv__


# -- issuing an op ------------------------------------------------------------------------

_SCALARS = (int, float, bool, complex)


def call(name: str, *args, **kwargs):
    """Issue registry op `name` where its tensor arguments live; returns the result handles."""
    op = ops.get(name)
    place: list = []
    spec_args, wire_args = _convert_args(args, place, name)
    spec_kwargs, wire_kwargs = _convert(kwargs, place, name) if kwargs else ({}, {})
    if not place:
        raise TypeError(f"{name}: no DistributedTensor among the arguments")
    node, device = place[0]._node, place[0]._device
    result = ops.infer(op, spec_args, spec_kwargs)
    node.limits.check_result(name, result)
    stream = context.stream_for(node.index, device)
    written = args[0] if op.inplace else None
    outs = _outputs(node, device, stream, result)
    now = next(node.ids)
    capturing = ordering.capture
    for tensor in place:  # a few comparisons each, unless another stream used the tensor
        if tensor._writer != stream or capturing or (
                tensor is written and len(tensor._streams) > 1):
            ordering.use(tensor, stream, now, tensor is written)
        elif tensor is written:
            tensor._wtime = tensor._ltime = now
        else:
            tensor._ltime = now
    node.issue(wire.Call(id=now, stream=stream, outs=tuple(t._id for t in outs),
                         op=name, args=wire_args, kwargs=wire_kwargs))
    if op.inplace:
        return None
    return outs[0] if type(result) is not tuple else tuple(outs)


def _outputs(node, device, stream, result) -> list:
    if result is None:
        return []
    specs = result if type(result) is tuple else (result,)
    return [DistributedTensor(node, device, next(node.ids), None if s is UNKNOWN else s, stream)
            for s in specs]


def _convert_args(args: tuple, place: list, name: str):
    """_convert over positional args, with tensors and scalars (nearly every arg) inline."""
    specs, wires = [], []
    for value in args:
        if type(value) is DistributedTensor and (not place or (
                place[0]._node is value._node and place[0]._device == value._device)):
            place.append(value)
            specs.append(value._spec or value.spec)
            wires.append(value._ref)
        elif type(value) in _SCALARS:
            specs.append(value)
            wires.append(value)
        else:
            spec, wired = _convert(value, place, name)
            specs.append(spec)
            wires.append(wired)
    return tuple(specs), tuple(wires)


def _convert(value, place: list, name: str):
    """(value with tensors as Specs, value with tensors as Refs); checks one (node, device)."""
    if type(value) in _SCALARS:
        return value, value
    if isinstance(value, DistributedTensor):
        if place and (place[0]._node is not value._node or place[0]._device != value._device):
            first = place[0]
            raise ValueError(
                f"{name}: operands live in different places (node {first._node.index} "
                f"device {first._device} and node {value._node.index} device "
                f"{value._device}); move one with .to(node=, device=) first")
        place.append(value)
        return value.spec, value._ref
    if isinstance(value, (tuple, list)):
        pairs = [_convert(v, place, name) for v in value]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    if isinstance(value, dict):
        pairs = {k: _convert(v, place, name) for k, v in value.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).str, np.dtype(value).str
    return value, value
