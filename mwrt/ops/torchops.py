"""torch's functions on the workers: the registry ops that run them.

`torch` runs torch's function of a qualified name (torchspec.function) and checks what it
made against the meta rule (torchmeta.infer); the others make tensors from NumPy bytes, give
a tensor's values back, keep modules, optimizers and LR schedulers, and fill a mesh
optimizer's gradient bucket.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np

from .registry import Spec, register
from .torchmeta import flatten, infer, key_of
from .torchspec import (
    bits_dtype,
    decode,
    function,
    objects,
    same_layout,
    spec_of,
    torch_module,
    worker_torch,
)


def _call(xp, name: str, grad: bool, *args, **kwargs) -> list:
    """Run torch's `name`; returns the new tensors it makes, checked against the meta rule."""
    torch = worker_torch()
    func = function(name)
    args, kwargs = decode(args), decode(kwargs)
    specs: list = []
    sargs, skwargs = _specs(args, specs, torch), _specs(kwargs, specs, torch)
    key = (name, grad, key_of(sargs), key_of(skwargs))
    expected = infer(name, func, grad, sargs, skwargs, None if None in key else key, ask=True)
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
            if spec.shape is not None and not same_layout(got, spec):  # (None: asked next)
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
            def backward(ctx, grad):  # dense, as autograd.grad's meta rule for the anchor says
                return grad.contiguous(), None, None, None
        _ARRIVAL.append(Arrival)
    anchor = torch.empty_strided(array.shape, (0,) * array.ndim, dtype=objects()[dtype],
                                 device=device).requires_grad_()
    return [anchor, _ARRIVAL[0].apply(anchor, array, dtype, device)]


_DEPARTURE: list = []  # the autograd Function of tensors sent to another node, once made


def _depart(xp, t) -> list:
    """The mark of `t` sent to another node with its gradient to come back: a tensor of its
    shape on one element of memory, made by an autograd node at the move, as torch's would be
    by the copy a move stands for. A backward from it, seeded with the gradient sent home,
    passes that gradient to `t` where torch would (its node's sequence number is the
    copy's), so `t`'s gradients add up in torch's order (mwrt.master.torchacross)."""
    torch = torch_module()
    if not _DEPARTURE:
        class Departure(torch.autograd.Function):  # type: ignore[name-defined]  # torch: imported now
            @staticmethod
            def forward(ctx, t):
                return torch.empty_strided(t.shape, (0,) * t.dim(), dtype=t.dtype,
                                           device=t.device)

            @staticmethod
            def backward(ctx, grad):
                return grad
        _DEPARTURE.append(Departure)
    with torch.enable_grad():
        return [_DEPARTURE[0].apply(t)]


_SCALING: list = []  # the autograd Function of a mesh mean's weighting, once made


def _scale(xp, grad: bool, t, factor: float) -> list:
    """t * factor (a place's part of a mean over a sharded axis, weighted by its share of
    the rows), whose backward keeps the factor as a number: torch's mul saves it as a
    tensor, which a backward frees, so a second backward through a mean (which torch's own
    mean allows: it saves nothing) failed as 'backward through the graph a second time'."""
    torch = torch_module()
    if not _SCALING:
        class Scaling(torch.autograd.Function):  # type: ignore[name-defined]  # torch: imported now
            @staticmethod
            def forward(ctx, t, factor):
                ctx.factor = factor
                return t * factor

            @staticmethod
            def backward(ctx, grad):
                return grad * ctx.factor, None
        _SCALING.append(Scaling)
    with torch.set_grad_enabled(grad):
        return [_SCALING[0].apply(t, factor)]


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


def saved_state(obj):
    """An optimizer's or LR scheduler's state_dict as torch.save's bytes (a uint8 tensor):
    run on the worker by the master's state_dict() (mwrt.remote's path), read back there
    with torch.load(weights_only)."""
    return _saved(obj.state_dict())


def saved_groups(obj):
    """An optimizer's param_groups but their params, as saved_state's bytes: what the
    master's param_groups read."""
    return _saved([{k: v for k, v in group.items() if k != "params"}
                   for group in obj.param_groups])


def _saved(value):
    import io

    torch = worker_torch()
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _set_group(obj, index: int, key: str, value) -> None:
    """`obj.param_groups[index][key] = value`, a plain value (a list as the tuple it was)."""
    groups = obj.param_groups
    if not (isinstance(index, int) and 0 <= index < len(groups)) or key == "params":
        raise ValueError(f"param_groups: no group {index!r} to set {key!r} of (this optimizer "
                         f"has {len(groups)}, and a group's params are set when it is made)")
    groups[index][key] = tuple(value) if isinstance(value, list) else value


def load_state(obj, data) -> None:
    """The inverse: torch.save's bytes (a uint8 tensor) of a state_dict loaded into `obj` on
    the worker (only tensors and plain values are read back: weights_only)."""
    import io

    torch = worker_torch()
    obj.load_state_dict(torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True))


# What a master may call on each kind of object a session holds.
_METHODS = {"Module": {"__call__", "parameters", "buffers", "train", "eval", "zero_grad",
                      "state_dict", "load_state_dict"},
            "Optimizer": {"step", "zero_grad", "param_groups.__setitem__"},
            "LRScheduler": {"step"}}


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
    call: Any = (functools.partial(_set_group, obj) if method == "param_groups.__setitem__"
                 else getattr(obj, method))
    with torch.set_grad_enabled(grad):
        result = call(*decode(args), **decode(kwargs))
    if method in ("parameters", "buffers"):
        result = list(result)
    elif method == "state_dict":  # its tensors, in its order (the master knows the names)
        result = list(result.values())
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


register("torch", _call, lambda *args, **kwargs: None, own_results=True,
         doc="torch's function of that qualified name, on the tensor's worker.")
register("torch_from", _from, lambda *args, **kwargs: None, own_results=True,
         doc="A torch tensor of a NumPy array's bytes.")
register("torch_arrive", _arrive, lambda *args, **kwargs: None, own_results=True,
         doc="A tensor received from another node whose gradient goes back there.")
register("torch_depart", _depart, lambda *args, **kwargs: None, own_results=True,
         doc="The autograd mark of a tensor sent to another node.")
register("torch_scale", _scale, lambda *args, **kwargs: None, own_results=True,
         doc="A mesh mean's part weighted by its rows, its backward saving no tensor.")
register("torch_new", _new, lambda *args, **kwargs: None, own_results=True,
         doc="An optimizer or LR scheduler of torch.optim on the worker.")
register("torch_method", _method, lambda *args, **kwargs: None, own_results=True,
         doc="A method of a module, optimizer or LR scheduler the session holds.")
register("torch_bits", _bits, _bits_meta, doc="A torch tensor's values as a NumPy array.")
register("torch_grads_flat", _grads_flat, lambda *args, **kwargs: None, own_results=True,
         doc="Tensors' gradients in one flat tensor (a mesh optimizer's bucket).")
register("torch_grads_set", _grads_set, lambda *args, **kwargs: None, own_results=True,
         doc="A flat bucket copied back into tensors' gradients.")
