"""np.sort along a sharded axis: the result sharded there, each place ending with its block
of the sorted axis (as np.array_split cuts it), by odd-even merge-split between neighbours.

Each place sorts its block. Then, for as many rounds as the line (the places along the mesh
dimension that shards the axis) has places, neighbours (k, k + 1), k of the round's parity,
swap their blocks worker to worker; each sorts the union and keeps its part, the left the
smaller. With blocks of one size this sorts in that many rounds (Knuth, TAOCP 5.3.4, ex. 37;
Baudet and Stevenson 1978). np.array_split's blocks differ by one: each counts as the
longest, the rest of it a virtual element larger than any (no value is ever made), so the
left keeps min(longest, both counts) of the union. The counts follow from the lengths alone,
so the master knows where the sorted runs end, and runs.exchange moves them to the blocks
of the result. Every fibre along the axis is sorted at once, as np.sort sorts them. A place
receives about the whole axis over the rounds (the places hold two blocks at most), where a
replicated sort has each receive all but its block and hold the whole.
"""

from __future__ import annotations

import math

from .. import issue, ordering
from . import runs
from .placement import Shard, bounds, local_box


def plannable(t, axis: int) -> int | None:
    """The mesh dimension that alone shards t's `axis`, where this plan sorts along it
    (outside a graph capture, which cannot record moves between nodes); else None."""
    dims = [d for d, p in enumerate(t._placements) if p == Shard(axis)]
    if len(dims) != 1 or ordering.capture or any(p.is_partial() for p in t._placements):
        return None
    return dims[0]


def sort(t, axis: int, dim: int, spec):
    """np.sort(t, axis), sharded on `axis` as t is (see the module's text)."""
    mesh = t._mesh
    parts = mesh.shape[dim]
    length = t.shape[axis]
    longest = math.ceil(length / parts) if parts else 0
    blocks = [issue.call("sort", block, axis) for block in t._locals]
    counts = [bounds(length, parts, coord[dim])[1] - bounds(length, parts, coord[dim])[0]
              for coord in mesh.coords]
    lines = mesh.groups(dim)
    for turn in range(parts):
        for line in lines:
            for k in range(turn % 2, parts - 1, 2):
                left, right = line[k], line[k + 1]
                both = counts[left] + counts[right]
                if not both:
                    continue
                keep = min(longest, both)
                blocks[left], blocks[right] = (
                    _merge(blocks[left], blocks[right], left, mesh, axis, 0, keep),
                    _merge(blocks[left], blocks[right], right, mesh, axis, keep, both))
                counts[left], counts[right] = keep, both - keep
    line_of = {p: line for line in lines for p in line}
    held, wanted = [], []
    for i, coord in enumerate(mesh.coords):
        line = line_of[i]
        first = sum(counts[q] for q in line[:coord[dim]])
        held.append([(blocks[i], first, first + counts[i])])
        wanted.append(local_box(spec.shape, t._placements, mesh.shape, coord)[axis])
    result = runs.exchange(mesh, dim, axis, held, wanted)
    return t.results.on_mesh(mesh, t._placements, result, spec)


def _merge(a, b, at: int, mesh, axis: int, lo: int, hi: int):
    """Positions [lo, hi) of the sorted union of blocks a and b, at place `at`."""
    node, device = mesh.places[at]
    union = issue.call("concatenate", [a.to(node=node, device=device),
                                       b.to(node=node, device=device)], axis=axis)
    merged = issue.call("sort", union, axis, "stable")  # two sorted runs: merged in one pass
    return issue.call("getitem", merged, (slice(None),) * axis + (slice(lo, hi),))


__all__ = ["plannable", "sort"]
