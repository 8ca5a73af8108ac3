"""What the master knows of torch's tensors and objects: TorchSpec, the functions a worker
may run by name, and the wire's names of torch's dtypes.

A torch handle's op travels as one `torch` op (torchops.py): the function's qualified name
("torch.matmul", "torch.Tensor.sum", "torch.nn.functional.relu"), the grad mode, and its
arguments. The worker finds the function by that name among those torch itself hands to
`__torch_function__` (and a few constructors), never anything else from the wire. torch is
imported only when a torch op is first seen.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import config

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
    for name in _UNINITIALIZED:  # freed memory may hold another session's bytes
        if name in found:
            found[name] = _zeroed(found[name], torch)
    if "torch.Tensor.resize_" in found:
        found["torch.Tensor.resize_"] = _resize_zeroed(found["torch.Tensor.resize_"], torch)
    return found


# torch's functions that hand out memory as it was: run zero-filled, as NumPy's empty is on a
# worker (handlers.create), so no tensor shows what a freed one held.
_UNINITIALIZED = ("torch.empty", "torch.empty_like", "torch.empty_strided",
                  "torch.empty_permuted", "torch.Tensor.new_empty",
                  "torch.Tensor.new_empty_strided")


def _zeroed(func, torch):
    """`func`, its result zero-filled."""
    def zeroed(*args, **kwargs):
        made = func(*args, **kwargs)
        with torch.no_grad():  # (a leaf made to require grad)
            made.zero_()
        return made
    zeroed.__name__, zeroed.__qualname__ = func.__name__, getattr(func, "__qualname__", "")
    return zeroed


def _resize_zeroed(resize, torch):
    """Tensor.resize_, the elements it adds zero-filled (those it keeps are torch's)."""
    def resize_(t, *args, **kwargs):
        before = t.numel()
        made = resize(t, *args, **kwargs)
        if made.numel() > before:  # its storage in order, from the tensor's first element
            with torch.no_grad():
                made.as_strided((made.numel(),), (1,))[before:].zero_()
        return made
    return resize_


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


def bits_dtype(dtype) -> np.dtype:
    """The NumPy dtype torch_bits gives for a torch dtype."""
    torch = torch_module()
    if dtype == torch.bfloat16:
        return np.dtype(np.int16)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return np.dtype(np.uint8)
    return np.dtype(torch.empty((), dtype=dtype).numpy().dtype)


def nbytes(spec: TorchSpec) -> int:
    """The bytes a tensor of `spec` takes (as if contiguous)."""
    return math.prod(spec.shape) * spec.dtype.itemsize
