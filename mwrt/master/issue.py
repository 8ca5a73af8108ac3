"""Issuing an op: the master's hot path, from a method call to one queued command.

call() converts the arguments (tensors to references for the wire, to Specs for the op's
meta rule), checks that every tensor operand lives in one place, makes the result
handles with the shapes the meta rule gives, orders the use against other streams
(ordering.py) and queues one `Call` on the node's batch. Nothing here waits.

An `out=` tensor (of a ufunc, a reduction, any NumPy function) is written in place on the
worker, as NumPy writes it (where= leaves its other places as they were), and ordered as a
write. A value the wire cannot carry is refused here, before anything is queued: a batch
that cannot be encoded would fail every later command of the session.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from .. import ops
from ..arrays import ERROR_STATE, HOST
from ..ops import UNKNOWN
from ..protocol import wire
from . import context, ordering
from .batches import QUIET
from .handle import Handle, check_same_place
from .mesh.placement import PlacementError
from .methods import array_like

_SCALARS = (int, float, bool, complex)
_ID = attrgetter("_id")  # a handle's tensor id (in C: no generator per op)
_DEFAULT_FP = {"divide": "warn", "over": "warn", "under": "ignore", "invalid": "warn"}
# NumPy's error state object (arrays.ERROR_STATE): one read (60 ns) tells the default,
# where np.geterr() builds a dict (1-7 us). Another NumPy: np.geterr() on every op.
_FP_STATE = ERROR_STATE
# The default's own object, if NumPy is at its default now (mwrt may be imported inside an
# np.errstate): errstate and seterr make new ones, and leaving errstate restores this one.
_FP_READ = _FP_STATE.get if _FP_STATE is not None else np.geterr
_FP_DEFAULT = _FP_READ() if _FP_STATE is not None and np.geterr() == _DEFAULT_FP else None


def fp_state() -> dict | None:
    """NumPy's floating-point error state (np.geterr()) if not NumPy's default, else None:
    the worker runs the op under it."""
    if _FP_DEFAULT is not None:
        current = _FP_READ()
        if current is _FP_DEFAULT:
            return None
        last = _FP_LAST[0]  # (one read: another thread may replace it meanwhile)
        if current is last[0]:  # the same np.errstate block as the last op's
            return last[1]
    errors = np.geterr()
    state = None if errors == _DEFAULT_FP else dict(errors)
    if _FP_DEFAULT is not None:  # np.geterr() costs 3 us: once per errstate block, not per op
        _FP_LAST[0] = (current, state)  # (the object kept: its id names no other meanwhile)
    return state


_FP_LAST: list = [(None, None)]  # NumPy's last non-default error-state object, its state


def call(name: str, *args, **kwargs):
    """Issue registry op `name` where its tensor arguments live; returns the result handles."""
    if kwargs and kwargs.get("out") is not None:
        return _call_out(name, args, kwargs)
    op = ops.get(name)
    place: list = []
    spec_args, wire_args = _convert_args(args, place, name,
                                         name == "setitem" and _masked_assignment(name, args))
    spec_kwargs, wire_kwargs = _convert_kwargs(kwargs, place, name) if kwargs else ({}, {})
    if not place:
        raise TypeError(f"{name}: no DistributedTensor among the arguments")
    if name in ALIASING:
        copied = scalars_copied(args, call)
        if copied is not args:  # (a scalar's reshape(()) is a scalar: of the scalar's class)
            return as_scalars(name, args, kwargs, call(name, *copied, **kwargs))
    if ordering.unreplayed and not ordering.capture:
        ordering.refuse_unreplayed(place, name)
    first = place[0]
    node, device = first._node, first._device
    if ordering.capture and _pending((spec_args, spec_kwargs)):
        result = _pending_result(op, spec_args)
    else:
        result = ops.infer(op, spec_args, spec_kwargs)
    node.limits.check_result(name, result)
    stream = context.stream_for(node.index, device)
    written = args[0] if op.inplace else None
    made = _made_as(op, first, result, spec_args, spec_kwargs) if op.scalar else first.results
    outs = _outputs(made, node, device, stream, result)
    if made is not first.results:
        of_kinds(outs, made)
    now = next(node.ids)
    if outs and name in ALIASING:  # (in this order: x += 1 pays one test)
        _share(name, args, outs)  # a view shares its base's record
    ordering.order(place, stream, now, False, written)
    # (an empty batch first: in a stream of ops the batch is seldom empty, and never quiet)
    hold = (not node.batch and time.monotonic() - node.last_flush > QUIET
            and device == HOST and _fits_quick_path(place, outs, node.quick_elements))
    node.issue(wire.Call(id=now, stream=stream, outs=tuple(map(_ID, outs)),
                         op=name, args=wire_args, kwargs=wire_kwargs, fp=fp_state()), hold=hold)
    if op.inplace:
        return None
    return outs[0] if type(result) is not tuple else tuple(outs)


def _fits_quick_path(operands: list, results: list, limit: int) -> bool:
    """Whether an op's operands and results (in host memory, as the caller checked: all lie
    in one place) hold at most `limit` elements (MWRT_INLINE_OP_ELEMENTS): its worker runs
    it on the socket thread, in microseconds."""
    total = 0
    for tensor in (*operands, *results):
        spec = tensor._spec
        if type(spec) is not ops.Spec:
            return False
        total += math.prod(spec.shape)
    return total <= limit


def create(cls: type, kind: str, shape: tuple, dtype: np.dtype, node, device: int,
           args: tuple = ()):
    """A new tensor (a handle of class `cls`) of `shape` on (node, device), made by
    constructor `kind` (empty, zeros, rand, ...) with `args`."""
    stream = context.stream_for(node.index, device)
    tensor = cls(node, device, next(node.ids), ops.Spec(shape, dtype), stream)
    node.issue(wire.Create(id=next(node.ids), stream=stream, out=tensor._id, kind=kind,
                           shape=shape, dtype=dtype.str, device=device, args=tuple(args)))
    return tensor


ALIASING = ordering.VIEWS | {"numpy"}


def _share(name: str, args: tuple, outs: list) -> None:
    """Results that may view an operand share its storage's record (see ordering.py)."""
    sources: Sequence
    if name == "numpy" and args[0] in ordering.EACH_PATHS:
        sources = args[2:]
    elif (name == "numpy" and args[0] in ordering.VIEW_PATHS) or (name in ordering.VIEWS and (
            name != "getitem" or _basic(args[1]))):
        tensors = [a for a in args if isinstance(a, Handle)]
        if name == "numpy" and args[0] == "einsum" and len(tensors) > 1:
            return  # a product of several: a new array (one operand's may view it)
        sources = tensors[:1] * len(outs)
    else:
        return
    for tensor, source in zip(outs, sources):
        if isinstance(source, Handle):
            ordering.share(tensor, source)


