"""A module whose parameters are sharded over a mesh and gathered for use: FSDP's pattern.

`mwrt.torch.fully_shard(model, mesh=m)` keeps the model at every place of `m`, as a
replicated mesh module does (torchmeshmodule.MeshModule), and holds each parameter of one
or more dimensions as a mesh tensor placed Shard(0) along the mesh's last dimension and
Replicate along the others (FSDP2's HSDP on a 2-D mesh): each place owns rows of it, a leaf
that requires grad. Those shards are the module's parameters(): the
optimizer made on them steps each place's rows alone (its state sharded alike).

Before every forward the shards are all_gathered along the last dimension's lines, one
flat buffer per dtype (FSDP's flat parameter), into the whole parameters each place's
module computes with. The backward leaves each place its part of the whole gradients
(Partial, as data parallel does); right after it, they are cut into the places' blocks,
reduce_scattered along those lines and all_reduced over the replicas along the other
dimensions (one buffer per dtype, worker to worker), and added to the shards' gradients,
and the whole gradients are cleared, as FSDP's post-backward hook does. 0-d parameters stay
replicated, their gradients summed at the step as a replicated module's are. The whole
parameters' storage is freed after the forward and after the backward (FSDP's
reshard_after_forward=True), and gathered again before each backward on the mesh, which
may need them (the forward's graph saved them): between steps a place holds its shards.
"""

from __future__ import annotations

from typing import Any

from . import torchgrad, torchissue, torchmeshgrad
from .mesh.device_mesh import Mesh, current_mesh
from .mesh.groups import all_gather_group, all_reduce_group, reduce_scatter_group
from .mesh.placement import local_box, shard_arg
from .tensor import DistributedTensor
from .torchmeshmodule import MeshModule
from .torchtensor import TorchTensor, ready


