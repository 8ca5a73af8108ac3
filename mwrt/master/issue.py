"""Issuing an op: the master's hot path, from a method call to one queued command.

call() converts the arguments (tensors to references for the wire, to Specs for the op's
meta rule), checks that every tensor operand lives in one place, makes the result
handles with the shapes the meta rule gives, orders the use against other streams
(ordering.py) and queues one `Call` on the node's batch. Nothing here waits.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..ops import UNKNOWN
from ..protocol import wire
from . import context, ordering
from .tensor import DistributedTensor

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
    if name in _ALIASING or kwargs:  # views share their base's record; out= is written
        outputs = _share(name, args, kwargs, outs)
        if outputs:
            for tensor in place:
                ordering.use(tensor, stream, now, tensor is written or any(
                    tensor is out for out in outputs))
            place = ()
    capturing = ordering.capture
    for tensor in place:  # a few comparisons each, unless another stream used the storage
        owner = tensor._base
        if owner is None:
            owner = tensor
        elif tensor._writer != stream:  # a view made on another stream: after its making
            ordering.use(tensor, stream, now, tensor is written)
            continue
        if owner._writer != stream or capturing or (
                tensor is written and len(owner._streams) > 1):
            ordering.use(tensor, stream, now, tensor is written)
        elif tensor is written:
            owner._wtime = owner._ltime = now
        else:
            owner._ltime = now
    node.issue(wire.Call(id=now, stream=stream, outs=tuple(t._id for t in outs),
                         op=name, args=wire_args, kwargs=wire_kwargs))
    if op.inplace:
        return None
    return outs[0] if type(result) is not tuple else tuple(outs)


_ALIASING = ordering.VIEWS | {"numpy"}


def _share(name: str, args: tuple, kwargs: dict, outs: list) -> tuple:
    """Results that may view an operand share its storage's record (see ordering.py), as
    results written into `out=` share the record of `out`; returns the `out=` tensors."""
    out = kwargs.get("out")
    written = tuple(t for t in (out if isinstance(out, (tuple, list)) else (out,))
                    if isinstance(t, DistributedTensor))
    if written:
        sources = written
    elif name == "numpy" and args[0] in ordering.EACH_PATHS:
        sources = args[2:]
    elif name == "numpy" and args[0] in ordering.VIEW_PATHS or name in ordering.VIEWS and (
            name != "getitem" or _basic(args[1])):
        first = next((a for a in args if isinstance(a, DistributedTensor)), None)
        sources = (first,) * len(outs)
    else:
        return ()
    for tensor, source in zip(outs, sources):
        if isinstance(source, DistributedTensor):
            ordering.share(tensor, source)
    return written


def _basic(index) -> bool:
    """True for NumPy's basic indexing (ints, slices, None, ...), which gives a view."""
    if isinstance(index, tuple):
        return all(_basic(i) for i in index)
    return index is None or index is Ellipsis or isinstance(index, (int, slice, np.integer))


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
    if getattr(value, "_sharded", False):
        from .mesh.rules import PlacementError

        raise PlacementError(f"{name}: a mesh tensor meets a tensor on one node; put that one "
                             "on the mesh too (mwrt.dist_send(t.numpy(), mesh=m)), or take "
                             "one of the mesh tensor's shards (t.shards()[i])")
    return value, value