def _basic(index) -> bool:
    """True for NumPy's basic indexing (ints, slices, None, ...), which gives a view."""
    if isinstance(index, tuple):
        return all(_basic(i) for i in index)
    return index is None or index is Ellipsis or isinstance(index, (int, slice, np.integer))


def _call_out(name: str, args: tuple, kwargs: dict):
    """`name` with out= tensors: NumPy writes the result into them on the worker (where=
    keeps their other places); returns `out` as given, as NumPy does."""
    out = kwargs["out"]
    targets = out if isinstance(out, tuple) else (out,)
    if not all(isinstance(t, Handle) and t._mesh is None for t in targets):
        got = ", ".join(type(t).__name__ for t in targets)
        raise TypeError(f"{name}: out= must be DistributedTensors in the operands' place (got "
                        f"{got}); write to a NumPy array with out=t.numpy() after the op")
    op = ops.get(name)
    place: list = []
    spec_args, wire_args = _convert_args(args, place, name)
    rest = {k: v for k, v in kwargs.items() if k != "out"}
    spec_kwargs, wire_kwargs = convert(rest, place, name)
    out_specs = [convert(target, place, name)[0] for target in targets]  # in the same place
    if ordering.capture and _pending((spec_args, spec_kwargs, tuple(out_specs))):
        result = UNKNOWN  # a shape known on replay: NumPy checks out= on the worker
    else:
        result = ops.infer(op, spec_args, spec_kwargs)
    _check_out(name, result, out_specs, op.by_type, kwargs.get("casting", "same_kind"))
    node, device = place[0]._node, place[0]._device
    stream = context.stream_for(node.index, device)
    now = next(node.ids)
    for tensor in place:  # out= is a write, ordered as the in-place ops' target is
        ordering.use(tensor, stream, now, any(tensor is t for t in targets))
    wire_kwargs["out"] = tuple(t._ref for t in targets) if isinstance(out, tuple) else out._ref
    node.issue(wire.Call(id=now, stream=stream, outs=(), op=name, args=wire_args,
                         kwargs=wire_kwargs, fp=fp_state()))
    return out


