"""Placements of a mesh tensor, one per mesh dimension (DTensor's words), and the layout math.

`Shard(axis)`: the tensor's `axis` is split over the mesh dimension as np.array_split splits
it (the first shards one longer when the length does not divide). `Replicate()`: every place
along the dimension holds the whole of it. `Partial(op)`: every place holds a part, and the
value is the `op` ("sum", "max", "min", "prod") of the parts; an all_reduce makes it real.
When several mesh dimensions shard one axis, they split it in mesh-dimension order (the first
dimension outermost), as DTensor does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ...errors import PlacementError as PlacementError  # its home before errors.py
from ...ops import Spec

PARTIAL_OPS = ("sum", "max", "min", "prod")


class PlacementWarning(UserWarning):
    """An op with no local plan ran on redistributed operands (worker to worker); once per
    call site. Redistribute explicitly to say so, or set MWRT_STRICT_PLACEMENT=1 to raise."""


@dataclass(frozen=True)
class Placement:
    """How a tensor lies along one mesh dimension."""

    def is_shard(self, axis: int | None = None) -> bool:
        """True for Shard (of `axis`, if given)."""
        return False

    def is_partial(self) -> bool:
        """True for Partial(op)."""
        return False

    def is_replicate(self) -> bool:
        """True for Replicate()."""
        return False


@dataclass(frozen=True)
class Shard(Placement):
    """The tensor's `axis` split over the mesh dimension (uneven as np.array_split)."""

    axis: int

    def __post_init__(self):
        if not isinstance(self.axis, int) or self.axis < 0:
            raise ValueError(f"Shard: axis must be an int >= 0 (got {self.axis!r}); "
                             "negative axes are normalized against the tensor's ndim first")

    def is_shard(self, axis: int | None = None) -> bool:
        return axis is None or axis == self.axis

    def __repr__(self) -> str:
        return f"Shard({self.axis})"


@dataclass(frozen=True)
class Replicate(Placement):
    """The whole tensor at every place along the mesh dimension."""

    def is_replicate(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Partial(Placement):
    """A part at every place; the value is `op` over the parts (an all_reduce resolves it)."""

    op: str = "sum"

    def __post_init__(self):
        if self.op not in PARTIAL_OPS:
            raise ValueError(f"Partial: op must be one of {', '.join(PARTIAL_OPS)} "
                             f"(got {self.op!r})")

    def is_partial(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Partial({self.op!r})"


REPLICATE = Replicate()

# What `shard=` takes: an axis (split over every mesh dimension), None (replicate), a
# Placement, or one of them per mesh dimension.
ShardArg = int | Placement | Sequence[int | Placement | None] | None


def bounds(length: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part `index` of `length` split in `parts` as np.array_split does."""
    base, extra = divmod(length, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


@lru_cache(maxsize=65536)
def local_box(shape: tuple, placements: tuple, mesh_shape: tuple, coord: tuple) -> tuple:
    """((start, stop) per axis) of the block of a `shape` tensor at mesh coordinate `coord`."""
    box = [(0, n) for n in shape]
    for dim, placement in enumerate(placements):
        if type(placement) is Shard:
            start, stop = box[placement.axis]
            lo, hi = bounds(stop - start, mesh_shape[dim], coord[dim])
            box[placement.axis] = (start + lo, start + hi)
    return tuple(box)


def local_shape(shape: tuple, placements: tuple, mesh_shape: tuple, coord: tuple) -> tuple:
    """The shape of the block at `coord` (Replicate and Partial keep the whole length)."""
    return tuple(stop - start for start, stop in local_box(shape, placements, mesh_shape, coord))


_LOCAL_SPECS: dict = {}  # (global Spec, placements, mesh) -> each place's Spec


def local_specs(spec: Spec, placements: tuple, mesh) -> tuple:
    """The Spec of each place's block of a tensor of global `spec` (remembered)."""
    key = (spec, placements, mesh)
    found = _LOCAL_SPECS.get(key)
    if found is None:
        if len(_LOCAL_SPECS) > 10_000:
            _LOCAL_SPECS.clear()
        found = _LOCAL_SPECS[key] = tuple(
            Spec(local_shape(spec.shape, placements, mesh.shape, c), spec.dtype)
            for c in mesh.coords)
    return found


def sharded_axes(placements: tuple) -> set:
    """The tensor axes some mesh dimension shards."""
    return {p.axis for p in placements if type(p) is Shard}


def describe(placements: tuple) -> str:
    """'Shard(0)' on a 1-D mesh, '(Shard(0), Replicate())' on more, for messages."""
    if len(placements) == 1:
        return repr(placements[0])
    return "(" + ", ".join(map(repr, placements)) + ")"


def normalize(placements, ndim: int, mesh_ndim: int, what: str) -> tuple:
    """`placements` as a tuple of one Placement per mesh dimension, axes made non-negative."""
    if isinstance(placements, Placement):
        placements = (placements,) * mesh_ndim
    placements = tuple(placements)
    if len(placements) != mesh_ndim:
        raise ValueError(f"{what}: one placement per mesh dimension (got {len(placements)} for "
                         f"a {mesh_ndim}-D mesh)")
    out = []
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"{what}: placements are Shard(axis), Replicate() or Partial(op) "
                            f"(got {p!r})")
        if type(p) is Shard:
            axis = p.axis
            if not 0 <= axis < ndim:
                raise ValueError(f"{what}: Shard({axis}) of a {ndim}-D tensor (axis out of "
                                 f"range; expected 0..{ndim - 1})")
            p = Shard(axis)
        out.append(p)
    return tuple(out)


def shard_arg(shard, ndim: int, mesh_ndim: int, what: str) -> tuple:
    """The placements `shard=` asks for: None replicates; an int shards that axis over every
    mesh dimension (the tensor split over all places); a sequence gives one per dimension
    (an int, None for Replicate, or a Placement)."""
    if shard is None:
        return (REPLICATE,) * mesh_ndim
    if isinstance(shard, Placement):
        return normalize(shard, ndim, mesh_ndim, what)
    if isinstance(shard, int):
        return normalize(Shard(_axis(shard, ndim, what)), ndim, mesh_ndim, what)
    items: list[Placement] = []
    for s in shard:
        if s is None:
            items.append(REPLICATE)
        elif isinstance(s, int):
            items.append(Shard(_axis(s, ndim, what)))
        else:
            items.append(s)
    return normalize(items, ndim, mesh_ndim, what)


def _axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what}: shard={axis} is not an axis of a {ndim}-D tensor "
                         f"(expected {-ndim}..{ndim - 1})")
    return axis % ndim


def basic_index(index, ndim):
    """[(axis, item) or None (a new axis)] for a basic index; None for any other index."""
    items = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice))
               for i in items) or sum(i is Ellipsis for i in items) > 1:
        return None
    real = sum(i is not None and i is not Ellipsis for i in items)
    out: list[tuple[int, Any] | None] = []
    ax = 0
    for i in items:
        if i is Ellipsis:
            for _ in range(ndim - real):
                out.append((ax, slice(None)))
                ax += 1
        elif i is None:
            out.append(None)
        else:
            out.append((ax, i))
            ax += 1
    out += [(a, slice(None)) for a in range(ax, ndim)]
    return out