class ShardedModule(MeshModule):
    """A torch.nn.Module at every place of a mesh whose parameters are sharded Shard(0)."""

    def __init__(self, model: Any, mesh: Mesh):
        super().__init__(model, mesh)
        torch = ready()
        self._wholes = self._params  # the gathered parameters, Replicate, at every place
        self._sharded: list[int] = []  # the indices of those held as shards
        params: list[TorchTensor] = []
        with torch.no_grad():
            for k, whole in enumerate(self._wholes):
                if whole.ndim == 0:
                    params.append(whole)
                    continue
                self._sharded.append(k)
                params.append(_shard(whole, mesh))
        self._params = params
        self._gathered = True  # whether the whole parameters hold their values now
        self.reshard()
        torchmeshgrad.after_backward(mesh, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The shards gathered into the whole parameters, then the forward at every place,
        then their storage freed."""
        self.gather()
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self.reshard()

    forward = __call__

    def reshard(self) -> None:
        """Free the whole parameters' storage at every place (their metadata stays)."""
        if not self._gathered or not self._sharded:
            return
        for i in range(self.mesh.size):
            torchissue.run("shards.free", _nothing,
                           tuple(self._wholes[k]._locals[i] for k in self._sharded), {},
                           "torch_shards_free", ())
        self._gathered = False

    def backward_starts(self) -> None:
        """Before a backward on the mesh: the whole parameters gathered again, as the
        forward's graph may read them."""
        if not self._gathered:
            self.gather()

    def gather(self) -> None:
        """all_gather the shards into the whole parameters at every place (one flat buffer
        per dtype)."""
        self._gathered = True
        torch = ready()
        mesh = self.mesh
        with torch.no_grad():
            for group in self._by_dtype(self._sharded):
                counts = self._counts(group)
                length = max(sum(row) for row in counts)
                packed = [torchissue.run("shards.pack", _flat_rule(self._params[group[0]].dtype,
                                                                   length),
                                         (length, *(self._params[k]._locals[i] for k in group)),
                                         {}, "torch_shards_pack", ())
                          for i in range(mesh.size)]
                raw = [_bits(p) for p in packed]
                gathered: list = [None] * mesh.size
                for line in mesh.groups(mesh.ndim - 1):  # the shards of one replica
                    made = all_gather_group(mesh, [raw[i] for i in line], line)
                    for i, rows in zip(line, made):
                        gathered[i] = rows
                for i, rows in enumerate(gathered):
                    rows = _torch_of(rows, packed[i])
                    torchissue.run("shards.unpack", _nothing,
                                   (rows, counts, *(self._wholes[k]._locals[i] for k in group)),
                                   {}, "torch_shards_unpack", ())

    def backward_done(self) -> None:
        """The whole gradients a backward left, summed and split into the shards'
        gradients (reduce_scatter, worker to worker), then cleared."""
        filled = [k for k in self._sharded if torchgrad.filled(self._wholes[k]._locals[0])]
        mesh = self.mesh
        for group in self._by_dtype(filled):
            counts = self._counts(group)
            length = max(sum(row) for row in counts)
            wholes = [self._wholes[k] for k in group]
            # the gradients are parts along some mesh dimensions and copies along the
            # others: one copy of each part goes into the sum, zeros from the rest
            copied = [d for d, p in enumerate(torchmeshgrad.placed(wholes[0]) or ())
                     if not p.is_partial()]
            packed = [torchissue.run("shards.pack_grads",
                                     _flat_rule(wholes[0].dtype, length * len(counts)),
                                     (length, counts, not any(coord[d] for d in copied),
                                      *(w._locals[i] for w in wholes)), {},
                                     "torch_shards_pack_grads", ())
                      for i, coord in enumerate(mesh.coords)]
            parts = _reduce_scattered(mesh, [_bits(p) for p in packed])
            for i, part in enumerate(parts):
                shards = [self._params[k]._locals[i] for k in group]
                torchissue.run("shards.add_grads", _nothing,
                               (_torch_of(part, packed[i]), counts[mesh.coords[i][-1]],
                                *shards), {}, "torch_shards_add_grads", ())
                for shard in shards:
                    torchgrad.set_filled(shard, True)
            for whole in wholes:
                for block in whole._locals:
                    torchgrad.set_filled(block, False)
                torchmeshgrad.remember(whole, None)
            for k in group:
                torchmeshgrad.remember(self._params[k], self._params[k]._placements)
        self.reshard()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the shards' gradients (and any whole one) at every place."""
        super().zero_grad(set_to_none)
        torch = ready()
        for k in self._sharded:
            shard = self._params[k]
            for block in shard._locals:
                if not torchgrad.filled(block):
                    continue
                if set_to_none:
                    torchissue.torch_call(torch.Tensor.grad.__set__, (block, None), {})
                    torchgrad.set_filled(block, False)
                else:
                    grad = torchissue.torch_call(torch.Tensor.grad.__get__, (block,), {})
                    torchissue.torch_call(torch.Tensor.zero_, (grad,), {})
            torchmeshgrad.remember(shard, None if set_to_none else shard._placements)

    def state_dict(self) -> dict:
        """Its parameters' whole values as local torch tensors, gathered from the shards."""
        return {name: p.torch() for name, p in self.named_parameters()}

    def _by_dtype(self, indices: list) -> list[list[int]]:
        groups: dict = {}
        for k in indices:
            groups.setdefault(self._params[k].dtype, []).append(k)
        return list(groups.values())

    def _counts(self, group: list) -> tuple:
        """(elements of each parameter's block at the j-th place of a line of the mesh's
        last dimension, for each j): every line holds the same blocks."""
        return tuple(tuple(self._params[k]._locals[j].numel() for k in group)
                     for j in self.mesh.groups(self.mesh.ndim - 1)[0])

    def __repr__(self) -> str:
        return f"ShardedModule({self.mesh!r}, {self.meta!r})"


def _shard(whole: Any, mesh: Mesh) -> Any:
    """A whole parameter's rows at each place as a mesh tensor placed Shard(0) along the
    mesh's last dimension and Replicate along the others, each block a leaf that requires
    grad (made under no_grad)."""
    torch = ready()
    placements = shard_arg((None,) * (mesh.ndim - 1) + (0,), whole.ndim, mesh.ndim,
                           "fully_shard")
    shape = tuple(whole.shape)
    blocks = []
    for block, coord in zip(whole._locals, mesh.coords):
        lo, hi = local_box(shape, placements, mesh.shape, coord)[0]
        rows = torchissue.torch_call(torch.Tensor.__getitem__, (block, slice(lo, hi)), {})
        rows = torchissue.torch_call(torch.Tensor.clone, (rows,), {})
        blocks.append(torchissue.torch_call(torch.Tensor.requires_grad_, (rows,), {}))
    spec: Any = torchmeshgrad.mesh_spec(shape, whole.dtype, True)
    made: Any = TorchTensor.on_mesh(mesh, placements, blocks, spec)
    torchmeshgrad.remember(made, None)
    return made


def _reduce_scattered(mesh: Mesh, raw: list) -> list:
    """Each place's part of the sum of the buffers `raw`: summed and split along the lines
    of the last mesh dimension (reduce_scatter), then summed over the replicas along the
    others (all_reduce)."""
    parts: list = [None] * mesh.size
    for line in mesh.groups(mesh.ndim - 1):
        for i, part in zip(line, reduce_scatter_group(mesh, [raw[i] for i in line], line,
                                                      "sum", 0)):
            parts[i] = part
    for d in range(mesh.ndim - 1):
        for line in mesh.groups(d):
            all_reduce_group(mesh, parts, line, "sum")
    return parts


def _bits(t: Any) -> Any:
    return torchissue.bits(t, DistributedTensor)


def _torch_of(raw: Any, like: Any) -> Any:
    """A torch handle of a NumPy handle's bytes, of `like`'s dtype, on its device."""
    return torchissue.from_raw(raw, str(like.dtype), False, like._device, TorchTensor)


def _flat_rule(dtype: Any, length: int):
    """The meta rule of a call that makes one flat tensor of `length` elements."""
    def made(*args: Any) -> Any:
        return ready().empty(length, dtype=dtype, device="meta")
    return made


def _nothing(*args: Any) -> None:
    """The meta rule of a call that makes no tensor."""


def fully_shard(model: Any, mesh: Mesh | None = None) -> ShardedModule:
    """`model` at every place of `mesh` (or of the mesh of a `with mesh:` block), its
    parameters sharded Shard(0) along the mesh's last dimension, replicated along the
    others, and gathered for each forward (FSDP2's fully_shard, HSDP on a 2-D mesh, as a
    handle: the model given stays a local model)."""
    mesh = current_mesh() if mesh is None else mesh
    if mesh is None:
        raise ValueError("fully_shard: no mesh to shard over; pass mesh=mwrt.mesh(), or call "
                         "it inside `with mesh:`")
    return ShardedModule(model, mesh)

