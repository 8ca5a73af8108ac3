"""Making torch tensors on workers: mwrt.torch.zeros, ones, empty, full, randn, rand, tensor.

Each runs torch's own constructor on the worker (node=, device= as for NumPy handles; dtype
torch.float32 unless given) and returns a TorchTensor at once. With `mesh=` (or inside
`with mesh:`) each makes a mesh tensor as the NumPy constructors do: a block at every place,
replicated unless `shard=` names the axis (or the placements) to split; randn and rand draw
each distinct block once, from the generator of the worker that holds its first place, and
copy it to the places that replicate it (worker to worker), so replicas are equal.
"""

from __future__ import annotations

from typing import Any

from ..arrays import HOST, as_shape
from ..ops import torchspec
from . import context, torchmeshgrad
from .cluster import current
from .mesh.device_mesh import current_mesh, wanted
from .mesh.groups import broadcast_group
from .mesh.placement import ShardArg, local_box, shard_arg
from .torchissue import sent, torch_call
from .torchtensor import TorchTensor, ready


def put(tensor: Any, node: int | None = None, device: int | None = None,
        requires_grad: bool | None = None, **placement: Any) -> TorchTensor:
    """A local torch tensor copied to (node, device) as a torch tensor there."""
    ready()
    grad = tensor.requires_grad if requires_grad is None else requires_grad
    mesh, shard = placement.get("mesh"), placement.get("shard")
    if node is None and (mesh is not None or shard is not None or current_mesh() is not None):
        return _put_on_mesh(tensor, wanted(mesh, shard), shard, grad)
    target = current().node(context.current_node() if node is None else node)
    device = target.check_device(context.current_device() if device is None else device)
    made: Any = sent(tensor, target, device, grad, TorchTensor)
    return made


def _put_on_mesh(tensor: Any, mesh: Any, shard: Any, grad: bool) -> TorchTensor:
    """A local torch tensor laid over `mesh` as `shard` asks: each place gets its block."""
    placements = shard_arg(shard, tensor.ndim, mesh.ndim, "dist_send")
    shape = tuple(tensor.shape)
    blocks = [put(tensor[tuple(slice(lo, hi) for lo, hi in local_box(
        shape, placements, mesh.shape, coord))], node.index, device, requires_grad=grad)
        for node, (_, device), coord in zip(mesh.nodes, mesh.places, mesh.coords)]
    spec: Any = torchmeshgrad.mesh_spec(shape, tensor.dtype, grad)
    made: Any = TorchTensor.on_mesh(mesh, placements, blocks, spec)
    if grad:
        torchmeshgrad.remember(made, None)
    return made


def create(func_name: str, args: tuple, node: int | None, device: int | None, dtype,
           requires_grad: bool, mesh: Any = None, shard: ShardArg = None) -> TorchTensor:
    """A torch constructor (torch.zeros, ...) run on (node, device), or at every place of
    `mesh` (args[0]: the global shape)."""
    torch = ready()
    if node is None and (mesh is not None or shard is not None or current_mesh() is not None):
        return _create_on_mesh(func_name, args, wanted(mesh, shard), shard, dtype,
                               requires_grad)
    target = current().node(context.current_node() if node is None else node)
    device = target.check_device(context.current_device() if device is None else device)
    kwargs = {"dtype": torch.float32 if dtype is None else dtype,
              "device": "cpu" if device == HOST else f"cuda:{device}",
              "requires_grad": requires_grad}
    return torch_call(torchspec.function(func_name), args, kwargs, node=target, device=device,
                      results=TorchTensor)


_DRAWN = frozenset({"torch.randn", "torch.rand"})


