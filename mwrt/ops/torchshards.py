"""A sharded module's buffers on the worker: its shards packed for an all_gather, the gathered
rows unpacked into the module's whole parameters (whose storage is freed between uses), their
gradients cut and laid out place by place for a reduce_scatter, and a place's part added to
its shards' gradients.

Shard(0) blocks are row ranges, so each is a contiguous run of its tensor's row-major
elements and the whole tensor is its places' blocks, flat, joined in place order. A buffer
holds one run per tensor for each place, padded to one length, as the collectives move
equal parts (FSDP's flat parameter, one per dtype).
"""

from __future__ import annotations

from .registry import register
from .torchops import worker_torch


def _pack(xp, grad: bool, length: int, *blocks) -> list:
    """The blocks' values in one flat tensor of `length` elements (zeros after them)."""
    torch = worker_torch()
    with torch.no_grad():
        parts = [b.reshape(-1) for b in blocks]
        used = sum(p.numel() for p in parts)
        pad = torch.zeros(length - used, dtype=blocks[0].dtype, device=blocks[0].device)
        return [torch.cat([*parts, pad])]


def _unpack(xp, grad: bool, gathered, counts: tuple, *wholes) -> list:
    """Each whole tensor k copied from the gathered rows (row j: place j's buffer, holding
    counts[j][k] elements of tensor k after those of the tensors before it), its storage
    allocated again if it was freed. Its version stays: the graph of a forward that saved
    it reads it in the backward, as FSDP's all_gather before the backward does."""
    torch = worker_torch()
    with torch.no_grad():
        for k, whole in enumerate(wholes):
            storage = whole.untyped_storage()
            needed = _extent(whole) * whole.element_size()
            if storage.nbytes() < needed:
                storage.resize_(needed)
            pieces = [gathered[j, sum(row[:k]):sum(row[:k + 1])] for j, row in enumerate(counts)]
            # .data: its storage under a version counter of its own
            whole.data.copy_(torch.cat(pieces).view(whole.shape))
    return []


def _extent(t) -> int:
    """The elements of storage that tensor t reaches (its offset, then its last element)."""
    if t.numel() == 0:
        return t.storage_offset()
    return t.storage_offset() + 1 + sum((n - 1) * step for n, step in zip(t.shape, t.stride()))


def _free(xp, grad: bool, *wholes) -> list:
    """The whole tensors' storage given back (FSDP's reshard): they keep their metadata, and
    the next all_gather allocates it again."""
    torch = worker_torch()
    for whole in wholes:
        if not whole.untyped_storage().resizable():  # made over a received NumPy buffer
            whole.data = torch.empty_strided(whole.shape, whole.stride(), dtype=whole.dtype,
                                             device=whole.device)
        whole.untyped_storage().resize_(0)
    return []


def _pack_grads(xp, grad: bool, length: int, counts: tuple, keep: bool, *wholes) -> list:
    """The whole tensors' gradients (zeros for one without, or for all unless `keep`: a
    copy another place holds too) cut into their places' blocks and laid out place by
    place, each place's run padded to `length`: the buffer a reduce_scatter sums and
    splits. The gradients are cleared: the shards hold them next."""
    torch = worker_torch()
    with torch.no_grad():
        flats = [(w.grad if w.grad is not None and keep else torch.zeros_like(w)).reshape(-1)
                 for w in wholes]
        parts, starts = [], [0] * len(wholes)
        for row in counts:
            for k, n in enumerate(row):
                parts.append(flats[k][starts[k]:starts[k] + n])
                starts[k] += n
            parts.append(torch.zeros(length - sum(row), dtype=flats[0].dtype,
                                     device=flats[0].device))
        out = torch.cat(parts)
        for w in wholes:
            w.grad = None
    return [out]


def _add_grads(xp, grad: bool, part, counts: tuple, *shards) -> list:
    """A place's part of the summed buffer into its shards' gradients: set where a shard has
    none, added where it has one (torch accumulates gradients)."""
    torch = worker_torch()
    offset = 0
    with torch.no_grad():
        for shard, n in zip(shards, counts):
            piece = part[offset:offset + n].view(shard.shape)
            if shard.grad is None:
                shard.grad = piece.clone()
            else:
                shard.grad.add_(piece)
            offset += n
    return []


register("torch_shards_pack", _pack, lambda *args, **kwargs: None, own_results=True,
         doc="A sharded module's blocks in one flat buffer (for an all_gather).")
register("torch_shards_unpack", _unpack, lambda *args, **kwargs: None, own_results=True,
         doc="Gathered blocks copied into a sharded module's whole parameters.")
register("torch_shards_free", _free, lambda *args, **kwargs: None, own_results=True,
         doc="A sharded module's whole parameters' storage freed until the next all_gather.")
register("torch_shards_pack_grads", _pack_grads, lambda *args, **kwargs: None,
         own_results=True, doc="Whole gradients cut into blocks, place by place (for a "
         "reduce_scatter).")
register("torch_shards_add_grads", _add_grads, lambda *args, **kwargs: None, own_results=True,
         doc="A place's part of the summed gradients into its shards' gradients.")
