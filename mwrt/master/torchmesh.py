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
refused by name. A Partial operand is made real first (mesh/moves.resolve, an all_reduce
worker to worker); one that requires grad is made real in a detached copy, as the all_reduce
is not differentiated: `backward()` runs on the parts.

`loss.backward()` on a Partial (or Shard) loss runs at every place and leaves each place a
part of each parameter's gradient: the gradients are `Partial("sum")`, and their sum is the
gradient of the mean over the whole batch. That is DDP's averaged gradient (DDP divides each
rank's gradient by the world size, then sums): the same values, up to the order of the
sums. The optimizer step (torchmeshmodule) resolves them by one all_reduce of a flat bucket
between the workers, never through the master; reading `p.grad` resolves them too.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from ..ops import Spec, torchops
from ..ops.torchops import TorchSpec
from . import torchgrad, torchissue
from .handle import Handle
from .mesh.moves import all_reduce_group, gather_to_master, resolve
from .mesh.placement import REPLICATE, Partial, Shard, describe, local_shape
from .mesh.plan import PlacementError

PARTIAL = Partial("sum")
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
# Leaves that require grad, per mesh: id -> (weak reference, their gradients' placements or
# None while they have none). A backward changes them all (see _backward).
_LEAVES: dict = {}
_AFTER: dict = {}  # mesh -> the modules told after each backward on it (see after_backward)