def _create_on_mesh(func_name: str, args: tuple, mesh: Any, shard: ShardArg, dtype,
                    grad: bool) -> TorchTensor:
    """A constructor's tensor of global shape args[0] laid over `mesh` as `shard` asks: each
    place makes its block; a drawn block is drawn once and broadcast to its replicas."""
    shape = tuple(args[0])
    placements = shard_arg(shard, len(shape), mesh.ndim, func_name.removeprefix("torch."))
    drawn = func_name in _DRAWN
    holders: dict = {}  # a block's box -> the places that hold it
    blocks = []
    for i, (node, (_, device), coord) in enumerate(zip(mesh.nodes, mesh.places, mesh.coords)):
        box = local_box(shape, placements, mesh.shape, coord)
        holders.setdefault(box, []).append(i)
        name = "torch.empty" if drawn and len(holders[box]) > 1 else func_name
        local = tuple(hi - lo for lo, hi in box)
        blocks.append(create(name, (local, *args[1:]), node.index, device, dtype, False))
    for places in holders.values():
        if drawn and len(places) > 1:
            broadcast_group(mesh, [blocks[i] for i in places], 0)
    if grad:  # leaves that require grad, made so after their values are in
        blocks = [torch_call(ready().Tensor.requires_grad_, (b,), {}) for b in blocks]
    spec: Any = torchmeshgrad.mesh_spec(shape, blocks[0].dtype, grad)
    made: Any = TorchTensor.on_mesh(mesh, placements, blocks, spec)
    if grad:
        torchmeshgrad.remember(made, None)
    return made


def _shape(size: tuple) -> tuple:
    return as_shape(tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int)
                    else size)


def zeros(*size: Any, node: int | None = None, device: int | None = None, dtype: Any = None,
          requires_grad: bool = False, mesh: Any = None,
          shard: ShardArg = None) -> TorchTensor:
    """A torch tensor of zeros on (node, device)."""
    return create("torch.zeros", (_shape(size),), node, device, dtype, requires_grad, mesh,
                  shard)


def ones(*size: Any, node: int | None = None, device: int | None = None, dtype: Any = None,
         requires_grad: bool = False, mesh: Any = None,
          shard: ShardArg = None) -> TorchTensor:
    """A torch tensor of ones on (node, device)."""
    return create("torch.ones", (_shape(size),), node, device, dtype, requires_grad, mesh,
                  shard)


def empty(*size: Any, node: int | None = None, device: int | None = None, dtype: Any = None,
          requires_grad: bool = False, mesh: Any = None,
          shard: ShardArg = None) -> TorchTensor:
    """An uninitialized torch tensor on (node, device)."""
    return create("torch.empty", (_shape(size),), node, device, dtype, requires_grad, mesh,
                  shard)


def full(size: Any, fill_value: float, *, node: int | None = None, device: int | None = None,
         dtype: Any = None, requires_grad: bool = False, mesh: Any = None,
         shard: ShardArg = None) -> TorchTensor:
    """A torch tensor filled with `fill_value` on (node, device)."""
    shape = _shape(size if isinstance(size, tuple) else (size,))
    return create("torch.full", (shape, fill_value), node, device, dtype, requires_grad, mesh,
                  shard)


def randn(*size: Any, node: int | None = None, device: int | None = None, dtype: Any = None,
          requires_grad: bool = False, mesh: Any = None,
          shard: ShardArg = None) -> TorchTensor:
    """Standard normal draws from the worker's torch generator (see manual_seed)."""
    return create("torch.randn", (_shape(size),), node, device, dtype, requires_grad, mesh,
                  shard)


def rand(*size: Any, node: int | None = None, device: int | None = None, dtype: Any = None,
         requires_grad: bool = False, mesh: Any = None,
          shard: ShardArg = None) -> TorchTensor:
    """Uniform draws in [0, 1) from the worker's torch generator (see manual_seed)."""
    return create("torch.rand", (_shape(size),), node, device, dtype, requires_grad, mesh,
                  shard)


def tensor(data: Any, *, node: int | None = None, device: int | None = None, dtype: Any = None,
           requires_grad: bool = False, mesh: Any = None, shard: ShardArg = None) -> TorchTensor:
    """torch.tensor(data, dtype=dtype) made here and sent to (node, device), or laid over
    `mesh` as `shard` asks."""
    torch = ready()
    local = torch.tensor(data, dtype=dtype)
    return put(local, node, device, requires_grad=requires_grad, mesh=mesh, shard=shard)


def manual_seed(seed: int, node: int | None = None) -> None:
    """Seed the torch generator of a node's worker (every node's without `node`)."""
    ready()
    nodes = current().nodes if node is None else [current().node(node)]
    for target in nodes:
        torch_call(torchspec.function("torch.manual_seed"), (seed,), {}, node=target,
                   device=HOST, results=TorchTensor)
