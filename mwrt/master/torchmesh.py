"""torch's functions on torch handles laid over a mesh: data parallel, as torch DDP runs it.

A torch op on mesh tensors runs at every place on that place's blocks (one `torch` command
each, through torchissue), as each DDP rank runs the same program on its part of the batch.
The result's placements come from shapes, with torch's meta device on the master: an output
whose blocks are the blocks of its global shape split along one axis is `Shard(axis)` (along
the mesh dimensions that split the operands, which must be the same for all of them); one
made from Replicate operands alone is `Replicate()`; a sum over the sharded axis (`x.sum()`,
`x.T @ y`, a loss with reduction="sum") is `Partial("sum")` along those mesh dimensions
(Replicate along the others), and a mean over it (`x.mean()`,
a loss's default reduction="mean") is `Partial("sum")` too, each place's part weighted by its
share of the rows (n_i / N), so that the sum of the parts is the mean over every row. Any
other op that would mix rows across places (`softmax(x, 0)`, `cumsum(0)`, `argmax(0)`) is
refused by name. A Partial operand is made real first (an all_reduce worker to worker); one
that requires grad into a tensor that stays in autograd's graph (torchmeshgrad.real).

Backward, gradients and their placements are torchmeshgrad's. The gradients of a backward
from a Partial loss are Partial, as DDP's averaged gradient (DDP divides each rank's gradient
by the world size, then sums): the same values, up to the order of the sums.
"""

from __future__ import annotations

from typing import Any

from ..ops import Spec, torchmeta, torchspec
from ..ops.torchspec import TorchSpec
from . import torchissue, torchmeshgrad
from .handle import Handle
from .mesh.moves import gather_to_master
from .mesh.placement import REPLICATE, Shard, describe, local_shape
from .mesh.plan import PlacementError
from .torchmeshgrad import PARTIAL, is_partial, operands_of, real, remember, replicated, walk

_SUMS = frozenset({"torch.sum", "torch.Tensor.sum", "torch.matmul", "torch.Tensor.matmul",
                   "torch.Tensor.__matmul__", "torch.mm", "torch.Tensor.mm", "torch.einsum",
                   "torch.tensordot", "torch.Tensor.__rmatmul__"})
