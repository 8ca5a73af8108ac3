"""mwrt.attached(): the named tensors of a session a new master re-attached to.

A named session (`init_master_worker(session="name")`) outlives its master for
MWRT_SESSION_GRACE seconds; a master with the same name and key that connects in that
time gets the session back, and here, handles to the tensors the program had named
(`t.name = "w"`, or the names given to mwrt.save). A sharded tensor comes back whole, on
its mesh, from the names of its places' blocks (mesh/naming.py).
"""

from __future__ import annotations

import json

import numpy as np

from ..ops import Spec
from .cluster import current
from .mesh.device_mesh import Mesh
from .mesh.naming import LAYOUT
from .mesh.saving import parse_placement
from .tensor import DistributedTensor


def attached() -> dict:
    """The named tensors of the re-attached session, by name (empty for a new session)."""
    cluster = current()
    if cluster.attached is None:
        found: dict = {}
        layouts: dict = {}
        for node in cluster.nodes:
            for name, (ref, shape, dtype, device) in (node.resumed or {}).get("names",
                                                                               {}).items():
                if LAYOUT in name:
                    base, _, text = name.partition(LAYOUT)
                    layouts[base] = json.loads(text)
                    continue
                key = name if name not in found else f"{name} (node {node.index})"
                t = DistributedTensor(node, device, ref, Spec(tuple(shape), np.dtype(dtype)),
                                      device)
                t.name = name
                found[key] = t
        for base, layout in layouts.items():
            _rebuild(found, base, layout)
        cluster.attached = found
    return dict(cluster.attached)


def _rebuild(found: dict, base: str, layout: dict) -> None:
    """Put sharded tensor `base` back together from its places' local tensors in `found`
    (left as pieces if one of them is gone: its worker freed it)."""
    places = [tuple(p) for p in layout["mesh"]["places"]]
    pieces = [f"{base}#{i}" for i in range(len(places))]
    if not all(p in found for p in pieces):
        return
    mesh = Mesh(places, tuple(layout["mesh"]["shape"]), tuple(layout["mesh"]["names"]))
    placements = tuple(parse_placement(text, base) for text in layout["placements"])
    t = DistributedTensor.on_mesh(mesh, placements, [found.pop(p) for p in pieces],
                                  Spec(tuple(layout["shape"]), np.dtype(layout["dtype"])))
    t.name = base
    found[base] = t
