"""What a torch call makes, read from torch's meta device: the rule master and worker share.

`infer` gives the results' shapes, dtypes and strides, which input a result is (an in-place
op returns it) or may view, and which inputs it writes; remembered per (name, grad mode,
input metas, plain values). `flatten` and `unflatten` carry how a result's tensors nest.
"""

from __future__ import annotations

import warnings
from typing import Any

from .torchspec import Outcome, TorchSpec, decode, spec_of, torch_module

NOTHING = Outcome((), (), (), None, None)
_SPECIAL = {"torch.manual_seed": NOTHING, "torch.Tensor.backward": NOTHING,
            "torch.autograd.backward": NOTHING, "torch.Tensor.grad.__set__": NOTHING}
_MEMO: dict = {}


def infer(name: str, func, grad: bool, args: tuple, kwargs: dict, key,
          ask: bool = False) -> Outcome:
    """What `func(*args, **kwargs)` makes (TorchSpecs for tensors), remembered by `key`
    (None: not remembered). `ask`: a call whose shapes depend on the values (nonzero, a
    mask's index, unique) gives its results' specs with shape None, to ask of the worker
    that ran it (asked_outcome); else it is a TypeError that says so."""
    special = _SPECIAL.get(name)
    if special is not None:
        return special
    if key is not None:
        found = _MEMO.get(key)
        if found is not None:
            return found
    rule = _RULES.get(name)
    outcome = rule(args, kwargs) if rule is not None else _run_meta(name, func, grad, args,
                                                                    kwargs, ask)
    if key is not None and not asks(outcome):  # (another caller may not ask)
        if len(_MEMO) > 100_000:
            _MEMO.clear()
        _MEMO[key] = outcome
    return outcome


def asks(outcome: Outcome) -> bool:
    """Whether the shapes of `outcome`'s results are to be asked of the worker."""
    return any(spec.shape is None for spec, _, _ in outcome.outs)


def _run_meta(name: str, func, grad: bool, args: tuple, kwargs: dict,
              ask: bool = False) -> Outcome:
    torch = torch_module()
    inputs: list = []
    margs, mkwargs = _to_meta(args, inputs), _to_meta(kwargs, inputs)
    if "device" in mkwargs:
        mkwargs["device"] = "meta"
    versions, before = [t._version for t in inputs], [spec_of(t) for t in inputs]
    if name == "torch.Tensor.__setitem__":
        func = _setitem_on_host
    elif name in _POWS and _bool_power(torch, margs, mkwargs):
        func = getattr(torch.Tensor, _POWS[name])
    try:
        with torch.set_grad_enabled(grad):
            result = func(*margs, **mkwargs)
    except (NotImplementedError, RuntimeError) as exc:
        # torch says a shape needs the values as either ("cannot repeat_interleave a meta
        # tensor without output_size"); any other RuntimeError is the call's own
        if type(exc) is RuntimeError and "meta tensor" not in str(exc):
            raise
        asked = asked_outcome(func, grad, args, kwargs) if ask else None
        if asked is not None:
            return asked
        raise TypeError(f"{name}: its result's shape depends on the tensor's values, which the "
                        f"master does not have ({str(exc).splitlines()[0]:.100}); compute it "
                        "inside a function run with mwrt.remote(fn)") from None
    roots = {id(_root(t)): i for i, t in enumerate(inputs)}
    leaves: list = []
    tree = flatten(result, leaves, torch.Tensor)
    outs = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            same = next((i for i, t in enumerate(inputs) if t is leaf), -1)
            view = roots.get(id(_root(leaf)), -1) if same < 0 else same
            outs.append((spec_of(leaf), same, view))
    written = tuple(i for i, t in enumerate(inputs) if t._version != versions[i])
    respec = tuple((i, spec_of(t)) for i, t in enumerate(inputs) if spec_of(t) != before[i])
    if not outs:
        return Outcome((), written, respec, None, result)
    return Outcome(tuple(outs), written, respec, tree, None)


def asked_outcome(func, grad: bool, args: tuple, kwargs: dict) -> Outcome | None:
    """What a call whose shapes depend on the values makes, shapes aside (None: asked of
    the worker once it ran): run on stand-ins without elements, it tells its results'
    number, nesting, dtypes, grad and leafness. None where it fails on them, writes or
    returns an input, or makes no tensor (a Python value: it needs the values)."""
    torch = torch_module()
    inputs: list = []
    try:
        sargs, skwargs = _to_meta(args, inputs, _stand_in), _to_meta(kwargs, inputs, _stand_in)
        versions = [t._version for t in inputs]
        with torch.set_grad_enabled(grad), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = func(*sargs, **skwargs)
    except Exception:  # noqa: BLE001 - not such a call: the caller says why it cannot run
        return None
    leaves: list = []
    tree = flatten(result, leaves, torch.Tensor)
    if (not leaves or any(t._version != v for t, v in zip(inputs, versions))
            or any(leaf is t for leaf in leaves for t in inputs)):
        return None
    outs = tuple((TorchSpec(ASKED, leaf.dtype, ASKED, leaf.requires_grad, leaf.is_leaf), -1,
                  -1) for leaf in leaves)
    return Outcome(outs, (), (), tree, None)


# A TorchSpec's shape and strides where the worker is asked them (asked_outcome's).
ASKED: Any = None


def _stand_in(spec: TorchSpec):
    """A host tensor with `spec`'s dtype, ndim, grad and leafness and no elements."""
    torch = torch_module()
    made = torch.empty((0,) * len(spec.shape), dtype=spec.dtype)
    if not spec.requires_grad:
        return made
    if spec.leaf:
        return made.requires_grad_()
    with torch.enable_grad():
        return made.requires_grad_() * 1


