"""torch's functions on the workers: the registry ops that run them, and their meta rule.

A torch handle's op travels as one `torch` op: the function's qualified name ("torch.matmul",
"torch.Tensor.sum", "torch.nn.functional.relu"), the grad mode, and its arguments. The
worker finds the function by that name among those torch itself hands to
`__torch_function__` (and a few constructors), never anything else from the wire. Both sides
learn what a call makes from torch's meta device (`infer`): the results' shapes, dtypes and
strides, which input a result is (an in-place op returns it) or may view, and which inputs
it writes; remembered per (name, grad mode, input metas, plain values). torch is imported
only when a torch op is first seen.
"""

from __future__ import annotations

import copy
import math
from typing import Any, NamedTuple

import numpy as np

from .. import config
from .registry import Spec, register

INSTALL = "pip install 'mwrt[torch]'"


class TorchSpec(NamedTuple):
    """What the master knows of a torch tensor: torch's metadata, no values."""

    shape: tuple
    dtype: Any  # a torch.dtype
    stride: tuple
    requires_grad: bool
    leaf: bool


class Outcome(NamedTuple):
    """What one call makes, by torch's meta device."""

    outs: tuple  # per tensor of the result: (TorchSpec, the input it is or -1, it may view or -1)
    written: tuple  # the inputs it writes in place
    respec: tuple  # (input, TorchSpec) for inputs whose metadata it changed (t_(), resize_())
    tree: Any  # how the result's tensors nest (see flatten), None for one tensor
    value: Any  # the result itself when it holds no tensor (a.size(), a.dim())


def torch_module():
    """torch, or an ImportError that says how to install it."""
    try:
        import torch
    except ImportError:
        raise ImportError(f"torch: not installed on this node; {INSTALL} here to hold torch "
                          "tensors") from None
    return torch


_THREADS_SET: list = []


def worker_torch():
    """torch, as a worker's ops use it: its intra-op threads set once, from
    MWRT_TORCH_THREADS (0: torch's own count; local workers get 1, see master/local.py)."""
    torch = torch_module()
    if not _THREADS_SET:
        _THREADS_SET.append(True)
        threads = config.get("torch_threads")
        if threads > 0:
            torch.set_num_threads(threads)
    return torch


def spec_of(t) -> TorchSpec:
    """A tensor's TorchSpec."""
    return TorchSpec(tuple(t.shape), t.dtype, t.stride(), t.requires_grad, t.is_leaf)


def spec_from(value: dict) -> TorchSpec:
    """The TorchSpec of a worker's answer to Meta for a torch tensor."""
    return TorchSpec(tuple(value["shape"]), objects()[value["dtype"]], tuple(value["stride"]),
                     bool(value["requires_grad"]), bool(value["leaf"]))


def same_layout(a: TorchSpec, b: TorchSpec) -> bool:
    """Whether two specs agree on shape, dtype and the strides that address memory."""
    # A stride along a length-0 or length-1 axis never moves the address, and torch's
    # kernels leave it free (a gradient of a (1, 3) tensor may come back with strides
    # (1, 1) where the meta rule says (3, 1)), as its own check_significant_strides does;
    # nor does any stride of a tensor without elements (flip's kernel gives (0, 0)).
    return (a.shape == b.shape and a.dtype == b.dtype
            and (0 in a.shape
                 or all(x == y for x, y, n in zip(a.stride, b.stride, a.shape) if n > 1)))


# -- the names a worker runs -------------------------------------------------------------

_FUNCTIONS: dict[str, Any] = {}
# Overridable, but not for a remote caller: hooks would run callables, pickling and shared
# memory reach past the tensor.
_DENIED = ("hook", "__reduce", "__setstate__", "share_memory_", "module_load", "storage",
           "__deepcopy__", "data_ptr", "pin_memory", "__dlpack__", "tolist", "numpy")
# Tensor methods that torch hands to __torch_function__ but leaves out of
# get_overridable_functions(): a tensor of new values, of the tensor's dtype and device.
NEW = ("new_ones", "new_zeros", "new_full", "new_empty", "new_tensor")
EXTRA = ("torch.autograd.grad", "torch.autograd.backward", "torch.manual_seed",
         "torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.randn", "torch.rand",
         "torch.arange", "torch.eye", "torch.linspace", "torch.Tensor.grad.__set__",
         *(f"torch.Tensor.{name}" for name in NEW))


