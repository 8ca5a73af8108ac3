"""Issuing torch's functions on torch handles, and moving torch tensors.

torch_call() is the torch handle's hot path, as issue.call() is the NumPy handle's: it
converts the arguments (handles to TorchSpecs for the meta rule and to Refs for the wire,
torch's dtypes to their names), checks that every handle lives in one place, asks
mwrt.ops.torchmeta.infer what the call makes (torch's meta device, remembered per input
metadata), makes the result handles (a result that is an input is that handle; one that may
view an input shares its ordering record), orders the uses and queues one `torch` Call.
A call whose arguments are torch handles and plain scalars (nearly every op of a training
step) skips the conversion: one dict lookup by their metadata finds what it makes. Nothing
here waits. Results are of their operands' class (Handle.results), or of the class
a constructor names.
"""

from __future__ import annotations

import itertools
import time
import weakref
from typing import Any

import numpy as np

from .. import config
from ..arrays import HOST
from ..ops import Spec, torchmeta, torchspec
from ..ops.torchspec import TorchSpec
from ..protocol import wire
from . import context, ordering, torchgrad, transfer
from .handle import Handle, check_same_place

_NAMES: dict = {}  # torch function -> its qualified name, once checked
_STARTED: dict = {}  # id of a node sent a torch command -> a weak reference to it
_SCALARS = (int, float, bool, complex, str, type(None))
_torch: Any = None  # the torch module, once a torch handle was made


class Crossing(Exception):
    """Raised, before anything is issued, by a backward whose graph reaches tensors moved
    from other nodes: it runs as walks on each node (mwrt.master.torchacross)."""


class OnMesh(Exception):
    """Raised by the conversion of a call's arguments when one is a mesh tensor: the call
    goes to mwrt.master.torchmesh instead (the one-place path pays nothing for it)."""


def ready() -> Any:
    """torch, imported the first time a torch handle is made."""
    global _torch
    if _torch is None:
        _torch = torchspec.torch_module()
    return _torch


def torch_call(func, args: tuple, kwargs: dict, node=None, device: Any = None,
               results: type | None = None):
    """Issue torch's `func` where its torch handles live (or on (node, device), handles of
    class `results`, for a constructor); returns what torch would, with handles for its
    tensors."""
    name = _NAMES.get(func) or _name(func)
    return run(name, func, args, kwargs, "torch", (name,), node=node, device=device,
               results=results)


def run(name: str, func, args: tuple, kwargs: dict, op: str, prefix: tuple, *, key=None,
        node=None, device: Any = None, uses: tuple = (), results: type | None = None):
    """Issue `op` with arguments (*prefix, grad mode, *args) and `kwargs`, its results as
    `func` makes them on the meta device (remembered by `key`, else by `name`); `uses`:
    (handle, written) pairs it also uses (a module's, an optimizer's parameters)."""
    grad = _torch.is_grad_enabled()
    flat = None if key is not None or uses else _flat(args, kwargs)
    known = None if flat is None else _KNOWN.get((name, grad, flat[3]))
    if known is not None:
        place, wargs, wkwargs = flat[0], flat[1], flat[2]  # type: ignore[index]
        outcome, records = known
    else:
        place, wargs, wkwargs, outcome = _inferred(name, func, grad, args, kwargs, key, uses)
        records = bool(uses) or any(s.requires_grad for s, _, _ in outcome.outs) or any(
            getattr(t._spec, "requires_grad", False) for t in place)
        if flat is not None:
            if len(_KNOWN) > 100_000:
                _KNOWN.clear()
            _KNOWN[(name, grad, flat[3])] = (outcome, records)
    outs, written, respec, tree, value = outcome
    if value is not None and not written:
        return value  # metadata alone (a.size(), a.dim()): nothing to run
    first = place[0] if place else uses[0][0] if uses else None
    if first is not None:
        node, results = first._node, results or first.results
        device = first._device if device is None else device
    stream = context.stream_for(node.index, device)
    made, fresh = _results(outs, place, node, device, stream, results, name)
    for index, spec in respec:
        old, place[index]._spec = place[index]._spec, spec
        torchgrad.respecified(place[index], old)
    inputs = place
    if uses:
        written = (*written, *(len(place) + i for i, (_, w) in enumerate(uses) if w))
        inputs = [*place, *(u[0] for u in uses)]
    elif op in _WRITES_PARAMS:  # a bucket's parts copied back into the gradients
        written = tuple(range(1, len(place)))
    if grad and records:
        torchgrad.record(inputs, made, outs, outcome.written)
    for index in outcome.written:  # torch's version counter moved (on the meta device)
        torchgrad.written(place[index])
    filled: list = []  # a backward writes the .grad of the tensors it fills: ordered so
    if name in _AUTOGRAD and _crosses(name, args, kwargs, filled):
        raise Crossing(name)
    if filled:
        written = (*written, *range(len(inputs), len(inputs) + len(filled)))
        inputs = [*inputs, *filled]
    _issue(node, stream, inputs, written, op, (*prefix, grad, *wargs), wkwargs, fresh)
    if torchmeta.asks(outcome):  # shapes that depend on the values: one round trip
        _ask_shapes(made, outs)
    if tree is None:
        return made[0] if made else None
    return torchmeta.unflatten(tree, iter(made))