def call(func, args: tuple, kwargs: dict):
    """torch's `func` on mesh torch handles, at every place; handles over the mesh."""
    name = _NAMES.get(func) or _NAMES.setdefault(func, torchops.name_of(func))
    operands = operands_of((args, kwargs))
    mesh = one_mesh(name, operands)
    if name in _BACKWARD:
        return _backward(func, name, args, kwargs, operands)
    if name == "torch.autograd.grad":
        return _autograd_grad(func, args, kwargs, operands)
    if name == _GRAD_GET:
        return grad_of(operands[0])
    if name == _GRAD_SET:
        return _set_grad(func, args, operands)
    if any(is_partial(t) for t in operands):
        args, kwargs = walk((args, kwargs), lambda t: real(t) if is_partial(t) else t)
        operands = operands_of((args, kwargs))
    grad = torchissue.ready().is_grad_enabled()
    gargs, gkwargs = walk((args, kwargs), lambda t: t._spec)
    key = torchops.key_of((gargs, gkwargs))
    outcome = torchops.infer(name, func, grad, gargs, gkwargs,
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
        torchops.flatten(result, leaves, Handle)
        trees.append(leaves)
    made = []
    for j, (spec, same, _) in enumerate(outcome.outs):
        if same >= 0:
            made.append(operands[same])
            continue
        blocks = [leaves[j] for leaves in trees]
        placements = _placements(name, mesh, spec, blocks, sharded, kwargs)
        if any(p == PARTIAL for p in placements) and _mean(name, args, kwargs):
            blocks = [torchissue.torch_call(_torch().mul, (b, _share(sharded[0], i)), {})
                      for i, b in enumerate(blocks)]
        made.append(handle.on_mesh(mesh, placements, blocks, spec))
    if outcome.tree is None:
        return made[0] if made else None
    return torchops.unflatten(outcome.tree, iter(made))


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


# -- autograd ------------------------------------------------------------------------------

def _backward(func, name: str, args: tuple, kwargs: dict, operands: list):
    """backward() at every place; the leaves' gradients are Partial after a Partial or
    sharded root (each place holds its part), Replicate after a replicated one."""
    mesh = operands[0]._mesh
    wanted = _parts(mesh, operands)
    for leaf, now in _leaves_of(mesh):
        if not replicated(leaf._placements):  # a sharded leaf's gradient is sharded alike
            remember(leaf, leaf._placements)
            continue
        if now is not None and now != wanted:
            if PARTIAL in now:  # the parts summed first: the whole everywhere
                _all_reduce_grads(mesh, [leaf])
            if PARTIAL in wanted:  # the whole at one place of each line, zeros elsewhere
                dims = [d for d, p in enumerate(wanted) if p == PARTIAL]
                for g, coord in zip(grad_blocks(leaf), mesh.coords):
                    if any(coord[d] for d in dims):
                        torchissue.torch_call(_torch().Tensor.zero_, (g,), {})
        remember(leaf, wanted)
    for i in range(mesh.size):
        torchissue.torch_call(func, *walk((args, kwargs), lambda t, i=i: t._locals[i]))
    for module in list(_AFTER.get(mesh, ())):  # a sharded module's reduce_scatter
        module.backward_done()
    for leaf, _ in _leaves_of(mesh):  # one the backward did not reach keeps None
        if not torchgrad.filled(leaf._locals[0]):
            remember(leaf, None)


def _parts(mesh, roots: list) -> tuple:
    """How gradients from `roots` lie: parts along the mesh dimensions that split (or part)
    a root, whole along the others."""
    return tuple(REPLICATE if all(type(t._placements[d]) is type(REPLICATE) for t in roots)
                 else PARTIAL for d in range(mesh.ndim))


def _autograd_grad(func, args: tuple, kwargs: dict, operands: list) -> tuple:
    """torch.autograd.grad at every place: each input's gradient placed as a backward
    leaves it (sharded as a sharded input, else as _parts says)."""
    mesh = operands[0]._mesh
    outputs = args[0] if args else kwargs["outputs"]
    inputs = args[1] if len(args) > 1 else kwargs["inputs"]
    inputs = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    parts = _parts(mesh, operands_of(outputs))
    per_place = [torchissue.torch_call(func, *walk((args, kwargs), lambda t, i=i:
                                                     t._locals[i]))
                 for i in range(mesh.size)]
    made = []
    for j, x in enumerate(inputs):
        blocks = [grads[j] for grads in per_place]
        placements = x._placements if not replicated(x._placements) else parts
        spec = mesh_spec(tuple(x._spec.shape), x._spec.dtype, blocks[0]._spec.requires_grad)
        made.append(type(x).on_mesh(mesh, placements, blocks, spec))
    return tuple(made)


def after_backward(mesh, module) -> None:
    """Have `module.backward_done()` run after every backward on `mesh` (while the module
    lives): a sharded module moves its gradients to its shards then."""
    _AFTER.setdefault(mesh, weakref.WeakSet()).add(module)


def remember(leaf, placements: tuple | None) -> None:
    """Record how a leaf's gradient lies over its mesh (None: it has none); the handle
    leaf.grad gave follows (torch accumulates into that tensor), or is dropped with it."""
    key = id(leaf)
    found = _LEAVES.get(key)
    if found is None:
        found = _LEAVES[key] = [weakref.ref(leaf, functools.partial(_forget, key)), None, None]
    found[1] = placements
    if placements is None:
        found[2] = None
    elif found[2] is not None:
        found[2]._placements = placements


def _forget(key: int, _ref) -> None:
    _LEAVES.pop(key, None)


def placed(leaf) -> tuple | None:
    """How a leaf's gradient lies (None: it has none, or it is no known leaf); a handle
    leaf.grad gave, made real since, says."""
    found = _LEAVES.get(id(leaf))
    if found is None:
        return None
    return found[2]._placements if found[2] is not None else found[1]


def _leaves_of(mesh) -> list:
    found = []
    for entry in list(_LEAVES.values()):
        leaf = entry[0]()
        if leaf is not None and leaf._mesh == mesh:
            found.append((leaf, placed(leaf)))
    return found


def grad_blocks(leaf) -> list:
    """Each place's handle to the leaf's gradient there."""
    getter = _torch().Tensor.grad.__get__
    return [torchissue.torch_call(getter, (block,), {}) for block in leaf._locals]


def grad_of(leaf):
    """leaf.grad over the mesh (the same handle until the gradient is cleared); a Partial
    gradient is resolved first (one all_reduce)."""
    if not leaf._spec.requires_grad or not torchgrad.filled(leaf._locals[0]):
        return None  # as torch's, until a backward reached it
    if PARTIAL in (placed(leaf) or ()):
        _all_reduce_grads(leaf._mesh, [leaf])
    found = _LEAVES.get(id(leaf))
    if found is not None and found[2] is not None:
        return found[2]
    spec = leaf._spec
    made = type(leaf).on_mesh(leaf._mesh, placed(leaf) or leaf._placements, grad_blocks(leaf),
                              TorchSpec(spec.shape, spec.dtype, spec.stride, False, True))
    if found is not None and found[1] is not None:
        found[2] = made
    return made


def _set_grad(func, args: tuple, operands: list) -> None:
    leaf, value = args[0], args[1]
    if value is not None and value._placements != leaf._placements:
        raise PlacementError(f"grad: a gradient placed {describe(value._placements)} for a "
                             f"tensor placed {describe(leaf._placements)}; place it alike")
    for i in range(leaf._mesh.size):
        torchissue.torch_call(func, (leaf._locals[i], None if value is None else
                                     value._locals[i]), {})
    remember(leaf, None)  # the handle leaf.grad gave names the gradient it replaced
    if value is not None:
        remember(leaf, value._placements)


def _all_reduce_grads(mesh, leaves: list) -> None:
    """Sum the leaves' Partial gradients at every place: one all_reduce of a flat bucket per
    dtype and Partial mesh dimensions (each place's gradients concatenated, then copied
    back), along each of those dimensions, worker to worker."""
    by_dtype: dict = {}
    for leaf in leaves:
        dims = tuple(d for d, p in enumerate(placed(leaf) or ()) if p == PARTIAL)
        by_dtype.setdefault((leaf._spec.dtype, dims), []).append(leaf)
    for (dtype, dims), group in by_dtype.items():
        total = sum(leaf.numel() for leaf in group)
        bucket = _bucket_rule(dtype, total)
        buckets = [torchissue.run("grads.flat", bucket, tuple(leaf._locals[i] for leaf in group),
                                  {}, "torch_grads_flat", (), key=("grads.flat", dtype, total))
                   for i in range(mesh.size)]
        for d in dims:
            for line in mesh.groups(d):
                all_reduce_group(mesh, buckets, line, "sum")
        for i in range(mesh.size):
            torchissue.run("grads.set", _nothing, (buckets[i], *(leaf._locals[i]
                                                                 for leaf in group)),
                           {}, "torch_grads_set", ())
    for leaf in leaves:
        remember(leaf, (REPLICATE,) * mesh.ndim)


def _bucket_rule(dtype, total: int):
    """The meta rule of a bucket: one flat tensor of `total` elements."""
    def made(*params):
        return _torch().empty(total, dtype=dtype, device="meta")
    return made


def _nothing(*args) -> None:
    """The meta rule of a call that makes no tensor."""


def all_reduce_grads(leaves: list) -> None:
    """Resolve the Partial gradients among `leaves` (the optimizer step's all_reduce)."""
    partial = [leaf for leaf in leaves if PARTIAL in (placed(leaf) or ())]
    if partial:
        _all_reduce_grads(partial[0]._mesh, partial)


# -- values --------------------------------------------------------------------------------

def real(t):
    """t made real: in place (mesh/moves.resolve), or, for a tensor that requires grad (a
    loss), in a detached copy, leaving t's parts for backward()."""
    if not t._spec.requires_grad:
        resolve(t)
        return t
    torch = _torch()
    copies = [torchissue.torch_call(torch.Tensor.detach, (b,), {}) for b in t._locals]
    copies = [torchissue.torch_call(torch.Tensor.clone, (b,), {}) for b in copies]
    spec = t._spec
    made = type(t).on_mesh(t._mesh, t._placements, copies,
                           TorchSpec(spec.shape, spec.dtype, spec.stride, False, True))
    resolve(made)
    return made


def fetch(t, numpy_handle: Any):
    """t's whole value on the master (a NumPy array): each distinct block once, straight
    from its worker; a Partial t is made real first, worker to worker."""
    if is_partial(t):
        t = real(t)
    blocks = [torchissue.bits(b, numpy_handle) for b in t._locals]
    spec = Spec(tuple(t._spec.shape), blocks[0].spec.dtype)
    return gather_to_master(numpy_handle.on_mesh(t._mesh, t._placements, blocks, spec))


def mesh_spec(shape: tuple, dtype, requires_grad: bool) -> TorchSpec:
    """The TorchSpec of a contiguous mesh tensor of global `shape`."""
    stride, step = [], 1
    for n in reversed(shape):
        stride.append(step)
        step *= max(n, 1)
    return TorchSpec(tuple(shape), dtype, tuple(reversed(stride)), requires_grad, True)


# -- helpers -------------------------------------------------------------------------------

def is_partial(t) -> bool:
    return any(type(p) is Partial for p in t._placements)


def replicated(placements: tuple) -> bool:
    """Whether every mesh dimension replicates a tensor so placed."""
    return all(type(p) is type(REPLICATE) for p in placements)


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


def operands_of(value) -> list:
    """The torch handles in `value`, in order."""
    found: list = []
    walk(value, found.append)
    return found


def walk(value, fn):
    """`value` with each torch handle replaced by fn(handle), through tuples, lists, dicts."""
    if isinstance(value, Handle):
        return fn(value) if value.holds_torch else value
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(walk(v, fn) for v in value)
    if kind is dict:
        return {k: walk(v, fn) for k, v in value.items()}
    return value


def _torch():
    return torchissue.ready()