def function(name: str):
    """torch's function `name`, if a master may run it; else a named error."""
    found = _FUNCTIONS.get(name)
    if found is None:
        if not _FUNCTIONS:
            _FUNCTIONS.update(_known())
        found = _FUNCTIONS.get(name)
        if found is None:
            raise ValueError(f"torch: {name!r} is not a torch function a master may run "
                             "(expected one torch passes to __torch_function__, such as "
                             "'torch.matmul'); run other code with mwrt.remote(fn)")
    return found


def name_of(func) -> str:
    """The name a worker knows torch's `func` by (torch.manual_seed lives in torch.random)."""
    from torch.overrides import resolve_name

    name = resolve_name(func) or f"{getattr(func, '__module__', '')}.{func.__qualname__}"
    if name not in _FUNCTIONS:
        function("torch.matmul")  # the table, made once
        name = next((n for n, f in _FUNCTIONS.items() if f is func), name)
    function(name)
    return name


def _known() -> dict:
    torch = torch_module()
    from torch.overrides import get_overridable_functions, resolve_name

    found = {}
    for functions in get_overridable_functions().values():
        for func in functions:
            name = resolve_name(func)
            if name and not any(word in name for word in _DENIED):
                found[name] = func
    for name in EXTRA:
        found[name] = _lookup(torch, name)
    return found


def _lookup(torch, name: str):
    value: Any = torch
    for part in name.split(".")[1:]:
        value = getattr(value, part)
    return value


# -- values that stand for torch's objects on the wire ------------------------------------

_OBJECTS: dict[str, Any] = {}


def objects() -> dict:
    """torch's dtypes, layouts and memory formats by the name the wire carries ("torch.float32")."""
    if not _OBJECTS:
        torch = torch_module()
        kinds = (torch.dtype, torch.layout, torch.memory_format)
        _OBJECTS.update({f"torch.{n}": v for n, v in vars(torch).items()
                         if isinstance(v, kinds)})
    return _OBJECTS


def decode(value):
    """`value` with the wire's names of torch's objects ("torch.float32") as the objects."""
    kind = type(value)
    if kind is str:
        return objects().get(value, value) if value.startswith("torch.") else value
    if kind is tuple:
        return tuple([decode(v) for v in value])
    if kind is dict:
        return {k: decode(v) for k, v in value.items()}
    return value


# -- the meta rule -------------------------------------------------------------------------

NOTHING = Outcome((), (), (), None, None)
_SPECIAL = {"torch.manual_seed": NOTHING, "torch.Tensor.backward": NOTHING,
            "torch.autograd.backward": NOTHING, "torch.Tensor.grad.__set__": NOTHING}
_MEMO: dict = {}


def infer(name: str, func, grad: bool, args: tuple, kwargs: dict, key) -> Outcome:
    """What `func(*args, **kwargs)` makes (TorchSpecs for tensors), remembered by `key`
    (None: not remembered)."""
    special = _SPECIAL.get(name)
    if special is not None:
        return special
    if key is not None:
        found = _MEMO.get(key)
        if found is not None:
            return found
    rule = _RULES.get(name)
    outcome = rule(args, kwargs) if rule is not None else _run_meta(name, func, grad, args,
                                                                    kwargs)
    if key is not None:
        if len(_MEMO) > 100_000:
            _MEMO.clear()
        _MEMO[key] = outcome
    return outcome


def _run_meta(name: str, func, grad: bool, args: tuple, kwargs: dict) -> Outcome:
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
    except NotImplementedError as exc:
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


def _to_meta(value, inputs: list):
    kind = type(value)
    if kind is TorchSpec:
        meta = _meta_tensor(value)
        inputs.append(meta)
        return meta
    if kind is tuple or kind is list:
        return kind(_to_meta(v, inputs) for v in value)
    if kind is dict:
        return {k: _to_meta(v, inputs) for k, v in value.items()}
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


# -- the ops -------------------------------------------------------------------------------

