"""Collectives and messages of any picklable object, as torch's *_object functions.

Pickle is fine here: the ranks are one user's own processes (SPMD), unlike the daemon's
wire, which never unpickles. Sizes travel first; the bytes follow in one array. Each runs
through the same entry as every collective (`run_collective`): after the group's pending async
collectives, whose sequence numbers and checks it must not interleave with.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..collective import api as C
from .p2p import recv, send
from .process_groups import GroupLike, group_rank_of, run_collective


def _pickled(obj) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


def _padded(parts: list, width: int) -> np.ndarray:
    """The byte arrays `parts`, one row each, zero-padded to `width`."""
    rows = np.zeros((len(parts), width), np.uint8)
    for row, part in zip(rows, parts):
        row[:part.size] = part
    return rows


def all_gather_object(object_list: list, obj: Any, group: GroupLike = None) -> None:
    """Fill object_list[i] with rank i's `obj`."""
    run_collective(group, False, _all_gather_object, object_list, obj)


def _all_gather_object(g, object_list, obj) -> None:
    data = _pickled(obj)
    sizes = np.zeros(g.size, np.int64)
    C.all_gather(g, sizes, np.array([data.size], np.int64))
    everything = np.empty(int(sizes.sum()), np.uint8)
    C.all_gather_v(g, everything, data, sizes)
    for i, part in enumerate(np.split(everything, np.cumsum(sizes)[:-1])):
        object_list[i] = pickle.loads(part.tobytes())


def gather_object(obj: Any, object_gather_list: list | None = None, dst: int = 0,
                  group: GroupLike = None) -> None:
    """Fill object_gather_list[i] on global rank `dst` with rank i's `obj`."""
    run_collective(group, False, _gather_object, obj, object_gather_list, dst)


def _gather_object(g, obj, object_gather_list, dst) -> None:
    root = group_rank_of(g, dst, "gather_object")
    if g.rank == root and (object_gather_list is None or len(object_gather_list) < g.size):
        raise ValueError(f"gather_object: dst needs object_gather_list with {g.size} slots")
    data = _pickled(obj)
    sizes = np.zeros(g.size, np.int64)
    C.all_gather(g, sizes, np.array([data.size], np.int64))
    width = int(sizes.max())
    rows = np.empty((g.size, width), np.uint8) if g.rank == root else None
    C.gather(g, _padded([data], width)[0], rows, root)
    if rows is not None:  # the root's
        for i in range(g.size):
            object_gather_list[i] = pickle.loads(rows[i, :sizes[i]].tobytes())


def scatter_object_list(scatter_object_output_list: list,
                        scatter_object_input_list: list | None = None, src: int = 0,
                        group: GroupLike = None) -> None:
    """Set scatter_object_output_list[0] on group rank i to item i of the list on `src`."""
    run_collective(group, False, _scatter_object_list, scatter_object_output_list,
              scatter_object_input_list, src)


def _scatter_object_list(g, scatter_object_output_list, scatter_object_input_list, src):
    root = group_rank_of(g, src, "scatter_object_list")
    sizes, rows = np.zeros(g.size, np.int64), None
    if g.rank == root:
        if scatter_object_input_list is None or len(scatter_object_input_list) != g.size:
            raise ValueError(f"scatter_object_list: src needs {g.size} objects to scatter")
        parts = [_pickled(o) for o in scatter_object_input_list]
        sizes[:] = [p.size for p in parts]
    C.broadcast(g, sizes, root)
    if g.rank == root:
        rows = _padded(parts, int(sizes.max()))
    mine = np.empty(int(sizes.max()), np.uint8)
    C.scatter(g, mine, rows, root)
    scatter_object_output_list[0] = pickle.loads(mine[:sizes[g.rank]].tobytes())


def broadcast_object_list(object_list: list, src: int = 0, group: GroupLike = None) -> None:
    """Replace object_list's items everywhere with those on global rank `src`."""
    run_collective(group, False, _broadcast_object_list, object_list, src)


def _broadcast_object_list(g, object_list, src) -> None:
    root = group_rank_of(g, src, "broadcast_object_list")
    data = _pickled(list(object_list)) if g.rank == root else None
    size = np.array([0 if data is None else data.size], np.int64)
    C.broadcast(g, size, root)
    buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
    C.broadcast(g, buf, root)
    if g.rank != root:
        object_list[:] = pickle.loads(buf.tobytes())


def send_object_list(object_list: list, dst: int, group: GroupLike = None) -> None:
    """Send the list's items to global rank `dst` (its size, then its bytes, on tag 0)."""
    data = _pickled(list(object_list))
    send(np.array([data.size], np.int64), dst, group)
    send(data, dst, group)


def recv_object_list(object_list: list, src: int | None = None,
                     group: GroupLike = None) -> int:
    """Replace the list's items with those `src` (or the first sender) sent; return it."""
    size = np.zeros(1, np.int64)
    src = recv(size, src, group)
    data = np.empty(int(size[0]), np.uint8)
    recv(data, src, group)
    object_list[:] = pickle.loads(data.tobytes())
    return src


__all__ = ["all_gather_object", "gather_object", "scatter_object_list", "broadcast_object_list",
           "send_object_list", "recv_object_list"]
