"""Sharded tensors in checkpoints: the blocks a save writes, and the tensor a load assembles.

A save writes each distinct block of a sharded tensor once (a replicated block from its first
place), as a tensor of its own named "name#k", and the manifest keeps the global shape, the
mesh and the placements. A load onto the same mesh reads each block where it goes (a replica
from the place that wrote it, worker to worker); onto another mesh or layout, every place
reads the blocks that overlap its own and writes them into it: each worker reads its part
itself, and nothing passes through the master.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ...ops import Spec
from ..creation import zeros
from ..tensor import DistributedTensor
from .device_mesh import Mesh
from .placement import Partial, Replicate, Shard, local_box

_PLACEMENT = re.compile(r"(Shard)\((\d+)\)|(Replicate)\(\)|(Partial)\('(\w+)'\)")


def blocks(name: str, t: DistributedTensor) -> tuple[dict, list]:
    """(manifest entry, [(block name, local tensor)]) of the distinct blocks of `t`."""
    if any(p.is_partial() for p in t.placements):
        t = t.reduce()  # the value is what is saved, not its parts
    mesh, spec = t.mesh, t.spec
    seen: set[tuple] = set()
    parts: list[tuple[str, Any]] = []  # (block name, local tensor)
    listed: list[dict] = []
    for coord, local in zip(mesh.coords, t.shards()):
        box = local_box(tuple(spec.shape), t.placements, mesh.shape, coord)
        if box in seen:
            continue
        seen.add(box)
        block = f"{name}#{len(parts)}"
        parts.append((block, local))
        listed.append({"name": block, "box": [list(b) for b in box]})
    entry = {"shape": list(spec.shape), "dtype": np.dtype(spec.dtype).str,
             "mesh": {"places": [list(p) for p in mesh.places], "shape": list(mesh.shape),
                      "names": list(mesh.dim_names)},
             "placements": [repr(p) for p in t.placements], "blocks": listed}
    return entry, parts


def assemble(name: str, entry: dict, mesh: Mesh | None, load_at) -> DistributedTensor:
    """The sharded tensor `entry` describes, on `mesh` (default: the one it was saved on);
    `load_at(block, node, device)` reads a block at a place."""
    saved = [_placement(text, name) for text in entry["placements"]]
    if mesh is None:
        mesh = _saved_mesh(name, entry)
    placements = tuple(saved) if mesh.ndim == len(saved) else _flat(saved, mesh.ndim)
    shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
    blocks_ = [(b["name"], tuple(tuple(x) for x in b["box"])) for b in entry["blocks"]]
    writers = {b["name"]: tuple(p) for b, p in zip(entry["blocks"], _writers(entry))}
    locals_: list = []
    read: dict = {}  # block -> where _exact read it, for the other places to copy
    for coord, (node, device) in zip(mesh.coords, mesh.places):
        box = local_box(shape, placements, mesh.shape, coord)
        exact = [block for block, b in blocks_ if b == box]
        if exact:
            locals_.append(_exact(exact[0], (node, device), writers[exact[0]], mesh, read,
                                  load_at))
            continue
        local = zeros(tuple(hi - lo for lo, hi in box), dtype=dtype, node=node, device=device)
        for block, b in blocks_:
            overlap = [(max(lo, blo), min(hi, bhi)) for (lo, hi), (blo, bhi) in zip(box, b)]
            if all(lo < hi for lo, hi in overlap):
                part = load_at(block, node, device)
                local[tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(overlap, box))] = \
                    part[tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(overlap, b))]
        locals_.append(local)
    return DistributedTensor.on_mesh(mesh, placements, locals_, Spec(shape, dtype))


def _exact(block: str, place: tuple, writer: tuple, mesh: Mesh, read: dict, load_at):
    """A block that is this place's whole part: read here, or copied from where it was read
    (a replica: the place that wrote it may be on another host, with its own disk)."""
    if place == writer or writer not in mesh.places:
        return load_at(block, *place)
    if block not in read:
        read[block] = load_at(block, *writer)
    return read[block].to(node=place[0], device=place[1])


def _writers(entry: dict) -> list:
    """The place that wrote each block: the first place holding that box."""
    places, shape = [tuple(p) for p in entry["mesh"]["places"]], tuple(entry["mesh"]["shape"])
    placements = tuple(_placement(t, "") for t in entry["placements"])
    coords = [tuple(int(c) for c in np.unravel_index(i, shape)) for i in range(len(places))]
    found: dict[tuple, tuple] = {}
    for coord, place in zip(coords, places):
        found.setdefault(local_box(tuple(entry["shape"]), placements, shape, coord), place)
    return [found[tuple(tuple(x) for x in b["box"])] for b in entry["blocks"]]


def _saved_mesh(name: str, entry: dict) -> Mesh:
    places = [tuple(p) for p in entry["mesh"]["places"]]
    try:
        return Mesh(places, tuple(entry["mesh"]["shape"]), tuple(entry["mesh"]["names"]))
    except ValueError as exc:
        raise ValueError(f"mwrt.load: {name!r} was saved on a mesh of places {places}, which "
                         f"this session lacks ({exc}); load it onto a mesh of this session "
                         "with mesh=mwrt.mesh(...)") from None


def _flat(saved: list, ndim: int) -> tuple:
    """Placements for a mesh of another rank: the first sharded axis along its first
    dimension, replicated along the others."""
    axes = [p.axis for p in saved if type(p) is Shard]
    first = Shard(axes[0]) if axes else Replicate()
    return (first,) + (Replicate(),) * (ndim - 1)


def _placement(text: str, name: str):
    match = _PLACEMENT.fullmatch(text)
    if match is None:
        raise ValueError(f"mwrt.load: {name!r} has a placement this mwrt cannot read "
                         f"(got {text!r}, expected Shard(k), Replicate() or Partial('op'))")
    if match.group(1):
        return Shard(int(match.group(2)))
    return Replicate() if match.group(3) else Partial(match.group(5))


parse_placement = _placement  # a placement from its repr, for mwrt.attached()
