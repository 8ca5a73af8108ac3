"""Modules, optimizers and LR schedulers that live where their parameters live.

`mwrt.torch.module(model, node=1)` sends the model's values (as torch handles) and its
structure (a copy on the meta device, no values) to node 1, where the module is rebuilt
through mwrt.remote's authenticated path (a model's class is the user's code); `model(x)`
then returns handles at once, its results' metadata from the meta copy the master keeps.
`mwrt.torch.optim.AdamW(model.parameters(), lr=1e-3)` makes torch's own optimizer on the
parameters' worker, from its class name (torch.optim's classes only), and `opt.step()`
runs there; `mwrt.torch.optim.lr_scheduler.StepLR(opt, ...)` likewise.
"""

from __future__ import annotations

import copy
import functools
import io
import itertools
import warnings
from collections.abc import Iterator, MutableMapping
from typing import Any

from ..arrays import HOST
from ..ops import torchops
from . import context, torchgrad
from .cluster import current
from .remote import RemoteFunction, by_value
from .tensor import DistributedTensor
from .torchcreation import put
from .torchissue import run
from .torchtensor import TorchTensor, ready

_KEYS = itertools.count()  # each module's meta rules are remembered apart


class RemoteModule:
    """A torch.nn.Module whose parameters and buffers live on one node's worker."""

    def __init__(self, model: Any, node: int | None = None, device: int | None = None):
        torch = ready()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module (got {type(model).__name__})")
        target = current().node(context.current_node() if node is None else node)
        device = target.check_device(context.current_device() if device is None else device)
        state = model.state_dict(keep_vars=True)
        values = [put(v, target.index, device, requires_grad=False) for v in state.values()]
        self.meta = copy.deepcopy(model).to("meta")
        by_value(type(model).__module__)  # a model of the user's own class goes as code
        self._key = ("module", next(_KEYS))
        build = RemoteFunction(functools.partial(torchops.build_module, self.meta,
                                                 tuple(state)), results=DistributedTensor,
                               objects=True)
        self._handle: DistributedTensor = build(*values)
        self._names = [name for name, _ in self.meta.named_parameters()]
        params = self._call("parameters", lambda: list(self.meta.parameters()), ())
        self._params: list[TorchTensor] = list(params) if params is not None else []

    def _call(self, method: str, func, args: tuple, kwargs: dict | None = None,
              written: bool = False) -> Any:
        uses = ((self._handle, written), *((p, False) for p in getattr(self, "_params", ())))
        return run(f"module.{method}", func, args, kwargs or {}, "torch_method",
                   (self._handle._ref, method), key=(*self._key, method), uses=uses,
                   results=TorchTensor)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward on the worker; returns handles at once."""
        return self._call("__call__", self.meta, args, kwargs, written=self.meta.training)

    forward = __call__

    def parameters(self) -> Iterator[TorchTensor]:
        """Handles to its parameters on the worker (the module's own tensors)."""
        return iter(self._params)

    def named_parameters(self) -> Iterator[tuple[str, TorchTensor]]:
        """(name, handle) of each parameter."""
        return zip(self._names, self._params)

    def train(self, mode: bool = True) -> RemoteModule:
        """Training mode (dropout, batch statistics) on the worker and in the meta copy."""
        self.meta.train(mode)
        self._call("train", _nothing, (mode,))
        return self

    def eval(self) -> RemoteModule:
        """Evaluation mode."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear its parameters' gradients on the worker."""
        self._call("zero_grad", _nothing, (), {"set_to_none": set_to_none}, written=True)
        if set_to_none:
            for p in self._params:
                torchgrad.set_filled(p, False)

    @property
    def training(self) -> bool:
        """Whether it is in training mode (train(), eval()), as torch's attribute."""
        return self.meta.training

    def buffers(self) -> Iterator[TorchTensor]:
        """Handles to its buffers on the worker (a batch norm's running statistics)."""
        return iter(self._call("buffers", lambda: list(self.meta.buffers()), ()) or [])

    def named_buffers(self) -> Iterator[tuple[str, TorchTensor]]:
        """(name, handle) of each buffer."""
        return zip([name for name, _ in self.meta.named_buffers()], self.buffers())

    def state_dict(self) -> dict:
        """torch's state_dict: its parameters' and buffers' values, by torch's names and in
        its order, as local torch tensors (a sync point)."""
        names = list(self.meta.state_dict())
        values = self._call("state_dict", lambda: list(self.meta.state_dict().values()), ())
        return dict(zip(names, [v.torch() for v in values or ()], strict=True))

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> Any:
        """torch's load_state_dict: values (local tensors, or handles on its node) copied
        into its parameters and buffers on the worker; torch's errors for missing,
        unexpected or misshapen entries, raised here before anything is sent."""
        torch = ready()
        with warnings.catch_warnings():  # (the copies into a meta module that copy nothing)
            warnings.simplefilter("ignore", UserWarning)
            found = self.meta.load_state_dict(  # (on the meta copy: torch's checks, no values)
                {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in
                 state_dict.items()}, strict=strict)
        index, device = self._handle._node.index, self._handle._device
        values = {k: v if isinstance(v, TorchTensor) else put(v, index, device,
                                                             requires_grad=False)
                  for k, v in state_dict.items()}
        uses = ((self._handle, True), *((p, True) for p in self._params))
        run("module.load_state_dict", _nothing, (values,), {"strict": strict}, "torch_method",
            (self._handle._ref, "load_state_dict"), key=(*self._key, "load_state_dict"),
            uses=uses)
        return found

    def __repr__(self) -> str:
        node = self._handle._node.index
        return f"RemoteModule(node={node}, device={self._handle._device}, {self.meta!r})"


class RemoteOptimizer:
    """A torch.optim optimizer made, and stepped, on its parameters' worker."""

    def __init__(self, path: str, params: Any, **options: Any):
        torch = ready()
        params = list(params) if not isinstance(params, TorchTensor) else params
        self.params = _flat_params(params)
        if not self.params or not all(isinstance(p, TorchTensor) for p in self.params):
            raise TypeError(f"{path}: expected torch handles as parameters (got "
                            f"{[type(p).__name__ for p in self.params][:3]}); put a model's "
                            "with mwrt.torch.module(model, node=...) first")
        self.path, self._groups = path, _group_params(params)
        self.handle = run(path, _fake(torch, path), (_groups_arg(params),), options,
                          "torch_new", (path,))

    @property
    def param_groups(self) -> list[ParamGroup]:
        """torch's param_groups, as views of the worker's: a read asks it (a sync point), a
        write of a plain value (lr, momentum, betas ...) goes to it before the next step."""
        return [ParamGroup(self.path, [self], i, ps) for i, ps in enumerate(self._groups)]

    def step(self) -> None:
        """One step of the optimizer on the worker (the parameters are written there)."""
        self._call("step", ())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients on the worker."""
        self._call("zero_grad", (), {"set_to_none": set_to_none})
        if set_to_none:
            for p in self.params:
                torchgrad.set_filled(p, False)

    def state_dict(self) -> dict:
        """torch's state_dict (its state and param_groups), as local tensors and values, for
        torch.save (a sync point)."""
        return _state_of(self.handle)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict on the worker (a state_dict of the same optimizer's)."""
        _load_into(self.handle, state_dict)

    def _call(self, method: str, args: tuple, kwargs: dict | None = None) -> None:
        uses = ((self.handle, True), *((p, True) for p in self.params))
        run(f"{self.path}.{method}", _nothing, args, kwargs or {}, "torch_method",
            (self.handle._ref, method), uses=uses)

    def _read_groups(self) -> list:
        """Its param_groups on the worker, but their params (a sync point)."""
        return _state_of(self.handle, torchops.saved_groups)

    def _set_group(self, index: int, key: str, value: Any) -> None:
        """param_groups[index][key] = value on the worker, in stream order."""
        method = "param_groups.__setitem__"
        run(f"{self.path}.param_groups[{index}][{key!r}]", _nothing, (index, key, value), {},
            "torch_method", (self.handle._ref, method), uses=((self.handle, True),))


class ParamGroup(MutableMapping):
    """One of an optimizer's param_groups, as torch's dict: a read asks the worker (of its
    first place, on a mesh), a write of a plain value goes to every place in stream order."""

    def __init__(self, path: str, places: list, index: int, params: list):
        self._where = f"{path}.param_groups[{index}]"
        self._places, self._index, self._params = places, index, params

    def _options(self) -> dict:
        return self._places[0]._read_groups()[self._index]

    def __getitem__(self, key: str) -> Any:
        return list(self._params) if key == "params" else self._options()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "params" or not isinstance(key, str):
            raise TypeError(f"{self._where}: {key!r} cannot be set (got key {key!r}, expected "
                            "an option such as 'lr'); a group's params are set when the "
                            "optimizer is made")
        if not _plain(value):
            raise TypeError(f"{self._where}[{key!r}]: expected a plain Python value (got "
                            f"{type(value).__name__}, expected a number, bool, string, None or "
                            "a tuple of them, as betas); pass float(t) for a tensor's value")
        for place in self._places:
            place._set_group(self._index, key, value)

    def __delitem__(self, key: str) -> None:
        raise TypeError(f"{self._where}: an option cannot be removed (got del {key!r}); set "
                        "it instead")

    def __iter__(self) -> Iterator[str]:
        return iter(["params", *self._options()])

    def __len__(self) -> int:
        return 1 + len(self._options())

    def __repr__(self) -> str:
        return f"<{self._where}: a view of the worker's group>"


class RemoteScheduler:
    """A torch.optim.lr_scheduler scheduler made, and stepped, on its optimizer's worker."""

    def __init__(self, path: str, optimizer: RemoteOptimizer, *args: Any, **options: Any):
        if not isinstance(optimizer, RemoteOptimizer):
            raise TypeError(f"{path}: expected an mwrt.torch.optim optimizer (got "
                            f"{type(optimizer).__name__})")
        self.path, self.optimizer = path, optimizer
        self.handle = run(path, _fake(ready(), path), (optimizer.handle, *args), options,
                          "torch_new", (path,))

    def step(self) -> None:
        """One step of the schedule (the optimizer's learning rate changes on the worker)."""
        run(f"{self.path}.step", _nothing, (), {}, "torch_method", (self.handle._ref, "step"),
            uses=((self.handle, True), (self.optimizer.handle, True)))

    def get_last_lr(self) -> list:
        """The learning rates of its last step, as torch's (a sync point)."""
        return list(self.state_dict()["_last_lr"])

    def state_dict(self) -> dict:
        """torch's state_dict of the scheduler, as local values (a sync point)."""
        return _state_of(self.handle)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict on the worker."""
        _load_into(self.handle, state_dict)


def _state_of(handle: DistributedTensor, reader: Any = torchops.saved_state) -> Any:
    """The state_dict of the optimizer or scheduler `handle` names (what `reader` saves of
    it), read back as torch.save wrote it on the worker (torch.load of tensors and plain
    values alone)."""
    torch = ready()
    saved = RemoteFunction(reader)(handle)
    return torch.load(io.BytesIO(saved.torch().numpy().tobytes()), weights_only=True)


def _load_into(handle: DistributedTensor, state_dict: dict) -> None:
    """state_dict loaded into the optimizer or scheduler `handle` names, on its worker."""
    torch = ready()
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    data = put(torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8),
               handle._node.index, handle._device)
    RemoteFunction(torchops.load_state, outputs=0)(handle, data)


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The meta rule of a call that makes no tensor."""


def _fake(torch, path: str):
    """The meta rule of an optimizer or scheduler's making: one object, a 0-d handle."""

    def made(*args: Any, **kwargs: Any):
        return torch.empty((), device="meta")
    return made


_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    """Whether `value` is a number, bool, string, None, or a tuple or list of them."""
    if isinstance(value, (tuple, list)):
        return all(isinstance(v, _PLAIN) for v in value)
    return isinstance(value, _PLAIN)


def _group_params(params: Any) -> list:
    """The handles of each param group (one group when `params` names no groups)."""
    if isinstance(params, list) and params and isinstance(params[0], dict):
        return [_listed(item["params"]) for item in params]
    return [_flat_params(params)]


def _groups_arg(params) -> list:
    """What torch's optimizer takes, with each group's params a list."""
    return [{**item, "params": _listed(item["params"])} if isinstance(item, dict) else item
            for item in params]


def _listed(params) -> list:
    return [params] if isinstance(params, TorchTensor) else list(params)


def _flat_params(params) -> list:
    if isinstance(params, TorchTensor):
        raise TypeError("optimizer: params must be an iterable of handles (got one handle)")
    found: list = []
    for item in params:
        found.extend(_listed(item["params"]) if isinstance(item, dict) else [item])
    return found


def module(model: Any, node: int | None = None, device: int | None = None) -> RemoteModule:
    """`model` kept on (node, device): its parameters live there, model(x) runs there."""
    return RemoteModule(model, node, device if device is not None else HOST)


class _Family:
    """mwrt.torch.optim (or its lr_scheduler): torch.optim's classes by name, made remote."""

    def __init__(self, prefix: str, maker: Any):
        self._prefix, self._maker = prefix, maker

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return functools.partial(self._maker, f"{self._prefix}.{name}")


optim: Any = _Family("torch.optim", RemoteOptimizer)
optim.lr_scheduler = _Family("torch.optim.lr_scheduler", RemoteScheduler)