def _ask_shapes(made: list, outs: tuple) -> None:
    """Give the results whose shapes depend on the values (a mask's index, nonzero, unique)
    their worker's metadata, as a NumPy handle's mask result brings its shape: asked at
    once, so every handle a torch call returns has a known shape (a failed call raises its
    RemoteError here, at its line)."""
    for handle, (spec, _, _) in zip(made, outs):
        if spec.shape is None:
            handle._spec = transfer.asked_spec(handle)


# (name, grad mode, _flat's key) -> (Outcome, whether autograd's graph may need a record)
_KNOWN: dict = {}
_GRAD_GET = "torch.Tensor.grad.__get__"
# Ops that write the gradients of every tensor argument after the first (the bucket): the
# gradient shares its parameter's ordering record (see _results).
_WRITES_PARAMS = frozenset(("torch_grads_set",))


def _inferred(name: str, func, grad: bool, args: tuple, kwargs: dict, key, uses: tuple):
    """(torch handles used, wire args, wire kwargs, Outcome), by the general conversion."""
    place: list = []
    try:
        sargs, wargs, kargs = _convert(args, place, name)
        skwargs, wkwargs, kkwargs = _convert(kwargs, place, name) if kwargs else ({}, {}, ())
    except _Unplaced as exc:  # a local tensor came before any handle: send it to the first
        place = [_first((args, kwargs, *(u[0] for u in uses)), exc.args[0])]
        sargs, wargs, kargs = _convert(args, place, name)
        skwargs, wkwargs, kkwargs = _convert(kwargs, place, name) if kwargs else ({}, {}, ())
        del place[0]
    key = None if kargs is None or kkwargs is None else (key or name, grad, kargs, kkwargs)
    return place, wargs, wkwargs, torchmeta.infer(name, func, grad, sargs, skwargs, key,
                                                  ask=True)


def _results(outs: tuple, place: list, node, device, stream: int, results, name: str):
    """(the handles of a call's tensors, the ids of the new ones): an input a result is, or a
    new handle, sharing the ordering record of the input it may view; a gradient shares its
    tensor's, as commands that name the tensor write it (a mesh optimizer's bucket)."""
    made, fresh = [], []
    for spec, same, view in outs:
        if same >= 0:
            made.append(place[same])
            continue
        result = results(node, device, next(node.ids), spec, stream)
        if view >= 0:
            ordering.share(result, place[view])
            torchgrad.viewed(result)
        elif name == _GRAD_GET:
            ordering.share(result, place[0])
        made.append(result)
        fresh.append(result._id)
    return made, tuple(fresh)


