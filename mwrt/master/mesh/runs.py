"""Runs of a result along one axis, moved to the places whose blocks they fall in.

Slicing, reshaping and joining along a sharded axis leave each place holding consecutive
runs of the result along an axis (its positions [first, last)), of any lengths, where the
result wants each place to hold one block [a, b) of it (as np.array_split cuts the
result's length). Each place receives from the places of its line (along the mesh
dimension that shards the axis, or the several that shard it nested) the pieces of their
runs that fall in its block, worker to worker, and joins them in order: no bytes go
through the master, and no place holds more than its block and the pieces it sends. A run
that every place holds (a replicated operand's) is cut where it is wanted, and moves
nothing.
"""

from __future__ import annotations

import math

from .. import issue
from .groups import carry


def exchange(mesh, dim: int | tuple, axis: int, held: list, wanted: list,
             everywhere=()) -> list:
    """Per place p, the run wanted[p] = (a, b) of a result's `axis`, a new tensor joined from
    the pieces of the runs its line holds: held[q] is [(part, first, last)] where part's
    `axis` holds result positions [first, last); everywhere is [(parts, first, last)], one
    part per place, held by all. Every place holds a run or `everywhere` one (for the
    shape and dtype of an empty block)."""
    blocks: list = [None] * mesh.size
    for line in mesh.groups(dim):
        for p in line:
            a, b = wanted[p]
            node, device = mesh.places[p]
            pieces = [(max(a, first), carry(_cut(part, axis, max(a, first) - first,
                                                 min(b, last) - first), node, device))
                      for q in line for part, first, last in held[q]
                      if min(b, last) > max(a, first)]
            pieces += [(max(a, first), _cut(parts[p], axis, max(a, first) - first,
                                            min(b, last) - first))
                       for parts, first, last in everywhere if min(b, last) > max(a, first)]
            pieces.sort(key=lambda piece: piece[0])
            if not pieces:  # an empty block, of the result's other lengths and dtype
                some = held[p][0][0] if held[p] else everywhere[0][0][p]
                pieces = [(a, _cut(some, axis, 0, 0))]
            blocks[p] = issue.call("concatenate", [piece for _, piece in pieces], axis=axis)
    return blocks


def count(start: int, end: int, step: int) -> int:
    """How many of start, start + step, ... lie before `end`."""
    return max(0, math.ceil((end - start) / step))


def _cut(part, axis: int, lo: int, hi: int):
    return issue.call("getitem", part, (slice(None),) * axis + (slice(lo, hi),))


__all__ = ["count", "exchange"]
