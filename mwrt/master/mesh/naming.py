"""Names of mesh tensors, for a master that re-attaches to a named session.

A mesh tensor named "X" names each place's block "X#i" (i: the place's index in the mesh)
on its worker, and the first place's block also "X#layout:" followed by the layout (global
shape, mesh, placements) as JSON, so that mwrt.attached() can put the whole tensor back
together from what the workers report, without a round trip and without the old master.
"""

from __future__ import annotations

import json

import numpy as np

from ...protocol import wire

LAYOUT = "#layout:"  # what follows it in a name is the mesh tensor's layout


def name_places(t, value: str) -> None:
    """Name every place's block of mesh tensor `t`, and say on the first how they make `t`."""
    if LAYOUT in value:
        raise TypeError(f"name: must not hold {LAYOUT!r} (got {value!r})")
    mesh = t.mesh
    layout = {"shape": list(t.shape), "dtype": np.dtype(t.dtype).str,
              "mesh": {"places": [list(p) for p in mesh.places], "shape": list(mesh.shape),
                       "names": list(mesh.dim_names)},
              "placements": [repr(p) for p in t.placements]}
    blocks = t.shards()
    for i, block in enumerate(blocks):
        block.name = f"{value}#{i}"
    first = blocks[0]
    first._node.issue(wire.Name(id=next(first._node.ids), ref=first._id,
                                name=value + LAYOUT + json.dumps(layout, separators=(",", ":"))))


__all__ = ["LAYOUT", "name_places"]