def _flat(args: tuple, kwargs: dict):
    """(torch handles used, wire args, wire kwargs, a key of their metadata) for a call whose
    arguments are torch handles in one place and plain scalars (nearly every op); None for
    any other, which the general conversion takes."""
    place: list = []
    wargs: list = []
    key: list = []
    for value in args:
        kind = type(value)
        if kind in _PLAIN:
            wargs.append(value)
            key.append(kind)
            key.append(value)
        elif _is_handle(kind, value, place):
            place.append(value)
            wargs.append(value._ref)
            key.append(value._spec)
        else:
            return None
    wkwargs = {}
    for word, value in kwargs.items():
        kind = type(value)
        if kind in _PLAIN:
            wkwargs[word] = value
            key.append(word)
            key.append(kind)
            key.append(value)
        elif _is_handle(kind, value, place):
            place.append(value)
            wkwargs[word] = value._ref
            key.append(word)
            key.append(value._spec)
        else:
            return None
    return place, tuple(wargs), wkwargs, tuple(key)


_PLAIN = frozenset((int, float, bool, complex, str, type(None)))
_HANDLES: dict = {}  # class -> whether it is a torch handle's


def _is_handle(kind: type, value, place: list) -> bool:
    """Whether `value` is a torch handle on one place, where `place`'s first one lives."""
    torch_handle = _HANDLES.get(kind)
    if torch_handle is None:
        torch_handle = _HANDLES[kind] = issubclass(kind, Handle) and kind.holds_torch
    if not torch_handle or value._mesh is not None:
        return False
    return not place or (place[0]._node is value._node and place[0]._device == value._device)


_BACKWARDS = frozenset(("torch.Tensor.backward", "torch.autograd.backward"))
_AUTOGRAD = _BACKWARDS | {"torch.autograd.grad"}


def _crosses(name: str, args: tuple, kwargs: dict, filled: list) -> bool:
    """Whether a backward (which marks the leaves it fills) or autograd.grad reaches
    tensors moved from other nodes."""
    if name == "torch.autograd.grad":
        roots = args[0] if args else kwargs.get("outputs")
        return bool(torchgrad.reach(list(roots) if isinstance(roots, (tuple, list))
                                    else [roots])[1])
    return bool(_backward(name, args, kwargs, filled))


def _backward(name: str, args: tuple, kwargs: dict, filled: list) -> list:
    """A backward is issued: mark the leaves it fills; returns the tensors moved from other
    nodes it reaches."""
    names = ("gradient" if name == "torch.Tensor.backward" else "grad_tensors",
             "retain_graph", "create_graph", "grad_variables", "inputs")
    roots = args[0] if args else kwargs.get("tensors")
    roots = list(roots) if isinstance(roots, (tuple, list)) else [roots]
    inputs = {**dict(zip(names, args[1:])), **kwargs}.get("inputs")
    if inputs is not None:
        inputs = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    return torchgrad.backward(roots, inputs, filled)


def _issue(node, stream: int, place: list, written, op: str, args: tuple, kwargs: dict,
           outs: tuple) -> None:
    started = _STARTED.get(id(node))
    if started is None or started() is not node:  # its first torch command: torch's import
        _STARTED[id(node)] = weakref.ref(node)
        node.quiet_until = time.monotonic() + config.get("torch_import_grace")
    now = next(node.ids)
    if written:  # an in-place op, a step: the rule for reads, then for writes
        ordering.order([t for i, t in enumerate(place) if i not in written], stream, now)
        ordering.order([place[i] for i in written], stream, now, True)
    else:
        ordering.order(place, stream, now)
    node.issue(wire.Call(id=now, stream=stream, outs=outs, op=op, args=args, kwargs=kwargs))


def _name(func) -> str:
    """`func`'s qualified name, if a worker may run it; else the worker's named error, now."""
    name = _NAMES[func] = torchspec.name_of(func)
    return name