def _setitem_on_host(target, index, value) -> None:
    """target[index] = value as torch does it on the host: a 0-d CPU tensor is filled into
    a basic index's view of another shape (its copy_to), not copied as a meta one is, and
    fill_ from a tensor that needs grad makes even an integer target need it."""
    torch = torch_module()
    parts = index if type(index) is tuple else (index,)
    if (isinstance(value, torch.Tensor) and value.dim() == 0
            and all(p is None or p is Ellipsis or type(p) in (int, slice) for p in parts)):
        view = target[index]
        if view.dim() != 0:
            view.fill_(value)
            return
    target[index] = value


# A bool tensor to a bool power stays bool on the host (its kernel's result type), where the
# meta device promotes to int64, and refuses the in-place form: bool's own mul runs in its place.
_POWS = {"torch.pow": "mul", "torch.Tensor.pow": "mul", "torch.Tensor.__pow__": "mul",
         "torch.Tensor.pow_": "mul_", "torch.Tensor.__ipow__": "mul_"}


def _bool_power(torch, args: tuple, kwargs: dict) -> bool:
    """Whether a pow's base is a bool tensor and its exponent a Python bool (both given by
    position)."""
    return (len(args) == 2 and not kwargs and isinstance(args[0], torch.Tensor)
            and args[0].dtype == torch.bool and type(args[1]) is bool)


def _root(t):
    base = t._base
    return t if base is None else base


def _to_meta(value, inputs: list, make=None):
    kind = type(value)
    if kind is TorchSpec:
        meta = (make or _meta_tensor)(value)
        inputs.append(meta)
        return meta
    if kind is tuple or kind is list:
        return kind(_to_meta(v, inputs, make) for v in value)
    if kind is dict:
        return {k: _to_meta(v, inputs, make) for k, v in value.items()}
    return decode(value)


def _meta_tensor(spec: TorchSpec):
    """An empty tensor on the meta device with `spec`'s metadata (a non-leaf as a view of
    an op's result, where torch allows in-place ops)."""
    torch = torch_module()
    made = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device="meta")
    if not spec.requires_grad:
        return made
    if spec.leaf:
        return made.requires_grad_()
    size = made.untyped_storage().nbytes() // max(made.element_size(), 1)
    with torch.enable_grad():  # a non-leaf under no_grad too: a view of it needs grad
        base = torch.empty(size, dtype=spec.dtype, device="meta", requires_grad=True) * 1
        return base.as_strided(spec.shape, spec.stride)


def _grads(args: tuple, kwargs: dict) -> Outcome:
    """torch.autograd.grad's results: one gradient per input, with the input's metadata."""
    inputs = kwargs.get("inputs", args[1] if len(args) > 1 else ())
    specs = inputs if type(inputs) in (tuple, list) else (inputs,)
    grad = bool(kwargs.get("create_graph"))
    # an input whose layout overlaps (an expanded one) gets a contiguous gradient
    outs = tuple((TorchSpec(s.shape, s.dtype, s.stride if _dense(s.shape, s.stride)
                            else _contiguous(s.shape), grad, True), -1, -1) for s in specs)
    return Outcome(outs, (), (), (tuple, (LEAF,) * len(outs)), None)


def _grad_of(args: tuple, kwargs: dict) -> Outcome:
    """t.grad: a tensor of t's metadata that needs no grad (the meta device has no grads);
    contiguous where t's layout overlaps or has gaps, as autograd's layout contract says."""
    s = args[0]
    stride = s.stride if _dense(s.shape, s.stride) else _contiguous(s.shape)
    return Outcome(((TorchSpec(s.shape, s.dtype, stride, False, True), -1, -1),), (), (),
                   None, None)


def _dense(shape: tuple, stride: tuple) -> bool:
    """Whether strides lay the elements out without overlap or gaps (in some order)."""
    expected = 1
    for size, step in sorted((p for p in zip(shape, stride) if p[0] != 1), key=lambda p: p[1]):
        if step != expected:
            return False
        expected *= size
    return True


def _contiguous(shape: tuple) -> tuple:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(reversed(stride))


_RULES = {"torch.autograd.grad": _grads, "torch.Tensor.grad.__get__": _grad_of}
LEAF = "leaf"


def flatten(value, leaves: list, tensor: type):
    """How `value`'s tensors nest (None: `value` is one tensor; LEAF marks a tensor in a
    tuple or list; other values stay as they are), its tensors appended to `leaves`."""
    if isinstance(value, tensor):
        leaves.append(value)
        return None
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_part(v, leaves, tensor) for v in value))
    return ("value", value)


def _part(value, leaves: list, tensor: type):
    tree = flatten(value, leaves, tensor)
    return LEAF if tree is None else tree


def unflatten(tree, leaves) -> Any:
    """The value `tree` describes, with `leaves` (an iterator) in its tensors' places."""
    if tree is None or tree == LEAF:
        return next(leaves)
    kind, parts = tree
    if kind == "value":
        return parts
    items = [unflatten(p, leaves) for p in parts]
    return items if kind is list else tuple(items) if kind is tuple else kind(items)


def key_of(value):
    """A hashable key of an argument with TorchSpec leaves, or None where one is not plain."""
    kind = type(value)
    if kind is TorchSpec or kind in _PLAIN:
        return (kind, value)
    if kind is tuple or kind is list:
        parts = tuple([key_of(v) for v in value])
        return None if None in parts else (kind, parts)
    if kind is dict:
        parts = tuple([(k, key_of(v)) for k, v in value.items()])
        return None if any(p[1] is None for p in parts) else (kind, parts)
    if kind is slice:
        return (kind, value.start, value.stop, value.step)
    return None


_PLAIN = frozenset((int, float, bool, complex, str, type(None), type(Ellipsis)))
