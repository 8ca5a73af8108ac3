"""A slice along a sharded axis (`A[10:500]` of a row-sharded A): the result stays sharded
on that axis, its blocks as np.array_split cuts the result's length.

Each place first takes, as a view, the part of its block that the slice selects; those parts
hold consecutive runs of the result, of any lengths, which runs.exchange moves to the places
whose blocks they fall in, worker to worker. The result is a copy (NumPy's is a view of A).
"""

from __future__ import annotations

from .. import issue
from . import runs
from .placement import Shard, local_box


def plannable(t, entries: list) -> int | None:
    """The one axis a slice with a positive step cuts along a sharded axis, where this plan
    takes it (slices only; that axis sharded by one mesh dimension, or several nested);
    else None."""
    if any(e is None or not isinstance(e[1], slice) for e in entries):
        return None
    sharded = [p.axis for p in t._placements if type(p) is Shard]
    cut = [ax for ax, item in entries if ax in sharded and item != slice(None)]
    if len(cut) != 1:
        return None
    step = entries[cut[0]][1].step
    return cut[0] if step is None or step > 0 else None


def take(t, index: list, axis: int, spec):
    """t[index] (basic_index's entries), sharded on `axis` as t is (see the module's text)."""
    mesh, entries = t._mesh, [item for _, item in index]
    dims = tuple(d for d, p in enumerate(t._placements) if p == Shard(axis))
    start, stop, step = entries[axis].indices(t.shape[axis])
    parts, held = [], []  # per place: its selected part (a view), the result run it holds
    for i, coord in enumerate(mesh.coords):
        lo, hi = local_box(t.shape, t._placements, mesh.shape, coord)[axis]
        first = runs.count(start, lo, step)  # selected indices before the block
        last = runs.count(start, min(max(stop, lo), hi), step)
        own = start + first * step - lo  # the first selected index, in block coordinates
        local = list(entries)
        local[axis] = slice(own, own + (last - first - 1) * step + 1, step) if last > first \
            else slice(0, 0)
        parts.append(issue.call("getitem", t._locals[i], tuple(local)))
        held.append((first, last))
    wanted = [local_box(spec.shape, t._placements, mesh.shape, coord)[axis]
              for coord in mesh.coords]
    blocks = runs.exchange(mesh, dims, axis, [[(part, *run)] for part, run in
                                             zip(parts, held)], wanted)
    return t.results.on_mesh(mesh, t._placements, blocks, spec)


__all__ = ["plannable", "take"]
