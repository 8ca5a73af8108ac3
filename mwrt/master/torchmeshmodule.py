"""Modules, optimizers and LR schedulers replicated over a mesh: torch DDP from one program.

`mwrt.torch.module(model, mesh=m)` keeps one copy of the model at every place of `m` (each a
torchmodule.RemoteModule, the same values everywhere); its parameters are mesh handles placed
`Replicate()`. `model(x)` on a batch sent `Shard(0)` runs the forward at every place on its
rows and returns a `Shard(0)` handle (placements as torchmesh gives them). The optimizers of
`mwrt.torch.optim` made on such parameters are one torch optimizer per place; `opt.step()`
first sums the Partial gradients a backward left (one all_reduce of a flat bucket, worker to
worker), then steps every place alike, so the parameters stay equal everywhere. On one node,
`module` and `optim` are torchmodule's.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

from ..ops import torchmeta, torchspec
from . import torchmesh, torchmeshgrad, torchmodule
from .mesh.device_mesh import Mesh, current_mesh
from .mesh.placement import REPLICATE
from .torchtensor import TorchTensor, ready

_KEYS = itertools.count()


class MeshModule(torchmodule.RemoteModule):
    """A torch.nn.Module replicated at every place of a mesh (data parallel); its
    parameters() and named_parameters() are RemoteModule's, over mesh handles."""

    def __init__(self, model: Any, mesh: Mesh):
        torch = ready()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module (got {type(model).__name__})")
        if not isinstance(mesh, Mesh):
            raise ValueError(f"module: mesh= takes a mesh from mwrt.mesh() (got {mesh!r})")
        self.mesh, self.meta = mesh, copy.deepcopy(model).to("meta")
        self._places = [torchmodule.RemoteModule(model, node.index, device)
                        for node, (_, device) in zip(mesh.nodes, mesh.places)]
        self._key = ("mesh module", next(_KEYS))
        self._names = [name for name, _ in self.meta.named_parameters()]
        self._params: list[TorchTensor] = []
        places = [list(place.parameters()) for place in self._places]
        for k, meta in enumerate(self.meta.parameters()):
            blocks = [params[k] for params in places]
            spec: Any = torchspec.spec_of(meta)
            param: Any = TorchTensor.on_mesh(mesh, (REPLICATE,) * mesh.ndim, blocks, spec)
            torchmeshgrad.remember(param, None)
            self._params.append(param)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The forward at every place, on its blocks of the arguments; handles at once."""
        torch = ready()
        operands = torchmeshgrad.operands_of((args, kwargs))
        if not operands:
            raise TypeError("module: a mesh module's forward takes mesh tensors (got none); "
                            "send the batch with mwrt.dist_send(x, mesh=m, shard=0)")
        torchmesh.one_mesh("module", operands)
        if operands[0]._mesh != self.mesh:
            raise ValueError(f"module: the batch lies on {operands[0]._mesh!r}, the model on "
                             f"{self.mesh!r}; send it to the model's mesh")
        args, kwargs = torchmeshgrad.walk((args, kwargs), lambda t: torchmeshgrad.real(t)
                                      if torchmeshgrad.is_partial(t) else t)
        operands = torchmeshgrad.operands_of((args, kwargs))
        grad = torch.is_grad_enabled()
        gargs, gkwargs = torchmeshgrad.walk((args, kwargs), lambda t: t._spec)
        key = torchmeta.key_of((gargs, gkwargs))
        outcome = torchmeta.infer("module", self.meta, grad, gargs, gkwargs,
                                 None if key is None else (*self._key, grad, key))
        per_place = []
        for i, place in enumerate(self._places):
            largs, lkwargs = torchmeshgrad.walk((args, kwargs), lambda t, i=i: t._locals[i])
            per_place.append(place(*largs, **lkwargs))
        return torchmesh.results("module", self.mesh, operands, outcome, per_place, args,
                                 kwargs)

    forward = __call__

    def train(self, mode: bool = True) -> MeshModule:
        """Training mode at every place and in the meta copy."""
        self.meta.train(mode)
        for place in self._places:
            place.train(mode)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear its parameters' gradients at every place."""
        for place in self._places:
            place.zero_grad(set_to_none)
        _cleared(self._params, set_to_none)

    def state_dict(self) -> dict:
        """torch's state_dict, as local torch tensors: place 0's (every place's parameters
        are equal; its buffers are place 0's, as DDP broadcasts rank 0's)."""
        return self._places[0].state_dict()

    def buffers(self) -> Iterator[TorchTensor]:
        """Handles to place 0's buffers (state_dict's)."""
        return self._places[0].buffers()

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> Any:
        """torch's load_state_dict at every place (torch's checks first, at place 0)."""
        found = [place.load_state_dict(state_dict, strict) for place in self._places]
        return found[0]

    def __repr__(self) -> str:
        return f"MeshModule({self.mesh!r}, {self.meta!r})"