def _check_out(name: str, result, targets: list, ufunc: bool, casting: str) -> None:
    """NumPy's rule for out=: a ufunc's result broadcasts to out's shape and casts to its dtype
    (`casting`); any other function's has out's shape."""
    specs = result if type(result) is tuple else (result,)
    if result is UNKNOWN or any(s is UNKNOWN for s in specs):
        return  # shape known on the worker only: NumPy checks it there
    if len(specs) != len(targets):
        raise ValueError(f"{name}: out= needs {len(specs)} tensors (got {len(targets)})")
    for i, (spec, target) in enumerate(zip(specs, targets)):  # target: out's Spec
        shape = target.shape
        fits = (spec.shape == shape if not ufunc else
                len(spec.shape) <= len(shape) and all(
                    a in (1, b) for a, b in zip(spec.shape[::-1], shape[::-1])))
        if not fits:
            raise ValueError(f"{name}: out= has the wrong shape (got {shape}, expected "
                             f"{spec.shape})")
        # casting= is the user's str, checked by NumPy (which names a wrong one).
        if ufunc and not np.can_cast(spec.dtype, target.dtype,
                                     casting=casting):  # type: ignore[arg-type]
            raise ops.OutputCastingError(
                f"{name}: cannot cast the result to out='s dtype (got {spec.dtype}, expected a "
                f"dtype {spec.dtype} casts to with casting={casting!r}); pass casting='unsafe' "
                "to NumPy's rule, or an out of another dtype", getattr(np, name), casting,
                spec.dtype, target.dtype, i)


def _spec_of(tensor):
    """A tensor's Spec; inside a graph capture, UNKNOWN for one whose shape depends on data
    (a mask's result): asking the worker would wait, and its uses' shapes follow on replay."""
    if tensor._spec is None and ordering.capture:
        return UNKNOWN
    return tensor.spec


def _pending(value) -> bool:
    """True if `value` (converted arguments) holds a Spec not known until a replay."""
    if value is UNKNOWN:
        return True
    if type(value) is tuple:
        return any(_pending(v) for v in value)
    if type(value) is dict:
        return any(_pending(v) for v in value.values())
    return False


def _pending_result(op, spec_args):
    """A captured op's results when an operand's shape is known only on replay: left to the
    worker (one per output: a ufunc's nout, else one)."""
    ufunc = getattr(np, op.name, None)
    nout = ufunc.nout if isinstance(ufunc, np.ufunc) else 1
    if op.inplace:
        return None
    return UNKNOWN if nout == 1 else (UNKNOWN,) * nout


def _outputs(cls, node, device, stream, result) -> list:
    """The handles (of class `cls`) of an op's results."""
    if result is None:
        return []
    specs = result if type(result) is tuple else (result,)
    return [cls(node, device, next(node.ids), None if s is UNKNOWN else s, stream)
            for s in specs]


def scalars_copied(args: tuple, issue) -> tuple:
    """`args` with each scalar (an element: NumPy's is immutable) replaced by a copy made
    with `issue` (call, or the mesh's), as what views a scalar views a copy in NumPy
    (np.expand_dims(a0 + a0, 0)); `args` itself if none is."""
    scalars = [is_scalar(a) for a in args]
    if not any(scalars):
        return args
    return tuple(_array(issue("copy", a)) if scalar else a for a, scalar in zip(args, scalars))


def is_scalar(value: Any) -> bool:
    """Whether `value` is a handle of an element class (NumPy's scalars)."""
    scalars = getattr(value, "scalars", None)
    return scalars is not None and isinstance(value, scalars)


def _array(copy):
    """A scalar's copy as an array (a scalar's copy() is a scalar), which a view may share."""
    copy.__class__ = copy.results
    return copy


def _made_as(op, first, result, args: tuple, kwargs: dict) -> type:
    """The class of the handles of an op's `result` (Specs) on `first`'s place: its element
    class where NumPy gives scalars (0-d results of a scalar op, ops.Op.scalar)."""
    if first.scalars is not None and _zero_d(result) and (
            ops.gives_scalars(op, args, kwargs)
            or (op.scalar is ops.KEEPS and isinstance(first, first.scalars))):
        return first.scalars
    return first.results


def as_scalars(name: str, args: tuple, kwargs: dict, result):
    """`result` (handles made by op `name` of `args`, on a mesh or of a scalar's copy) of the
    class call would make them of on one place (_made_as)."""
    op = ops.get(name)
    if not op.scalar or result is None:
        return result
    results = result if type(result) is tuple else (result,)
    specs = tuple([r._spec for r in results])
    if _zero_d(specs):
        first = next((a for a in args if isinstance(a, Handle)), results[0])
        made = _made_as(op, first, specs, *_specs_of(args, kwargs))
        of_kinds(results, made)
    return result


def of_kinds(handles, cls: type[Handle]) -> None:
    """Make `handles` (0-d) of class `cls`, or of its class for each one's dtype (an element
    class: one per kind, as NumPy's scalar types are numbers.Integral, Real or Complex)."""
    for handle in handles:
        handle.__class__ = cls.of_dtype(handle._spec.dtype)


def _specs_of(args: tuple, kwargs: dict) -> tuple:
    """`args` and `kwargs` with each tensor as its Spec."""
    def spec(value):
        return value.spec if isinstance(value, Handle) else value
    return tuple(map(spec, args)), {k: spec(v) for k, v in kwargs.items()}


