"""The facade's collectives: torch.distributed signatures over mwrt.collectives.

Not async, each returns its output (the 2017 proposal's `result = all_reduce(t)`); torch
returns None there, which no torch program reads.

Lists of arrays (torch's gather_list, tensor_list…) are staged through one contiguous
buffer, which the algorithms need; the `*_into_tensor` / `*_tensor` variants take that
buffer directly and copy nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import config
from ..arrays import gpu_module, use_device
from ..collective import api as C
from ..collective.buffers import as_flat, is_bfloat16, widen_bfloat16
from ..collective.reduce_ops import ReduceOp
from .process_groups import GroupLike, Tensor, Timeout, group_rank_of, resolve_group, run_collective


def broadcast(tensor: Tensor, src: int = 0, group: GroupLike = None,
              async_op: bool = False) -> Any:
    """Copy `tensor` from global rank `src` to every rank of the group, in place."""
    g = resolve_group(group)
    root = g and group_rank_of(g, src, "broadcast")
    return run_collective(group, async_op, C.broadcast, tensor, root, result=tensor)


def all_reduce(tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: GroupLike = None,
               async_op: bool = False) -> Any:
    """Reduce `tensor` across the group in place; bitwise identical on every rank."""
    return run_collective(group, async_op, C.all_reduce, tensor, op, result=tensor)


def reduce(tensor: Tensor, dst: int = 0, op: ReduceOp = ReduceOp.SUM, group: GroupLike = None,
           async_op: bool = False) -> Any:
    """Reduce `tensor` into `tensor` on global rank `dst`."""
    g = resolve_group(group)
    root = g and group_rank_of(g, dst, "reduce")
    return run_collective(group, async_op, C.reduce, tensor, root, op, result=tensor)


def _stack(arrays, like, what, fill: bool = False, reduces: bool = False):
    """One contiguous buffer shaped (n, *like.shape) for a list of same-shaped arrays, with
    their values if `fill` (bfloat16 widened to float32 where the collective `reduces`)."""
    n = len(arrays)
    for i, a in enumerate(arrays):
        if np.shape(a) != np.shape(like):
            raise ValueError(f"{what}: list entry {i} has shape {np.shape(a)}, expected "
                             f"{np.shape(like)} like the local array")
    if hasattr(like, "__cuda_array_interface__"):  # GPU arrays: stack on their GPU
        with use_device(like.device.id):
            buf = gpu_module().empty((n,) + np.shape(like), like.dtype)
        for row, a in zip(buf, arrays if fill else ()):
            row[...] = a
        return buf
    widen = reduces and is_bfloat16(like)
    dtype = np.float32 if widen else as_flat(like, what, writable=False).dtype
    buf = np.empty((n,) + np.shape(like), dtype)
    for row, a in zip(buf, arrays if fill else ()):
        flat = as_flat(a, what, writable=False)
        row.reshape(-1)[:] = widen_bfloat16(flat) if widen else flat
    return buf


def _sizes(arrays) -> list[int]:
    return [int(np.prod(np.shape(a))) for a in arrays]


def _unstack(buf, arrays):
    """Copy the consecutive parts of `buf` into `arrays`, each as many as it holds."""
    cuts = np.cumsum(_sizes(arrays))[:-1].tolist()  # a list: CuPy's split takes no NumPy
    for a, part in zip(arrays, np.split(buf.reshape(-1), cuts)):
        if hasattr(a, "__cuda_array_interface__"):
            a[...] = part.reshape(a.shape)  # a GPU array (CuPy's are no NumPy views)
        else:
            as_flat(a, "output list")[:] = part


def gather(tensor: Tensor, gather_list: list | None = None, dst: int = 0,
           group: GroupLike = None, async_op: bool = False) -> Any:
    """Gather every rank's `tensor` into `gather_list` on global rank `dst`."""
    g = resolve_group(group)
    if g is None:
        return None
    root = group_rank_of(g, dst, "gather")
    is_root = g.rank == root
    if is_root and (gather_list is None or len(gather_list) != g.size):
        raise ValueError(f"gather: dst needs gather_list with {g.size} arrays (got "
                         f"{None if gather_list is None else len(gather_list)})")
    buf = _stack(gather_list, tensor, "gather") if is_root else None
    return run_collective(group, async_op, lambda g: C.gather(g, tensor, buf, root),
                          after=lambda: is_root and _unstack(buf, gather_list),
                          result=gather_list)


def scatter(tensor: Tensor, scatter_list: list | None = None, src: int = 0,
            group: GroupLike = None, async_op: bool = False) -> Any:
    """Send scatter_list[i] on global rank `src` into `tensor` on group rank i."""
    g = resolve_group(group)
    if g is None:
        return None
    root = group_rank_of(g, src, "scatter")
    buf = None
    if g.rank == root:
        if scatter_list is None or len(scatter_list) != g.size:
            raise ValueError(f"scatter: src needs scatter_list with {g.size} arrays")
        buf = _stack(scatter_list, tensor, "scatter", fill=True)
    return run_collective(group, async_op, C.scatter, tensor, buf, root, result=tensor)


