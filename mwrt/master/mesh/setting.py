"""t[index] = V with V a mesh tensor, t sharded: each place writes its part of the index from
its part of V, which it holds already or receives worker to worker.

V replicated: each place cuts its part from its own copy. V sharded along the mesh
dimension that shards the matching axis of t (V placed as t[index] is, or broadcast along
it): where V's blocks are the runs the places write (`Y[...] = X`, `Y[:, 1] = X[:, 0]`) each
place writes from its own block; where they are not (`Y[1:5] = V`), runs.exchange moves each
place the run of V it writes, from the places of its line. V sharded on another axis than
t's is first redistributed to where it is written (matching): each place receives only its
part. Nothing goes through the master.
"""

from __future__ import annotations

from .. import issue
from . import runs
from .placement import REPLICATE, Shard, local_box


def values(t, v, entries: list, cuts: dict, skip: set, resolve) -> dict | None:
    """{place: its part of V to write} (the places in `skip` write nothing; cuts[i], per
    axis of t[index], the positions of place i's part); None where V is placed otherwise."""
    resolve(v)
    kept = [ax for ax, item in entries if isinstance(item, slice)]  # t's axis of each
    off = len(kept) - v.ndim  # V broadcasts to t[index] from the right
    if off < 0:
        return None
    if _aligned(v, off, cuts, skip):
        return {i: v._locals[i] for i in cuts if i not in skip}
    dims = [d for d, p in enumerate(v._placements) if type(p) is Shard]
    if any(p != REPLICATE for d, p in enumerate(v._placements) if d not in dims) or \
            len(dims) > 1:
        return None
    rows: list | None = list(v._locals)
    axis = None
    if dims:
        dim, axis = dims[0], v._placements[dims[0]].axis
        if t._placements[dim] != Shard(kept[axis + off]):
            return None  # V sharded where the target is not: replicate V (a warning)
        rows = _runs(t, v, dim, axis, off, cuts)
    if rows is None:
        return None
    parts = {}
    for i, cut in cuts.items():
        if i in skip:
            continue
        index = tuple(slice(None) if x == axis or v.shape[x] == 1 else cut[x + off]
                      for x in range(v.ndim))
        whole = all(item == slice(None) for item in index)
        parts[i] = rows[i] if whole else issue.call("getitem", rows[i], index)
    return parts


def matching(t, v, entries: list) -> tuple | None:
    """The placements of V that t[index] = V writes from without moving more of V than each
    place writes: V's axis under each axis that a mesh dimension shards in t (a slice of it)
    sharded along that dimension, Replicate elsewhere; None where V already lies so, or t
    and V are on different kinds of mesh."""
    kept = [ax for ax, item in entries if isinstance(item, slice)]
    off = len(kept) - v.ndim
    if off < 0:
        return None
    wanted = []
    for p in t._placements:
        x = kept.index(p.axis) - off if type(p) is Shard and p.axis in kept else -1
        wanted.append(Shard(x) if x >= 0 and v.shape[x] != 1 else REPLICATE)
    placed = tuple(wanted)
    return None if placed == v._placements else placed


def _aligned(v, off: int, cuts: dict, skip: set) -> bool:
    """True if every place that writes holds in its block of V just the part it writes."""
    mesh = v._mesh
    for i, cut in cuts.items():
        if i in skip:
            continue
        box = local_box(v.shape, v._placements, mesh.shape, mesh.coords[i])
        for x, n in enumerate(v.shape):
            if box[x] != ((0, 1) if n == 1 else cut[x + off].indices(n)[:2]):
                return False
    return True


def _runs(t, v, dim: int, axis: int, off: int, cuts: dict) -> list | None:
    """Per place, the rows of V along its sharded `axis` that the place writes (V's own
    block where they are it; else moved by runs.exchange)."""
    mesh, length = t._mesh, v.shape[axis]
    held, wanted = [], []
    for i, coord in enumerate(mesh.coords):
        lo, hi = local_box(v.shape, v._placements, mesh.shape, coord)[axis]
        held.append((lo, hi))
        if i not in cuts:  # it writes nothing
            wanted.append((0, 0))
        elif length == 1:  # its one row, broadcast or not, at every place that writes
            wanted.append((0, 1))
        else:
            wanted.append(cuts[i][axis + off].indices(length)[:2])
    if all(w == h or i not in cuts for i, (w, h) in enumerate(zip(wanted, held))):
        return list(v._locals)
    return runs.exchange(mesh, dim, axis, [[(block, *run)] for block, run in
                                           zip(v._locals, held)], wanted)