def _zero_d(result) -> bool:
    """Whether an op's results (Specs, or a tuple of them) are all 0-d."""
    if type(result) is not tuple:  # (one result, nearly always: no generator)
        return type(result) is ops.Spec and not result.shape
    return all(type(s) is ops.Spec and not s.shape for s in result)


def _masked_assignment(name: str, args: tuple) -> bool:
    """True for t[mask] = value: its meta rule reads neither the value's shape nor dtype
    (the mask's count decides the shape), so a value whose shape depends on data (t[m] =
    u[m], as scikit-learn writes) is not asked for it, a round trip saved; a value of the
    wrong length fails on the worker, raised at the next wait as a RemoteError."""
    if name != "setitem" or len(args) != 3:
        return False
    index = args[1]
    return any(isinstance(i, Handle) and i._spec is not None and i._spec.dtype == np.bool_
               for i in (index if type(index) is tuple else (index,)))


def _convert_args(args: tuple, place: list, name: str, lazy: bool = False):
    """_convert over positional args, with tensors and scalars (nearly every arg) inline;
    `lazy`: a tensor whose shape depends on data stays UNKNOWN, not asked of its worker."""
    specs, wires = [], []
    for value in args:
        if type(value) in _SCALARS:
            specs.append(value)
            wires.append(value)
        elif isinstance(value, Handle) and value._mesh is None and not value.holds_torch and (
                not place or (place[0]._node is value._node and
                              place[0]._device == value._device)):
            place.append(value)
            specs.append(value._spec or (UNKNOWN if lazy else _spec_of(value)))
            wires.append(value._ref)
        else:
            spec, wired = convert(value, place, name)
            specs.append(spec)
            wires.append(wired)
    return tuple(specs), tuple(wires)


def _convert_kwargs(kwargs: dict, place: list, name: str) -> tuple[dict, dict]:
    """convert() of an op's keywords: as they are where all are plain (axis=0, keepdims)."""
    for value in kwargs.values():
        if type(value) not in _SCALARS and value is not None:
            return convert(kwargs, place, name)
    return kwargs, kwargs


def convert(value, place: list, name: str, specs: bool = True):
    """(value with tensors as Specs, value with tensors as Refs); checks one (node, device).
    specs=False: the Specs are not wanted (a remote() function's arguments), so a tensor
    whose shape is still pending is not waited for (its Spec stays None)."""
    if type(value) in _SCALARS:
        return value, value
    if isinstance(value, Handle):
        if value.holds_torch and name != "remote":  # remote(fn) takes any kind
            raise TypeError(f"{name}: a torch tensor meets a NumPy op; use torch's functions "
                            "on it (torch.exp(t)), or move between kinds explicitly: "
                            "mwrt.dist_send(t.numpy(), node=...)")
        if value._mesh is not None:
            raise PlacementError(f"{name}: a mesh tensor meets a tensor on one node; put that "
                                 "one on the mesh too (mwrt.dist_send(t.numpy(), mesh=m)), or "
                                 "take one of the mesh tensor's shards (t.shards()[i])")
        if place:
            check_same_place(place[0], value, f"{name}: operands",
                             "move one with .to(node=, device=) first")
        place.append(value)
        return (_spec_of(value) if specs else None), value._ref
    if isinstance(value, (tuple, list)):
        pairs = [convert(v, place, name, specs) for v in value]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    if isinstance(value, dict):
        named = {k: convert(v, place, name, specs) for k, v in value.items()}
        return {k: p[0] for k, p in named.items()}, {k: p[1] for k, p in named.items()}
    if isinstance(value, _PASSED):
        if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "OV":
            raise TypeError(f"{name}: arrays of {value.dtype} cannot be sent to a worker; "
                            "send arrays of numbers")
        return value, value
    if isinstance(value, (np.dtype, type)):
        return _dtype(value, name)
    array = array_like(value)
    if array is not None:  # range(3), an object with __array__: as NumPy would take it
        return array, array
    raise TypeError(f"{name}: a value of type {type(value).__name__} cannot be sent to a worker "
                    f"(got {value!r:.60}, expected numbers, strings, arrays, tensors or dtypes)")


# What the wire carries as it is (tensors, tuples and dicts are converted above).
_PASSED = (str, bytes, type(None), slice, type(Ellipsis), np.ndarray, np.generic)


def _dtype(value, name: str):
    """A dtype argument (np.float32, float, "f4", np.dtype) as the wire carries it."""
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind in "OV":
        raise TypeError(f"{name}: {value!r:.60} is not a dtype NumPy computes with; pass a "
                        "NumPy dtype (np.float64) or a Python number type (float)")
    return dtype.str, dtype.str