def all_gather(tensor_list: list, tensor: Tensor, group: GroupLike = None,
               async_op: bool = False) -> Any:
    """Gather every rank's `tensor` into `tensor_list` on every rank."""
    g = resolve_group(group)
    if g is None:
        return None
    if len(tensor_list) != g.size:
        raise ValueError(f"all_gather: tensor_list needs {g.size} arrays (got {len(tensor_list)})")
    if all(np.shape(a) == np.shape(tensor) for a in tensor_list):
        buf = _stack(tensor_list, tensor, "all_gather")
        return run_collective(group, async_op, lambda g: C.all_gather(g, buf, tensor),
                              after=lambda: _unstack(buf, tensor_list), result=tensor_list)
    # Uneven sizes, as torch allows: entry i is rank i's array, ours must match our input.
    if np.shape(tensor_list[g.rank]) != np.shape(tensor):
        raise ValueError(f"all_gather: tensor_list[{g.rank}] (this rank's entry) has shape "
                         f"{np.shape(tensor_list[g.rank])}, expected the input's "
                         f"{np.shape(tensor)}")
    counts = _sizes(tensor_list)
    flat = np.empty(sum(counts), as_flat(tensor, "all_gather", writable=False).dtype)
    return run_collective(group, async_op, lambda g: C.all_gather_v(g, flat, tensor, counts),
                          after=lambda: _unstack(flat, tensor_list), result=tensor_list)


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group: GroupLike = None,
                           async_op: bool = False) -> Any:
    """all_gather into one array holding world-size copies of the input's size."""
    return run_collective(group, async_op, C.all_gather, output_tensor, input_tensor,
                          result=output_tensor)


def reduce_scatter(output: Tensor, input_list: list, op: ReduceOp = ReduceOp.SUM,
                   group: GroupLike = None, async_op: bool = False) -> Any:
    """Reduce input_list[i] across ranks into `output` on group rank i."""
    g = resolve_group(group)
    if g is None:
        return None
    if len(input_list) != g.size:
        raise ValueError(f"reduce_scatter: input_list needs {g.size} arrays (got "
                         f"{len(input_list)})")
    buf = _stack(input_list, output, "reduce_scatter", fill=True, reduces=True)
    return run_collective(group, async_op, C.reduce_scatter, output, buf, op, result=output)


def reduce_scatter_tensor(output: Tensor, input: Tensor, op: ReduceOp = ReduceOp.SUM,
                          group: GroupLike = None, async_op: bool = False) -> Any:
    """reduce_scatter from one array holding world-size rows."""
    return run_collective(group, async_op, C.reduce_scatter, output, input, op, result=output)


def all_to_all(output_tensor_list: list, input_tensor_list: list, group: GroupLike = None,
               async_op: bool = False) -> Any:
    """Rank r's input_tensor_list[p] lands in rank p's output_tensor_list[r] (any sizes)."""
    g = resolve_group(group)
    if g is None:
        return None
    if len(output_tensor_list) != g.size or len(input_tensor_list) != g.size:
        raise ValueError(f"all_to_all: both lists need {g.size} arrays")
    # Always the per-peer form: whether the sizes happen to be equal is each rank's local
    # view, so ranks deciding by it could pick different algorithms for one call.
    dtype = as_flat(input_tensor_list[0], "all_to_all", writable=False).dtype
    src = np.concatenate([as_flat(a, "all_to_all", writable=False) for a in input_tensor_list]
                         ).astype(dtype, copy=False)
    send_counts, recv_counts = _sizes(input_tensor_list), _sizes(output_tensor_list)
    out = np.empty(sum(recv_counts), dtype)
    return run_collective(group, async_op,
                          lambda g: C.all_to_all_v(g, out, src, send_counts, recv_counts),
                          after=lambda: _unstack(out, output_tensor_list),
                          result=output_tensor_list)


def all_to_all_single(output: Tensor, input: Tensor, output_split_sizes: list | None = None,
                      input_split_sizes: list | None = None, group: GroupLike = None,
                      async_op: bool = False) -> Any:
    """all_to_all over one array: equal rows per rank, or the given split sizes (dim 0;
    every rank passes them, or none does)."""
    if output_split_sizes is None and input_split_sizes is None:
        return run_collective(group, async_op, C.all_to_all, output, input, result=output)
    g = resolve_group(group)
    if g is None:
        return None

    def counts(arr, sizes, name):
        shape = np.shape(arr)
        row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        if sizes is None:
            if not shape or shape[0] % g.size:
                raise ValueError(f"all_to_all_single: {name} needs {name}_split_sizes, or a "
                                 f"first dimension divisible by {g.size} (got shape {shape})")
            sizes = [shape[0] // g.size] * g.size
        return [int(k) * row for k in sizes]
    send = counts(input, input_split_sizes, "input")
    recv = counts(output, output_split_sizes, "output")
    return run_collective(group, async_op, C.all_to_all_v, output, input, send, recv,
                          result=output)


def barrier(group: GroupLike = None, async_op: bool = False,
            device_ids: list | None = None) -> Any:
    """Block until every rank of the group has called barrier (device_ids: accepted, unused)."""
    return run_collective(group, async_op, C.barrier)


def monitored_barrier(group: GroupLike = None, timeout: Timeout = None,
                      wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not reach it within `timeout` (torch's)."""
    g = resolve_group(group)
    if g is None:
        return None
    return run_collective(group, False, C.monitored_barrier, config.seconds(timeout, g.timeout),
                          wait_all_ranks)


__all__ = ["broadcast", "all_reduce", "reduce", "gather", "scatter", "all_gather",
           "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
           "all_to_all_single", "barrier", "monitored_barrier"]