def _convert(value, place: list, name: str):
    """(value with handles as TorchSpecs, as the wire carries it, a key for the meta rule)."""
    kind = type(value)
    if kind is _torch.Tensor or kind is _torch.nn.Parameter:  # a local one: sent alongside
        if not place:
            raise _Unplaced(value)
        value = _operand(value, place[0], name)
    if isinstance(value, Handle) and value.holds_torch and value._mesh is None:
        if place:
            check_same_place(place[0], value, f"{name}: operands",
                             "move one with .to(node=) or .dist_send(node=) first")
        place.append(value)
        return value._spec, value._ref, value._spec
    if kind in _SCALARS:
        return value, value, (kind, value)
    if kind is tuple or kind is list or kind is _torch.Size:
        parts = [_convert(v, place, name) for v in value]
        made = list if kind is list else tuple
        keys = tuple([p[2] for p in parts])
        return (made(p[0] for p in parts), tuple(p[1] for p in parts),
                None if None in keys else (made, keys))
    if kind is dict:
        named = {k: _convert(v, place, name) for k, v in value.items()}
        keys = tuple([(k, p[2]) for k, p in named.items()])
        return ({k: p[0] for k, p in named.items()}, {k: p[1] for k, p in named.items()},
                None if any(k[1] is None for k in keys) else (dict, keys))
    return _convert_other(value, name)


def _convert_other(value, name: str):
    torch = _torch
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        text = str(value)
        return value, text, (str, text)
    if isinstance(value, torch.device):
        text = str(value)
        return text, text, (str, text)
    if isinstance(value, slice):
        return value, value, (slice, value.start, value.stop, value.step)
    if value is Ellipsis:
        return value, value, (type(value), value)
    if isinstance(value, Handle):
        if value._mesh is not None and value.holds_torch:
            raise OnMesh(name)
        raise TypeError(f"{name}: a {value.kind} tensor meets a torch tensor; moving between "
                        "kinds is explicit: mwrt.dist_send(torch.from_numpy(t.numpy()), "
                        "node=...) for a torch handle, or t.numpy() of the torch one")
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: a local {type(value).__name__} meets a torch handle; send "
                        "it first: mwrt.dist_send(tensor, node=...)")
    if isinstance(value, (np.ndarray, np.generic)):
        return value, value, None
    raise TypeError(f"{name}: a value of type {type(value).__name__} cannot be sent to a worker "
                    f"(got {value!r:.60}, expected numbers, tuples, slices, dtypes or torch "
                    "handles)")


class _Unplaced(Exception):
    """A local tensor operand met before the handle whose place it goes to."""


def _first(value, local) -> Handle:
    """The first torch handle in `value` (nested in tuples, lists and dicts)."""
    kind = type(value)
    if isinstance(value, Handle) and value.holds_torch and value._mesh is None:
        return value
    parts = value.values() if kind is dict else value if kind in (tuple, list) else ()
    for part in parts:
        found = _first(part, None)
        if found is not None:
            return found
    if local is None:
        return None  # type: ignore[return-value]
    raise TypeError(f"torch: a local tensor ({local.dtype}{list(local.shape)}) has no torch "
                    "handle beside it to say where it goes; send it with "
                    "mwrt.dist_send(tensor, node=...)")


def _operand(local, target: Handle, name: str) -> Handle:
    """A local torch tensor operand, its values now, sent to where `target` lives (as a
    NumPy handle's NumPy operands are)."""
    if local.requires_grad:
        raise TypeError(f"{name}: a local tensor that requires grad meets a torch handle (got "
                        f"{local.dtype}{list(local.shape)}); its gradient could not come back "
                        "to it: send it first (w = mwrt.dist_send(t, node=...)) and read "
                        "w.grad")
    on_gpu = target._device != HOST
    if local.is_cuda != on_gpu and (local.is_cuda or local.dim() > 0):  # torch's own rule
        where = "cpu" if not on_gpu else f"cuda:{target._device}"
        raise ValueError(f"{name}: operands on different devices (got a local tensor on "
                         f"{local.device} and a handle on node {target._node.index} {where}); "
                         f"move the local one first (t.to({where!r}))")
    return sent(local, target._node, target._device, False, type(target))