def _call(xp, name: str, grad: bool, *args, **kwargs) -> list:
    """Run torch's `name`; returns the new tensors it makes, checked against the meta rule."""
    torch = worker_torch()
    func = function(name)
    args, kwargs = decode(args), decode(kwargs)
    specs: list = []
    sargs, skwargs = _specs(args, specs, torch), _specs(kwargs, specs, torch)
    key = (name, grad, key_of(sargs), key_of(skwargs))
    expected = infer(name, func, grad, sargs, skwargs, None if None in key else key)
    with torch.set_grad_enabled(grad):
        result = func(*args, **kwargs)
    if result is None and name == "torch.Tensor.grad.__get__":
        raise ValueError("grad: the tensor has no gradient on its worker yet (got None); call "
                         "backward() on a result computed from it first")
    leaves: list = []
    flatten(result, leaves, torch.Tensor)
    if len(leaves) != len(expected.outs):
        raise TypeError(f"{name}: made {len(leaves)} tensors (expected {len(expected.outs)}, "
                        "by torch's meta device on the master)")
    made = []
    for leaf, (spec, same, _) in zip(leaves, expected.outs):
        if same < 0:
            got = spec_of(leaf)
            if not same_layout(got, spec):
                raise TypeError(f"{name}: the result disagrees with what the master announced "
                                f"(got {got.dtype}{list(got.shape)} strides {got.stride}, "
                                f"expected {spec.dtype}{list(spec.shape)} strides "
                                f"{spec.stride}); torch's meta rule for {name} differs from "
                                "its kernel here: please report it")
            made.append(leaf)
    return made


def _specs(value, specs: list, torch):
    """Resolved arguments with their tensors as TorchSpecs."""
    if isinstance(value, torch.Tensor):
        spec = spec_of(value)
        specs.append(spec)
        return spec
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(_specs(v, specs, torch) for v in value)
    if kind is dict:
        return {k: _specs(v, specs, torch) for k, v in value.items()}
    return value


def _from(xp, array, dtype: str, requires_grad: bool, device: str) -> list:
    """A torch tensor of a NumPy array's bytes (a dtype NumPy lacks, bfloat16, as its bits)."""
    torch = worker_torch()
    # ascontiguousarray would make a 0-d array 1-d
    made = torch.from_numpy(np.ascontiguousarray(array).reshape(array.shape))
    wanted = objects()[dtype]
    if made.dtype != wanted:
        made = made.view(wanted)
    if device != "cpu":
        made = made.to(device)
    return [made.requires_grad_(requires_grad)]


_ARRIVAL: list = []  # the autograd Function of tensors received from another node, once made


def _arrive(xp, array, dtype: str, device: str) -> list:
    """A tensor of a NumPy array's bytes received from another node, which needs grad: its
    gradient goes to `anchor`, a leaf of its shape on one element of memory, from where the
    master sends it to the sender (mwrt.master.torchacross)."""
    torch = torch_module()
    if not _ARRIVAL:
        class Arrival(torch.autograd.Function):  # type: ignore[name-defined]  # torch: imported now
            @staticmethod
            def forward(ctx, anchor, array, dtype, device):  # made here: not a view of anchor
                return _from(None, array, dtype, False, device)[0]

            @staticmethod
            def backward(ctx, grad):
                return grad, None, None, None
        _ARRIVAL.append(Arrival)
    anchor = torch.empty_strided(array.shape, (0,) * array.ndim, dtype=objects()[dtype],
                                 device=device).requires_grad_()
    return [anchor, _ARRIVAL[0].apply(anchor, array, dtype, device)]


def _bits(xp, t):
    """A torch tensor's values as a NumPy array (a dtype NumPy lacks as same-sized ints)."""
    torch = torch_module()
    host = t.detach().cpu().contiguous()
    if host.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        host = host.view(torch.int16 if host.element_size() == 2 else torch.uint8)
    return host.numpy()