class _Replicas:
    """An optimizer's or scheduler's copies, one at every place, kept equal."""

    _places: list

    def state_dict(self) -> dict:
        """torch's state_dict: place 0's (every place's is equal), as local values."""
        return self._places[0].state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict at every place."""
        for place in self._places:
            place.load_state_dict(state_dict)


class MeshOptimizer(_Replicas):
    """A torch.optim optimizer at every place of its parameters' mesh."""

    def __init__(self, path: str, params: list, **options: Any):
        self.path, self.params = path, torchmodule._flat_params(params)
        mesh = self.params[0]._mesh
        if any(getattr(p, "_mesh", None) != mesh for p in self.params):
            raise ValueError(f"{path}: parameters on different meshes or nodes; one optimizer "
                             "per mesh")
        self._places = [torchmodule.RemoteOptimizer(path, _local(params, i), **options)
                        for i in range(mesh.size)]
        self._groups = torchmodule._group_params(params)

    @property
    def param_groups(self) -> list[torchmodule.ParamGroup]:
        """torch's param_groups, as views: a read asks place 0's worker (a sync point), a
        write of a plain value goes to every place's, before the next step."""
        return [torchmodule.ParamGroup(self.path, self._places, i, ps)
                for i, ps in enumerate(self._groups)]

    def step(self) -> None:
        """Sum the Partial gradients (one all_reduce between the workers), then step
        everywhere: the parameters stay equal at every place."""
        torchmeshgrad.all_reduce_grads(self.params)
        for place in self._places:
            place.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients at every place."""
        for place in self._places:
            place.zero_grad(set_to_none)
        _cleared(self.params, set_to_none)


class MeshScheduler(_Replicas):
    """A torch.optim.lr_scheduler scheduler at every place of its optimizer."""

    def __init__(self, path: str, optimizer: MeshOptimizer, *args: Any, **options: Any):
        self._places = [torchmodule.RemoteScheduler(path, opt, *args, **options)
                        for opt in optimizer._places]

    def step(self) -> None:
        """One step of the schedule at every place."""
        for place in self._places:
            place.step()

    def get_last_lr(self) -> list:
        """The learning rates of its last step, as torch's (a sync point)."""
        return self._places[0].get_last_lr()


def _local(params: Any, i: int) -> list:
    """The parameters' (or parameter groups') blocks at place i."""
    out: list = []
    for item in params:
        if isinstance(item, dict):
            out.append({**item, "params": [p._locals[i] for p in item["params"]]})
        else:
            out.append(item._locals[i])
    return out


def _cleared(params: list, set_to_none: bool) -> None:
    for p in params:  # zeros, where a gradient was, are placed as the parameter
        was = torchmeshgrad.placed(p)
        torchmeshgrad.remember(p, None if set_to_none or was is None else p._placements)


def module(model: Any, node: int | None = None, device: int | None = None,
           mesh: Mesh | None = None) -> Any:
    """`model` kept on (node, device), or replicated at every place of `mesh` (or of the mesh
    of a `with mesh:` block): its parameters live there, model(x) runs there."""
    if mesh is None and node is None:
        mesh = current_mesh()
    if mesh is not None:
        return MeshModule(model, mesh)
    return torchmodule.module(model, node, device)


def _optimizer(path: str, params: Any, **options: Any) -> Any:
    params = list(params) if not isinstance(params, TorchTensor) else params
    flat = torchmodule._flat_params(params)
    if flat and getattr(flat[0], "_mesh", None) is not None:
        return MeshOptimizer(path, params, **options)
    return torchmodule.RemoteOptimizer(path, params, **options)


def _scheduler(path: str, optimizer: Any, *args: Any, **options: Any) -> Any:
    if isinstance(optimizer, MeshOptimizer):
        return MeshScheduler(path, optimizer, *args, **options)
    return torchmodule.RemoteScheduler(path, optimizer, *args, **options)


# torch.optim's classes by name, made where the parameters live (a node, or a mesh)
optim: Any = torchmodule._Family("torch.optim", _optimizer)
optim.lr_scheduler = torchmodule._Family("torch.optim.lr_scheduler", _scheduler)
