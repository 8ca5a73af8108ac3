"""Autograd over a mesh: where the gradients a backward leaves lie, and how they are summed.

`loss.backward()` on a Partial (or sharded) loss runs at every place and leaves each place a
part of each replicated parameter's gradient: the gradients are `Partial("sum")`, and their
sum is the gradient of the mean over the whole batch (a sharded leaf's gradient is sharded
alike). A backward from a replicated root leaves replicated gradients. The optimizer step
(torchmeshmodule) sums Partial gradients by one all_reduce of a flat bucket between the
workers, never through the master; reading `p.grad` sums them too.

A Partial operand that requires grad is made real (all_reduce) into a tensor that stays in
the graph, as torch DTensor's Partial to Replicate redistribute does: at every place a leaf
of the sum, its node marked (torchgrad.Node.resolved). A backward that reaches such tensors
runs as walks, latest made first: after the walk from the roots, each one's gradient (summed
first where the walk left it in parts) seeds a backward from its parts at every place, whose
contributions are parts again, placed as their Partial tensor was. A leaf that walks of both
kinds reach keeps its gradient consistent between them: before a walk that leaves parts,
its whole gradient stays at one place of each line (zeros elsewhere), and parts are summed
before a walk that leaves wholes.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import weakref

from ..ops.torchspec import TorchSpec
from . import torchgrad, torchissue
from .handle import Handle
from .mesh.groups import all_reduce_group
from .mesh.moves import resolve
from .mesh.placement import REPLICATE, Partial, describe
from .mesh.plan import PlacementError

PARTIAL = Partial("sum")
# Leaves that require grad, per mesh: id -> (weak reference, their gradients' placements or
# None while they have none). A backward changes them all (see backward).
_LEAVES: dict = {}
_AFTER: dict = {}  # mesh -> the modules told around each backward on it (see after_backward)
_MADE = itertools.count()  # the order tensors are made real in (see real)


def backward(func, args: tuple, kwargs: dict, operands: list) -> None:
    """backward() at every place; through tensors made real from Partial ones, as walks
    (see the module's doc)."""
    mesh = operands[0]._mesh
    for module in list(_AFTER.get(mesh, ())):  # a sharded module's whole parameters
        module.backward_starts()
    marks = torchgrad.resolutions([t._locals[0] for t in operands if t._spec.requires_grad])
    if not marks:
        _walk(mesh, _parts(mesh, operands), func, args, kwargs)
    else:
        torch = _torch()
        bound = inspect.signature(func).bind(*args, **kwargs).arguments
        if func is torch.autograd.backward:
            roots, seeds = _listed(bound["tensors"]), bound.get("grad_tensors")
        else:
            roots, seeds = [bound["self"]], bound.get("gradient")
        create = bool(bound.get("create_graph"))
        retain = bound.get("retain_graph")
        retain = create if retain is None else bool(retain)
        inputs = bound.get("inputs")
        if inputs is not None:  # the resolved tensors' gradients are wanted too
            inputs = [*_listed(inputs), *(mark[2][0] for mark in marks)]
        options = {"retain_graph": True, "create_graph": create, "inputs": inputs}
        _walk(mesh, _parts(mesh, roots), torch.autograd.backward, (roots, seeds), options)
        for k, (_, _, (made, part)) in enumerate(marks):
            if not torchgrad.filled(made._locals[0]):
                continue  # no walk reached it (inputs= stopped short)
            grad = grad_of(made)  # summed where the walks left parts: whole everywhere
            set_grad(made, None)  # the next backward starts from nothing; grad holds it
            options["retain_graph"] = retain or k < len(marks) - 1
            _walk(mesh, _parts(mesh, [part]), torch.autograd.backward, ([part], [grad]),
                  options)
    for module in list(_AFTER.get(mesh, ())):  # a sharded module's reduce_scatter
        module.backward_done()
    for leaf, _ in _leaves_of(mesh):  # one the backward did not reach keeps None
        if not torchgrad.filled(leaf._locals[0]):
            remember(leaf, None)


def _walk(mesh, wanted: tuple, func, args: tuple, kwargs: dict) -> None:
    """One backward at every place, whose gradients lie as `wanted` says; the leaves'
    gradients from earlier backwards made consistent with it first."""
    for leaf, now in _leaves_of(mesh):
        if not replicated(leaf._placements):  # a sharded leaf's gradient is sharded alike
            remember(leaf, leaf._placements)
            continue
        if now is not None and now != wanted and torchgrad.filled(leaf._locals[0]):
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


def _parts(mesh, roots: list) -> tuple:
    """How gradients from `roots` lie: parts along the mesh dimensions that split (or part)
    a root, whole along the others."""
    return tuple(REPLICATE if all(type(t._placements[d]) is type(REPLICATE) for t in roots)
                 else PARTIAL for d in range(mesh.ndim))


def autograd_grad(func, args: tuple, kwargs: dict, operands: list) -> tuple:
    """torch.autograd.grad at every place: each input's gradient placed as a backward
    leaves it (sharded as a sharded input, else as _parts says)."""
    mesh = operands[0]._mesh
    outputs = args[0] if args else kwargs["outputs"]
    inputs = args[1] if len(args) > 1 else kwargs["inputs"]
    inputs = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    roots = [t._locals[0] for t in operands_of(outputs) if t._spec.requires_grad]
    for module in list(_AFTER.get(mesh, ())):  # a sharded module's whole parameters
        module.backward_starts()
    if torchgrad.resolutions(roots):
        raise PlacementError("torch.autograd.grad: the graph passes a Partial tensor made "
                             "real (an all_reduce) on the mesh; run loss.backward() and read "
                             "the leaves' .grad instead")
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
    """Have `module.backward_starts()` run before and `module.backward_done()` after every
    backward on `mesh` (while the module lives): a sharded module gathers its whole
    parameters first, and moves its gradients to its shards then."""
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


def set_grad(leaf, value) -> None:
    """leaf.grad = value (a mesh handle placed as leaf, or None) at every place."""
    if value is not None and value._placements != leaf._placements:
        raise PlacementError(f"grad: a gradient placed {describe(value._placements)} for a "
                             f"tensor placed {describe(leaf._placements)}; place it alike")
    setter = _torch().Tensor.grad.__set__
    for i in range(leaf._mesh.size):
        torchissue.torch_call(setter, (leaf._locals[i], None if value is None else
                                       value._locals[i]), {})
        torchgrad.set_filled(leaf._locals[i], value is not None)
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


def real(t, graph: bool = True):
    """t made real: in place (mesh/moves.resolve), or, for a tensor that requires grad, in a
    copy that stays in the graph while grad is enabled and `graph`: a leaf at every place,
    whose gradient a backward carries on to t's parts (see backward)."""
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
    if not graph or not torch.is_grad_enabled():
        return made
    for block in copies:
        torchissue.torch_call(torch.Tensor.requires_grad_, (block,), {})
    made._spec = copies[0]._spec
    node = torchgrad.node_of(copies[0])
    if node is not None:  # the made tensor holds its mark, and t: torch's graph holds t
        node.resolved = (next(_MADE), t._locals[0], (made, t))
    remember(made, None)
    return made


def mesh_spec(shape: tuple, dtype, requires_grad: bool) -> TorchSpec:
    """The TorchSpec of a contiguous mesh tensor of global `shape`."""
    stride, step = [], 1
    for n in reversed(shape):
        stride.append(step)
        step *= max(n, 1)
    return TorchSpec(tuple(shape), dtype, tuple(reversed(stride)), requires_grad, True)


def replicated(placements: tuple) -> bool:
    """Whether every mesh dimension replicates a tensor so placed."""
    return all(type(p) is type(REPLICATE) for p in placements)


def is_partial(t) -> bool:
    return any(type(p) is Partial for p in t._placements)


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


def _listed(value) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _torch():
    return torchissue.ready()