# -- moving torch handles' values ------------------------------------------------------------

def sent(local, node, device: int, grad: bool, results: type) -> Handle:
    """A local torch tensor copied to (node, device), its values now, as a torch handle (of
    class `results`) that needs grad if `grad`."""
    torch = ready()
    host = local.detach().cpu().contiguous().clone()  # its values now, not at the flush
    values = host.view(torch.int16) if host.dtype == torch.bfloat16 else host
    array = np.asarray(values.numpy())
    stream = context.stream_for(node.index, HOST)
    raw = Handle(node, HOST, next(node.ids), Spec(array.shape, array.dtype), stream)
    transfer.send(raw, array)
    return from_raw(raw, str(host.dtype), grad, device, results)


def from_raw(raw: Any, dtype: str, grad: bool, device: int, results: type) -> Handle:
    """A torch handle (of class `results`) of a NumPy handle's bytes, on `device` of its
    node."""
    torch = ready()
    node = raw._node
    stream = context.stream_for(node.index, device)
    shape = tuple(raw._spec.shape)
    meta = torch.empty(shape, dtype=torchspec.objects()[dtype], device="meta")
    spec: Any = TorchSpec(shape, meta.dtype, meta.stride(), grad, True)
    out = results(node, device, next(node.ids), spec, stream)
    place = "cpu" if device == HOST else f"cuda:{device}"
    _issue(node, stream, [raw], (), "torch_from", (raw._ref, dtype, grad, place), {},
           (out._id,))
    return out


def arrive(raw: Any, source: Any, device: int, raw_class: type) -> Handle:
    """A torch handle of the bytes of torch handle `source` moved to another node (`raw`, a
    NumPy handle there): it needs grad, and a backward reaching it carries its gradient back
    to `source`, through a departure made now on `source`'s node (see torchacross);
    `raw_class` makes the NumPy handles that carry it."""
    node, torch = raw._node, ready()
    stream = context.stream_for(node.index, device)
    shape, dtype = tuple(raw._spec.shape), source._spec.dtype
    made = type(source)
    anchor = made(node, device, next(node.ids),
                  TorchSpec(shape, dtype, (0,) * len(shape), True, True), stream)
    stride = torch.empty(shape, dtype=dtype, device="meta").stride()
    out = made(node, device, next(node.ids), TorchSpec(shape, dtype, stride, True, False), stream)
    place = "cpu" if device == HOST else f"cuda:{device}"
    _issue(node, stream, [raw], (), "torch_arrive", (raw._ref, str(dtype), place), {},
           (anchor._id, out._id))
    out._autograd = torchgrad.Node((), False, (_depart(source), anchor, raw_class, next(_MOVES)))
    return out


_MOVES = itertools.count()  # the order of moves that carry a gradient back, all nodes'


def _depart(source: Any) -> Handle:
    """The departure of torch handle `source` to another node, on its node: an autograd node
    made now, as torch's copy would be, that leads to `source` (torchops._depart)."""
    node, device = source._node, source._device
    stream = context.stream_for(node.index, device)
    shape = tuple(source._spec.shape)
    spec = TorchSpec(shape, source._spec.dtype, (0,) * len(shape), True, False)
    out = type(source)(node, device, next(node.ids), spec, stream)
    _issue(node, stream, [source], (), "torch_depart", (source._ref,), {}, (out._id,))
    parent = torchgrad.node_of(source)
    out._autograd = torchgrad.Node(() if parent is None else (parent,))
    return out


def bits(tensor: Handle, results: type) -> Handle:
    """A NumPy handle (of class `results`) of a torch handle's values (bfloat16 as its
    bits)."""
    node, device = tensor._node, tensor._device
    spec = Spec(tuple(tensor.spec.shape), torchspec.bits_dtype(tensor.spec.dtype))
    stream = context.stream_for(node.index, device)
    out = results(node, HOST, next(node.ids), spec, stream)
    _issue(node, stream, [tensor], (), "torch_bits", (tensor._ref,), {}, (out._id,))
    return out
