"""Meshes: an n-D grid of places (node, device) that sharded tensors lie on.

`mwrt.mesh()` is every node's host memory, `mwrt.mesh(nodes=[0, 2])` some of them,
`mwrt.mesh(devices="gpu")` every GPU of every node ("node" x "gpu" when each node has the
same count), and `mwrt.mesh({"dp": 2, "tp": 2})` lays the places out in named dimensions
(row-major, as DTensor's DeviceMesh and Monarch's meshes do). `with mesh:` makes new tensors
of mwrt's constructors and dist_send sharded tensors of it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np

from ...arrays import HOST
from ..cluster import OfTheSession, current

_state = threading.local()


class Mesh(OfTheSession):
    """Places (node, device) in an n-D grid with named dimensions."""

    _kind = "made of this master's nodes"
    _fix = "make one where it is needed (mwrt.mesh())"

    def __init__(self, places: Sequence[tuple], shape: tuple, names: tuple):
        if math.prod(shape) != len(places):
            raise ValueError(f"mesh: dimensions {dict(zip(names, shape))} hold "
                             f"{math.prod(shape)} places (got {len(places)} places); give "
                             "sizes whose product is the number of places")
        if len(set(places)) != len(places):
            raise ValueError(f"mesh: a place is named twice (got {list(places)})")
        cluster = current()
        self.places = tuple((int(n), int(d)) for n, d in places)
        self.nodes = tuple(cluster.node(n) for n, _ in self.places)
        for node, (_, device) in zip(self.nodes, self.places):
            node.check_device(device)
        self.shape, self.dim_names = tuple(shape), tuple(names)
        self.coords = tuple(tuple(int(c) for c in np.unravel_index(i, self.shape))
                            for i in range(len(self.places)))
        self._groups: dict = {}
        self.place_devices = tuple(d for _, d in self.places)
        devices = set(self.place_devices)
        # The device of every place when they share one (a mesh op's one command), else None.
        self.devices = devices.pop() if len(devices) == 1 else None
        self._hash = hash((self.places, self.shape))
        cluster.meshes.add(self)  # replace_node gives it the new node of a lost place

    def shared_ids(self):
        """The id counter every node of the mesh draws from, so that one id can name a block
        at every place; None where two places share a node (its GPUs) or a re-attached
        session numbers each node on from its own earlier commands."""
        cached = self.__dict__.get("_counter")
        if cached is None or cached[0] is not self.nodes:  # replace_node makes a new tuple
            ids = self.nodes[0].ids
            shared = len(set(self.nodes)) == len(self.nodes) and all(
                n.ids is ids for n in self.nodes)
            cached = self._counter = (self.nodes, ids if shared else None)
        return cached[1]

    @property
    def ndim(self) -> int:
        """The number of mesh dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of places."""
        return len(self.places)

    def __len__(self) -> int:
        return len(self.places)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and (self.places, self.shape) == (other.places,
                                                                          other.shape)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.dim_names, self.shape))
        return f"Mesh({dims}; places {list(self.places)})"

    def dim(self, name: int | str) -> int:
        """The index of dimension `name` (its name or its index)."""
        if isinstance(name, str):
            if name not in self.dim_names:
                raise ValueError(f"mesh: no dimension {name!r} (it has "
                                 f"{', '.join(self.dim_names)})")
            return self.dim_names.index(name)
        if not -self.ndim <= name < self.ndim:
            raise ValueError(f"mesh: no dimension {name} (it has {self.ndim})")
        return name % self.ndim

    def groups(self, dim: int | tuple) -> list[list[int]]:
        """The places along mesh dimension `dim`: one list (flat indices) per line of it;
        along several (a tuple), each line in their row-major order, as nested shards of
        one axis lie along it."""
        found = self._groups.get(dim)
        if found is None:
            dims = dim if isinstance(dim, tuple) else (dim,)
            grid = np.arange(self.size).reshape(self.shape)
            lines = np.moveaxis(grid, dims, range(-len(dims), 0)).reshape(
                -1, math.prod(self.shape[d] for d in dims))
            found = self._groups[dim] = [[int(i) for i in line] for line in lines]
        return found

    def __enter__(self) -> Mesh:
        _stack().append(self)
        return self

    def __exit__(self, *exc) -> None:
        _stack().pop()


def _stack() -> list:
    stack = getattr(_state, "meshes", None)
    if stack is None:
        stack = _state.meshes = []
    return stack


def current_mesh() -> Mesh | None:
    """The mesh of the innermost `with mesh:` block, or None."""
    stack = _stack()
    return stack[-1] if stack else None


def wanted(mesh, shard) -> Mesh | None:
    """The mesh a constructor called with `mesh`/`shard` (or in a `with mesh:`) makes on."""
    if mesh is None:
        mesh = current_mesh()
        if mesh is None and shard is not None:
            raise ValueError("shard=: no mesh to shard over; pass mesh=mwrt.mesh(), or work "
                             "inside `with mesh:`")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"mesh=: expected a Mesh from mwrt.mesh() (got {type(mesh).__name__})")
    return mesh


def mesh(dims: dict | Sequence[int] | int | None = None, *, nodes: Sequence[int] | None = None,
         devices: str | int | Sequence[int] | None = None) -> Mesh:
    """A mesh of the places (node, device) of `nodes` (default: every node) on `devices`
    ("host": host memory, the default; "gpu": every GPU of each node, the default when a
    dimension is named "gpu"; an index or a list of them), laid out as `dims`
    ({"name": size, ...}, sizes, or None: one dimension, or node x gpu)."""
    if devices is None:
        devices = "gpu" if isinstance(dims, dict) and "gpu" in dims else "host"
    cluster = current()
    nodes = list(range(len(cluster.nodes))) if nodes is None else list(nodes)
    if not nodes:
        raise ValueError("mesh: no nodes (got an empty list); name at least one node")
    places, per_node = [], []
    for n in nodes:
        node = cluster.node(n)
        local = _devices_of(node, devices)
        per_node.append(len(local))
        places += [(n, d) for d in local]
    if dims is None:
        if devices == "gpu" and len(set(per_node)) == 1 and per_node[0] > 1:
            dims = {"node": len(nodes), "gpu": per_node[0]}
        else:
            dims = {"node" if devices == "host" else "place": len(places)}
    if isinstance(dims, int):
        dims = (dims,)
    if not isinstance(dims, dict):
        dims = {f"dim{i}": size for i, size in enumerate(dims)}
    return Mesh(places, tuple(dims.values()), tuple(dims))


def _devices_of(node, devices) -> list[int]:
    if devices == "host":
        return [HOST]
    if devices == "gpu":
        count = node.info.devices if node.info is not None else 0
        if count == 0:
            raise ValueError(f"mesh: node {node.index} has no GPU (devices='gpu'); use "
                             "devices='host', or leave that node out (nodes=[...])")
        return list(range(count))
    if isinstance(devices, int):
        return [node.check_device(devices)]
    if isinstance(devices, (list, tuple)):
        return [node.check_device(d) for d in devices]
    raise ValueError(f"mesh: devices must be 'host', 'gpu', a device index or a list of them "
                     f"(got {devices!r})")