_MEANS = frozenset({"torch.mean", "torch.Tensor.mean"})
_LOSSES = frozenset(f"torch.nn.functional.{n}" for n in (
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss"))
# Ops that keep a shape and mix values along a dim they are given: refused along a sharded one.
_ALONG = frozenset(f"torch.{n}" for p in ("", "Tensor.") for n in (
    f"{p}softmax", f"{p}log_softmax", f"{p}cumsum", f"{p}cumprod", f"{p}cummax", f"{p}cummin",
    f"{p}logcumsumexp", f"{p}sort", f"{p}argsort", f"{p}flip", f"{p}roll", f"{p}diff",
    f"{p}renorm")) | {"torch.nn.functional.softmax", "torch.nn.functional.log_softmax",
                      "torch.nn.functional.normalize", "torch.nn.functional.glu"}
_BACKWARD = frozenset({"torch.Tensor.backward", "torch.autograd.backward"})
_GRAD_GET, _GRAD_SET = "torch.Tensor.grad.__get__", "torch.Tensor.grad.__set__"
_NAMES: dict = {}


def call(func, args: tuple, kwargs: dict):
    """torch's `func` on mesh torch handles, at every place; handles over the mesh."""
    name = _NAMES.get(func) or _NAMES.setdefault(func, torchspec.name_of(func))
    operands = operands_of((args, kwargs))
    mesh = one_mesh(name, operands)
    if name in _BACKWARD:
        return torchmeshgrad.backward(func, args, kwargs, operands)
    if name == "torch.autograd.grad":
        return torchmeshgrad.autograd_grad(func, args, kwargs, operands)
    if name == _GRAD_GET:
        return torchmeshgrad.grad_of(operands[0])
    if name == _GRAD_SET:
        return torchmeshgrad.set_grad(args[0], args[1])
    if any(is_partial(t) for t in operands):
        args, kwargs = walk((args, kwargs), lambda t: real(t) if is_partial(t) else t)
        operands = operands_of((args, kwargs))
    grad = torchissue.ready().is_grad_enabled()
    gargs, gkwargs = walk((args, kwargs), lambda t: t._spec)
    key = torchmeta.key_of((gargs, gkwargs))
    outcome = torchmeta.infer(name, func, grad, gargs, gkwargs,
                             None if key is None else ("mesh", name, grad, key))
    if outcome.value is not None and not outcome.written:
        return outcome.value  # metadata alone (a.size(), a.dim()): the global answer
    sharded = [t for t in operands if not replicated(t._placements)]
    _aligned(name, sharded)
    for i in outcome.written:
        if sharded and replicated(operands[i]._placements):
            raise PlacementError(f"{name}: writes a replicated tensor from sharded operands "
                                 f"({describe(sharded[0]._placements)}); each place would "
                                 "write its own rows into it: write a sharded tensor, or "
                                 "reduce the sharded one first")
    if sharded and name in _ALONG and _along_sharded(args, kwargs, sharded[0]):
        raise PlacementError(f"{name}: mixes values along the sharded axis "
                             f"({describe(sharded[0]._placements)}); each place would see "
                             "only its rows: work along another axis")
    per_place = [torchissue.torch_call(func, *walk((args, kwargs), lambda t, i=i:
                                                     t._locals[i]))
                 for i in range(mesh.size)]
    for index, spec in outcome.respec:  # requires_grad_(), t_(): the whole changed as well
        operands[index]._spec = spec
    made = results(name, mesh, operands, outcome, per_place, args, kwargs)
    if name == "torch.Tensor.requires_grad_":
        remember(made, None)
    return made


def results(name, mesh, operands, outcome, per_place, args, kwargs):
    """The mesh handles of the places' results, placed as the module's doc says."""
    handle = type(operands[0])
    sharded = [t for t in operands if not replicated(t._placements)]
    trees: list = []
    for result in per_place:
        leaves: list = []
        torchmeta.flatten(result, leaves, Handle)
        trees.append(leaves)
    made = []
    for j, (spec, same, _) in enumerate(outcome.outs):
        if same >= 0:
            made.append(operands[same])
            continue
        blocks = [leaves[j] for leaves in trees]
        placements = _placements(name, mesh, spec, blocks, sharded, kwargs)
        if any(p == PARTIAL for p in placements) and _mean(name, args, kwargs):
            mul = _torch().mul  # (its meta rule; the worker's torch_scale saves no tensor)
            blocks = [torchissue.run("torch.mul", mul, (b, _share(sharded[0], i)), {},
                                     "torch_scale", ()) for i, b in enumerate(blocks)]
        made.append(handle.on_mesh(mesh, placements, blocks, spec))
    if outcome.tree is None:
        return made[0] if made else None
    return torchmeta.unflatten(outcome.tree, iter(made))


def _placements(name, mesh, spec: TorchSpec, blocks: list, sharded: list, kwargs) -> tuple:
    """The placements of one output of `name`, from its global and its blocks' shapes."""
    if not sharded:
        return (REPLICATE,) * mesh.ndim
    given = sharded[0]._placements
    shape = tuple(spec.shape)
    local = [tuple(b._spec.shape) for b in blocks]
    differ = {a for block in local for a, (g, n) in enumerate(zip(shape, block)) if g != n}
    if not differ and all(block == shape for block in local):
        if mesh.size == 1 and not (name in _SUMS or name in _MEANS or name in _LOSSES):
            return (REPLICATE,) * mesh.ndim  # one place holds the whole, however it was placed
        if name in _SUMS or name in _MEANS or (name in _LOSSES and kwargs.get(
                "reduction", "mean") in ("mean", "sum", "batchmean")):
            return tuple(PARTIAL if type(p) is Shard else REPLICATE for p in given)
    elif len(differ) == 1:
        axis = differ.pop()  # split along the mesh dimensions that split the operand
        placements = tuple(Shard(axis) if type(p) is Shard else REPLICATE for p in given)
        if all(local_shape(shape, placements, mesh.shape, c) == block
               for c, block in zip(mesh.coords, local)):
            return placements
    raise PlacementError(f"{name}: no placement rule for its result on sharded operands "
                         f"({describe(sharded[0]._placements)}; global shape {list(shape)}, "
                         f"blocks {[list(b) for b in local]}); only ops that keep rows apart, "
                         "sums and means over the sharded axis run on a sharded batch: "
                         "compute it inside the model, or on a replicated tensor")


def _mean(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a Partial result of `name` is a mean (each part weighted by its rows)."""
    if name in _MEANS:
        return True
    return name in _LOSSES and kwargs.get("reduction", "mean") in ("mean", "batchmean")


def _share(t, i: int) -> float:
    """Place i's share of t's rows along its sharded axis (n_i / N)."""
    axis = next(p.axis for p in t._placements if type(p) is Shard)
    return t._locals[i]._spec.shape[axis] / t._spec.shape[axis]


def _along_sharded(args: tuple, kwargs: dict, t) -> bool:
    """Whether an op of _ALONG is given a dim (its second argument, or dim=/dims=) that
    names t's sharded axis."""
    axes = {p.axis for p in t._placements if type(p) is Shard}
    given = [kwargs.get("dim"), kwargs.get("dims"), *args[1:2]]
    ndim = len(t._spec.shape)
    for value in given:
        for d in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(d, int) and not isinstance(d, bool) and d % max(ndim, 1) in axes:
                return True
    return False


# -- values --------------------------------------------------------------------------------

def fetch(t, numpy_handle: Any):
    """t's whole value on the master (a NumPy array): each distinct block once, straight
    from its worker; a Partial t is made real first, worker to worker."""
    if is_partial(t):
        t = real(t, graph=False)
    blocks = [torchissue.bits(b, numpy_handle) for b in t._locals]
    spec = Spec(tuple(t._spec.shape), blocks[0].spec.dtype)
    return gather_to_master(numpy_handle.on_mesh(t._mesh, t._placements, blocks, spec))


# -- helpers -------------------------------------------------------------------------------

def _aligned(name: str, sharded: list) -> None:
    """Sharded operands must be split along the same mesh dimensions (their rows at one
    place are then the same rows), whichever of their axes each splits."""
    split = [tuple(type(p) is Shard for p in t._placements) for t in sharded]
    if any(s != split[0] for s in split[1:]):
        other = next(t for t, s in zip(sharded, split) if s != split[0])
        raise PlacementError(f"{name}: operands split along different mesh dimensions "
                             f"({describe(sharded[0]._placements)} and "
                             f"{describe(other._placements)}); each place would meet "
                             "other rows: redistribute one to the other's placements")


def one_mesh(name: str, operands: list):
    mesh = operands[0]._mesh
    for t in operands:
        if t._mesh is None:
            raise PlacementError(f"{name}: a torch tensor on one node (node {t.get_node()}) "
                                 "meets a mesh tensor; put it on the mesh "
                                 "(mwrt.dist_send(tensor, mesh=m))")
        if t._mesh != mesh:
            raise PlacementError(f"{name}: operands lie on different meshes ({mesh!r} and "
                                 f"{t._mesh!r}); put them on one mesh first")
    for node in mesh.nodes:  # all or none: a lost node is named before any place runs it
        if node.lost is not None:
            node.check_lost()
    return mesh


def _torch():
    return torchissue.ready()