def stored(t) -> tuple:
    """(a torch tensor's values as a NumPy array, the safetensors code of its dtype where
    NumPy lacks it: the array then holds its bits)."""
    torch = torch_module()
    codes = {torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
    return _bits(None, t), codes.get(t.dtype)


def bits_dtype(dtype) -> np.dtype:
    """The NumPy dtype torch_bits gives for a torch dtype."""
    torch = torch_module()
    if dtype == torch.bfloat16:
        return np.dtype(np.int16)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return np.dtype(np.uint8)
    return np.dtype(torch.empty((), dtype=dtype).numpy().dtype)


def _bits_meta(t) -> Spec:
    return Spec(tuple(t.shape), bits_dtype(t.dtype))


# -- objects: modules, optimizers, LR schedulers -----------------------------------------

def build_module(meta_model, names: tuple, *tensors):
    """A module shipped on the meta device (structure, no values), given its values: run on
    the worker by mwrt.torch.module through the authenticated path of mwrt.remote. A copy:
    the worker keeps one unpickled function per content, so two models of one structure
    would otherwise share one module, the second's values assigned into the first's."""
    model = copy.deepcopy(meta_model)
    model.load_state_dict(dict(zip(names, tensors, strict=True)), assign=True)
    return model


def _new(xp, path: str, grad: bool, *args, **kwargs) -> list:
    """An optimizer or LR scheduler of torch.optim, by class name, over resolved tensors."""
    torch = worker_torch()
    family, _, name = path.rpartition(".")
    space = {"torch.optim": torch.optim, "torch.optim.lr_scheduler": torch.optim.lr_scheduler}
    kind = getattr(space.get(family), name, None) if not name.startswith("_") else None
    bases = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
    if not (isinstance(kind, type) and issubclass(kind, bases)):
        raise ValueError(f"torch: {path!r} is not an optimizer or LR scheduler of torch.optim "
                         "(expected e.g. 'torch.optim.AdamW' or "
                         "'torch.optim.lr_scheduler.StepLR')")
    return [kind(*decode(args), **decode(kwargs))]


# What a master may call on each kind of object a session holds.
_METHODS = {"Module": {"__call__", "parameters", "buffers", "train", "eval", "zero_grad"},
            "Optimizer": {"step", "zero_grad"}, "LRScheduler": {"step"}}


def _method(xp, obj, method: str, grad: bool, *args, **kwargs) -> list:
    """`obj.method(*args, **kwargs)` for a module, optimizer or scheduler the session holds;
    returns the tensors of its result."""
    torch = worker_torch()
    kinds = {"Module": torch.nn.Module, "Optimizer": torch.optim.Optimizer,
             "LRScheduler": torch.optim.lr_scheduler.LRScheduler}
    kind = next((k for k, cls in kinds.items() if isinstance(obj, cls)), None)
    if kind is None or method not in _METHODS[kind]:
        raise TypeError(f"torch: cannot call {method!r} on a {type(obj).__name__} (expected a "
                        f"module, optimizer or scheduler and one of {sorted(_METHODS)})")
    with torch.set_grad_enabled(grad):
        result = getattr(obj, method)(*decode(args), **decode(kwargs))
    if method in ("parameters", "buffers"):
        result = list(result)
    leaves: list = []
    flatten(result, leaves, torch.Tensor)
    return leaves


# -- a mesh optimizer's gradient bucket -----------------------------------------------------

def _grads_flat(xp, grad: bool, *params) -> list:
    """The parameters' gradients in one new flat tensor (zeros for one without): the bucket
    a mesh optimizer all_reduces, as DDP's reducer fills its buckets."""
    torch = worker_torch()
    with torch.no_grad():
        return [torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                           for p in _tensors(params, torch)])]


def _grads_set(xp, grad: bool, flat, *params) -> list:
    """The bucket's parts copied back into the gradients it was made of."""
    torch = worker_torch()
    offset = 0
    with torch.no_grad():
        for p in _tensors(params, torch):
            n = p.numel()
            if p.grad is not None:
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n
    return []


def _tensors(params: tuple, torch) -> tuple:
    if not all(isinstance(p, torch.Tensor) for p in params):
        raise TypeError(f"torch: a gradient bucket takes torch tensors (got "
                        f"{sorted({type(p).__name__ for p in params})})")
    return params


def nbytes(spec: TorchSpec) -> int:
    """The bytes a tensor of `spec` takes (as if contiguous)."""
    return math.prod(spec.shape) * spec.dtype.itemsize


register("torch", _call, lambda *args, **kwargs: None, own_results=True,
         doc="torch's function of that qualified name, on the tensor's worker.")
register("torch_from", _from, lambda *args, **kwargs: None, own_results=True,
         doc="A torch tensor of a NumPy array's bytes.")
register("torch_arrive", _arrive, lambda *args, **kwargs: None, own_results=True,
         doc="A tensor received from another node whose gradient goes back there.")
register("torch_new", _new, lambda *args, **kwargs: None, own_results=True,
         doc="An optimizer or LR scheduler of torch.optim on the worker.")
register("torch_method", _method, lambda *args, **kwargs: None, own_results=True,
         doc="A method of a module, optimizer or LR scheduler the session holds.")
register("torch_bits", _bits, _bits_meta, doc="A torch tensor's values as a NumPy array.")
register("torch_grads_flat", _grads_flat, lambda *args, **kwargs: None, own_results=True,
         doc="Tensors' gradients in one flat tensor (a mesh optimizer's bucket).")
register("torch_grads_set", _grads_set, lambda *args, **kwargs: None, own_results=True,
         doc="A flat bucket copied back into tensors' gradients.")
