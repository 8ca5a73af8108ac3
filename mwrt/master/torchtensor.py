"""TorchTensor: the master's handle to a torch tensor on a worker.

It is a DistributedTensor (the same ids, ordering records and frees) whose ops are torch's:
it takes part in `__torch_function__`, so `torch.matmul(a, b)`, `F.relu(a)`, `a.sum(1)`,
`a @ b`, indexing, views and in-place ops issue one `torch` command each and return at
once, their results' metadata from torch's meta device (see mwrt.ops.torchmeta). Its
methods are torch.Tensor's, generated when the first torch handle is made: nothing imports
torch before then.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import HOST
from ..errors import RemoteError
from ..ops import torchspec
from . import torchacross, torchgrad, torchmesh, torchutils, transfer
from .tensor import DistributedTensor
from .torchissue import Crossing, OnMesh, arrive, bits, from_raw, torch_call
from .torchissue import ready as torch_ready


class TorchTensor(DistributedTensor):
    """A handle to a torch tensor on (node, device); torch's functions and methods on it run
    on that worker."""

    __slots__ = ("_autograd", "_views")  # the master's autograd node; a base's views
    holds_torch = True
    kind = "torch"  # a property on NumPy and CuPy handles
    if TYPE_CHECKING:
        _spec: Any  # a TorchSpec (mwrt.ops.torchspec), always known

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        """Every torch function given a torch handle runs on the handle's worker."""
        return dispatch(func, args, kwargs or {})

    # -- what the master knows without asking ----------------------------------------------

    @property
    def shape(self) -> Any:  # type: ignore[override]  # torch.Size, read-only as torch's
        """The shape, a torch.Size."""
        return _torch().Size(self._spec.shape)

    dtype = property(lambda self: self._spec.dtype, doc="The torch dtype of the elements.")
    ndim = property(lambda self: len(self._spec.shape), doc="The number of dimensions.")
    is_leaf = property(lambda self: self._spec.leaf,
                       doc="True unless autograd made it from tensors that require grad.")
    is_cuda = property(lambda self: self._device != HOST, doc="True if it lives on a GPU.")
    is_cpu = property(lambda self: self._device == HOST, doc="True if it lives in host memory.")
    # a dense tensor in host or GPU memory (what libraries ask before they use one)
    vars().update({name: property(lambda self: False, doc="False: a dense, unquantized tensor.")
                   for name in ("is_sparse", "is_sparse_csr", "is_quantized", "is_nested",
                                "is_meta", "is_mkldnn")})
    layout = property(lambda self: _torch().strided, doc="torch.strided: a dense tensor.")

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        """Refused by name: mwrt.array_api runs NumPy's functions, a torch handle torch's (it
        answered mwrt.array_api, whose first op failed inside scikit-learn or SciPy)."""
        raise TypeError("__array_namespace__: a torch handle has no Array API namespace "
                        "(mwrt.array_api runs NumPy's functions, a torch handle torch's); for "
                        "Array API code such as scikit-learn's array_api_dispatch, send NumPy "
                        "arrays (mwrt.dist_send(t.numpy(), node=...)), or call torch's "
                        "functions on the handle")

    def unflatten(self, dim: int, sizes: Any) -> Any:
        """torch's unflatten: dimension `dim` viewed as `sizes` (one may be -1), a view
        (torch defines it in Python, outside the functions it lists for handles)."""
        shape = list(self.shape)
        at = dim % len(shape)
        return self.view(*shape[:at], *sizes, *shape[at + 1:])

    def type(self, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        """torch's type(): the type's name ('torch.FloatTensor'), or a cast to `dtype`."""
        if dtype is None:
            name = _torch().empty(0, dtype=self.dtype).type()
            return name.replace("torch.", "torch.cuda.", 1) if self.is_cuda else name
        if isinstance(dtype, str):  # 'torch.DoubleTensor': its dtype (the device stays)
            dtype = _torch().empty(0).type(dtype.replace("torch.cuda.", "torch.", 1)).dtype
        return self.to(dtype)
    nbytes = property(lambda self: math.prod(self._spec.shape) * self._spec.dtype.itemsize,
                      doc="The bytes its elements take on the worker.")
    itemsize = property(lambda self: self._spec.dtype.itemsize, doc="The bytes of one element.")

    @property
    def requires_grad(self) -> bool:
        """Whether autograd records ops on it; set, it calls requires_grad_()."""
        return self._spec.requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    @property
    def grad(self) -> TorchTensor | None:
        """Its gradient on the worker (a handle); None, as torch's, until a backward reached
        it (the master follows the graph's shape: no wait) and after zero_grad()."""
        if self._mesh is not None:  # each place's block knows; torchmesh asks place 0's
            return dispatch(_torch().Tensor.grad.__get__, (self,), {})
        if not torchgrad.filled(self):
            if not self._spec.leaf:
                warnings.warn(_NOT_LEAF, UserWarning, stacklevel=2)
            return None
        return dispatch(_torch().Tensor.grad.__get__, (self,), {})

    @grad.setter
    def grad(self, value: Any) -> None:
        dispatch(_torch().Tensor.grad.__set__, (self, value), {})
        torchgrad.set_filled(self, value is not None)

    def retain_grad(self) -> None:
        """A backward fills this non-leaf's .grad too (torch's retain_grad())."""
        torch_call(_torch().Tensor.retain_grad, (self,), {})
        torchgrad.retain(self)

    @property
    def device(self) -> Any:
        """torch's device of it on its node: cpu, or cuda:k (a mesh tensor's: its first
        place's, as a DTensor's is its mesh's device type)."""
        torch = _torch()
        device = self._device if self._mesh is None else self._mesh.places[0][1]
        return torch.device("cpu") if device == HOST else torch.device("cuda", device)

    def size(self, dim: int | None = None) -> Any:
        """The shape (a torch.Size), or dimension `dim` of it."""
        return self.shape if dim is None else self._spec.shape[dim]

    def stride(self, dim: int | None = None) -> Any:
        """The strides in elements, or that of dimension `dim`."""
        return self._spec.stride if dim is None else self._spec.stride[dim]

    def dim(self) -> int:
        """The number of dimensions."""
        return len(self._spec.shape)

    def numel(self) -> int:
        """The number of elements."""
        return math.prod(self._spec.shape)

    def element_size(self) -> int:
        """The bytes of one element."""
        return self._spec.dtype.itemsize

    def __len__(self) -> int:
        """The length of the first dimension; a TypeError for a 0-d tensor."""
        if not self._spec.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._spec.shape[0]

    def __repr__(self) -> str:
        """Shape, dtype and place, without asking the worker."""
        spec = self._spec
        grad = ", requires_grad=True" if spec.requires_grad else ""
        if self._mesh is not None:
            return (f"TorchTensor(shape={tuple(spec.shape)}, dtype={spec.dtype}{grad}, "
                    f"placements={self._placements}, {self._mesh!r})")
        return (f"TorchTensor(shape={tuple(spec.shape)}, dtype={spec.dtype}{grad}, "
                f"node={self._node.index}, device={self._device}, id={self._id})")

    # -- copies to the master (sync points) ------------------------------------------------

    def numpy(self, copy: bool = True) -> np.ndarray:
        """Its values as a NumPy array on the master (torch's dtypes NumPy lacks, such as
        bfloat16, are a TypeError, as torch's numpy() says); waits for them. Always a copy
        (copy=False views only a NumPy handle's shared memory)."""
        if self._spec.dtype == _torch().bfloat16:
            raise TypeError("numpy: NumPy has no bfloat16 (torch's numpy() refuses it too); "
                            "use t.torch() for a local torch tensor, or t.float().numpy()")
        return self._values()  # a copy, whatever `copy` says

    get = numpy

    def _values(self) -> np.ndarray:
        if self._mesh is not None:
            return torchmesh.fetch(self, DistributedTensor)
        return transfer.fetch(bits(self, DistributedTensor))

    def torch(self) -> Any:
        """Its values as a local torch tensor, of its dtype; waits for them."""
        values = _torch().from_numpy(self._values())
        dtype = self._spec.dtype
        return values.view(dtype) if values.dtype != dtype else values

    def item(self) -> Any:
        """The single element as a Python scalar."""
        if self.numel() != 1:
            self._stand_in().item()  # torch's own error
        return self.torch().item()

    def __copy__(self) -> Any:
        """Refused with the way to copy: torch's copy protocol copies storage, grad and
        autograd state, which a remote handle's clone() says explicitly."""
        raise TypeError("copy of a torch handle: make the copy on its worker with t.clone() "
                        "(t.detach().clone() for a copy outside autograd)")

    def __deepcopy__(self, memo: dict) -> Any:
        """Refused, as copy.copy is (see __copy__)."""
        return self.__copy__()

    def _stand_in(self) -> Any:
        """A torch tensor of this one's shape and dtype that holds one element: what torch
        says of it (float() of a vector, bool() of several elements) it says of ours."""
        return _torch().zeros((), dtype=self._spec.dtype).expand(self._spec.shape)

    def tolist(self) -> Any:
        """The values as nested Python lists (a scalar for a 0-d tensor); waits for them."""
        return self.torch().tolist()

    def __index__(self) -> int:
        """The value of a one-element integer tensor used as an index; waits for it."""
        if self._spec.dtype.is_floating_point or self._spec.dtype.is_complex:
            raise TypeError(f"__index__: only integer tensors can be indices (got "
                            f"{self._spec.dtype})")
        return int(self.item())

    # -- moves (explicit, as for NumPy handles) --------------------------------------------

    def to(self, *args: Any, node: int | None = None, **kwargs: Any) -> Any:
        """torch's to() (a dtype, a device, another tensor's), run on the worker; with
        `node=`, a copy on that node (the device stays unless given, as an mwrt index)."""
        if node is not None and node == self._node.index:  # itself, as torch's to() there
            moved = self.dist_send(node, kwargs.pop("device", None))
            return moved.to(*args, **kwargs) if args or kwargs else moved
        if node is not None:
            return self._moved(node, kwargs.pop("device", self._device), *args, **kwargs)
        if self._changes_nothing(args, kwargs):  # torch's rule: itself, no copy
            return self
        return dispatch(_torch().Tensor.to, (self, *args), kwargs)

    def _changes_nothing(self, args: tuple, kwargs: dict) -> bool:
        """Whether to(*args, **kwargs) names this tensor's own device and dtype, and no copy
        (clip_grad_norm_'s norm.to(first_device)): the meta device cannot run it."""
        if kwargs.get("copy") or any(isinstance(a, DistributedTensor) for a in args):
            return False
        try:  # (torch's own parse of to()'s arguments, as nn.Module.to uses it)
            device, dtype, _, memory_format = _torch()._C._nn._parse_to(
                *args, **{k: v for k, v in kwargs.items() if k != "copy"})
        except (TypeError, RuntimeError):
            return False
        return (device is None or device == self.device) and (
            dtype is None or dtype == self.dtype) and memory_format is None

    def dist_send(self, node: int | None = None, device: int | None = None) -> Any:
        """A copy on another node (worker to worker); the device stays unless given."""
        if node is None or node == self._node.index:
            return self if device in (None, self._device) else self._on(device)
        return self._moved(node, self._device if device is None else device)

    def cpu(self) -> Any:
        """This tensor in its node's host memory (itself if it is there)."""
        return self if self._device == HOST else self._on(HOST)

    def cuda(self, device: int | None = None, **kwargs: Any) -> Any:
        """On GPU `device` of the same node (0 unless given)."""
        return self._on(0 if device is None else device)

    def _moved(self, node: int, device: int, *args: Any, **kwargs: Any) -> Any:
        """A copy on another node (worker to worker, as its bytes); if this one needs grad
        (and grad is enabled), a backward there carries its gradient back here."""
        raw = transfer.move(bits(self, DistributedTensor), node, HOST)
        moved: Any
        if self._spec.requires_grad and _torch().is_grad_enabled():
            moved = arrive(raw, self, device, DistributedTensor)
        else:
            moved = from_raw(raw, str(self._spec.dtype), False, device, TorchTensor)
        return moved.to(*args, **kwargs) if args or kwargs else moved

    def _on(self, device: int) -> Any:
        """A copy on another device of its node (torch's to() there)."""
        device = self._node.check_device(device)
        where = "cpu" if device == HOST else f"cuda:{device}"
        # copy=True: on the meta device a move to "meta" would be the tensor itself
        return torch_call(_torch().Tensor.to, (self,), {"device": where, "copy": True},
                          device=device)


def ready() -> Any:
    """torch, imported, and TorchTensor given torch.Tensor's methods, before the first torch
    handle is made (nothing imports torch before)."""
    torch = torch_ready()
    if "matmul" not in TorchTensor.__dict__:
        install_methods(TorchTensor, dispatch)
        torchutils.clip_grad_takes(torch, TorchTensor)
    return torch


def dispatch(func: Callable, args: tuple, kwargs: dict) -> Any:
    """torch's `func` where its handles live: one place (torchissue), or a mesh
    (torchmesh); a backward (or autograd.grad) across nodes as walks on each
    (torchacross)."""
    read = _READS.get(func)
    if read is not None:  # a Python value of the tensors' values: read from the worker
        return read(*args, **kwargs)
    if func in _INDEXING and len(args) > 1:
        args = (args[0], _index_lists(args[1]), *args[2:])
    try:
        return torch_call(func, args, kwargs)
    except OnMesh:
        return torchmesh.call(func, args, kwargs)
    except Crossing:
        return torchacross.call(func, args, kwargs)
    except ValueError as exc:  # handles in several places: an error, unless autograd spans
        if func not in _across() or isinstance(exc, RemoteError):  # them (not a worker's)
            raise
    return torchacross.call(func, args, kwargs)


def install_methods(cls: type, call: Callable) -> None:
    """Give `cls` every method torch.Tensor hands to __torch_function__ that it lacks."""
    torch = _torch()
    from torch.overrides import get_overridable_functions, resolve_name

    _READS.update({torch.equal: _equal, torch.Tensor.equal: _equal,
                   torch.allclose: _allclose, torch.Tensor.allclose: _allclose})
    _INDEXING.update({torch.Tensor.__getitem__, torch.Tensor.__setitem__})

    for func in get_overridable_functions()[torch.Tensor]:
        name = (resolve_name(func) or "").removeprefix("torch.Tensor.")
        if name and "." not in name and name not in cls.__dict__ and name not in _OWN | _SKIPPED:
            setattr(cls, name, _method(func, call, name))
    for name in torchspec.NEW:  # torch hands them to __torch_function__, but lists them not
        if name not in cls.__dict__:
            setattr(cls, name, _method(getattr(torch.Tensor, name), call, name))
    for name in _UNARY:  # listed as neg, positive, abs: else NumPy's, inherited, would run
        setattr(cls, name, _method(getattr(torch.Tensor, name), call, name))
    for name in _PROPERTIES:
        setattr(cls, name, property(_getter(getattr(torch.Tensor, name).__get__, call),
                                    doc=f"torch.Tensor.{name}, on the tensor's worker."))


def _equal(a: Any, b: Any) -> bool:
    """torch.equal: the same shape and the same elements (NaN equals nothing); one wait."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    return bool((a == b).all())


def _allclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08,
              equal_nan: bool = False) -> bool:
    """torch.allclose: isclose everywhere (torch's own definition); one wait."""
    return bool(_torch().isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan).all())


# torch functions whose result is a Python value of the tensors' values, which torch's meta
# device cannot give: each an op on the worker and a read of its one element (filled by
# install_methods, with the first torch handle, as torch is imported then).
_READS: dict = {}


_INDEXING: set = set()  # torch.Tensor.__getitem__ and __setitem__ (filled with _READS)


def _index_lists(index: Any) -> Any:
    """An index's lists of ints or bools as tensors, as torch reads them (t[[2, 0]] takes
    rows 2 and 0): the wire carries a list as a tuple, which would index t[2, 0]."""
    if type(index) is list and len(index) < 32 and any(map(_index_like, index)):
        index = tuple(index)  # torch's legacy (deprecated) reading: t[[[1, 2], [0, 0]]]
    if type(index) is tuple:
        return tuple([_list_tensor(part) for part in index])
    return _list_tensor(index)


def _index_like(part: Any) -> bool:
    """True for what makes torch read a list index as a tuple of indices."""
    return part is None or part is Ellipsis or isinstance(
        part, (list, tuple, slice, DistributedTensor, _torch().Tensor))


def _list_tensor(part: Any) -> Any:
    """A list of ints or bools as a local tensor (sent with the command); else `part`."""
    if type(part) is not list:
        return part
    try:
        values = np.asarray(part)
    except ValueError:  # ragged: torch refuses it on the meta device
        return part
    if values.dtype.kind not in "biu" and values.size:  # slices, handles: as given
        return part
    return _torch().from_numpy(values.astype(bool if values.dtype.kind == "b" else np.int64))


def _across() -> tuple:
    torch = _torch()
    return (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward)


_NOT_LEAF = ("The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its "
             ".grad attribute won't be populated during autograd.backward(). If you indeed "
             "want the .grad field to be populated for a non-leaf Tensor, use .retain_grad() "
             "on the non-leaf Tensor.")  # torch's own warning

# Answered on the master, or meaningless for a remote tensor; properties run remotely.
_OWN = frozenset({"__repr__", "__format__", "__hash__", "__iter__", "__bool__", "__float__",
                  "__int__", "__complex__", "__index__", "__array__", "__array_wrap__",
                  "__deepcopy__", "__reduce_ex__", "__setstate__", "__dlpack__",
                  "__dlpack_device__", "__reversed__", "__contains__", "__dir__", "__sizeof__",
                  "__torch_function__", "__len__", "__array_priority__", "__class__",
                  "__init__", "__new__", "__getattribute__", "__setattr__", "__delattr__",
                  "get_device"})  # mwrt's and torch's alike: -1 on the host, else the GPU
_UNARY = ("__neg__", "__pos__", "__abs__", "__invert__")
_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
_SKIPPED = frozenset({"numpy", "tolist", "item", "data_ptr", "storage", "untyped_storage",
                      "register_hook", "register_post_accumulate_grad_hook", "share_memory_",
                      "pin_memory", "module_load", "cuda", "cpu", "to", "dist_send", "type"})


def _method(func: Callable, call: Callable, name: str) -> Callable:
    def method(self, *args, **kwargs):
        return call(func, (self, *args), kwargs)
    method.__name__, method.__qualname__ = name, f"TorchTensor.{name}"
    method.__doc__ = f"torch.Tensor.{name}, on the tensor's worker."
    return method


def _getter(func: Callable, call: Callable) -> Callable:
    def get(self):
        return call(func, (self,), {})
    return get


def _torch():
    import torch

    return torch
