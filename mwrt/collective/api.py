"""Collectives written once over any channel's point-to-point send/recv/isend/irecv.

Every algorithm here sees a ProcessGroup (mwrt.group): its rank, size, and send/recv to
other group ranks; none sees a socket. Each public function validates its arguments,
turns the buffer into a flat NumPy view of the same memory, handles world size 1 first,
and opens `group.collective(...)`, which checks that every rank called the
same collective with the same op, dtype, shape and root (mwrt.collective.agreement: the check rides
inside the messages of small all_reduce and barrier, and beside the first data messages of
the others; a mismatch raises CollectiveMismatchError on every rank, naming each rank's
values, before any received data is used). Data messages carry a tag derived from (group,
sequence number), so a message left over from a failed collective never matches the next.
A channel's native collective, if any, is offered every call, count 0 included, so ranks
that disagree on the count still meet in the same place (and learn that they disagree).

Sizes pick the algorithm: up to `small_bytes` a latency-bound one (recursive doubling,
binomial trees, Bruck's all-gather), above it a bandwidth-bound one (a segmented,
pipelined ring; a pipelined chain for broadcast). `segment_bytes` splits ring chunks
so tests can reach multi-segment paths with tiny arrays. Reductions run in place with
NumPy ufuncs, always as op(lower-rank block, higher-rank block), and every final value is
computed once and copied, so results are bitwise identical on every rank.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np

from ..errors import ChannelClosedError, ChannelError, ChannelTimeoutError
from . import algorithms as alg
from . import hierarchy
from .agreement import check
from .buffers import host_view
from .reduce_ops import ReduceOp, reduce_op
from .scratch import scratch

_SCRATCH_COPY_BYTES = 256 << 20  # reduce_scatter's copy of its input: reused up to this size

# -- the collectives -----------------------------------------------------------------------


def _check_size(arr, expected: int, what: str, name: str) -> None:
    if arr is None or arr.size != expected:
        got = "None" if arr is None else f"{arr.size} elements"
        raise ValueError(f"{what}: {name} has the wrong size (got {got}, expected {expected} "
                         "= world size x the per-rank count)")


def _counts(group, counts, what: str, which: str = "") -> list[int]:
    """`counts` as ints, one >= 0 per group rank, or a ValueError naming them."""
    counts = [int(c) for c in counts]
    if len(counts) != group.size or min(counts) < 0:
        raise ValueError(f"{what}: need a {which}count >= 0 per rank, {group.size} of them "
                         f"(got {counts})")
    return counts


def _check_root(group, root: int, what: str) -> None:
    if not isinstance(root, int) or not 0 <= root < group.size:
        raise ValueError(f"{what}: root must be a group rank in [0, {group.size}) (got {root!r})")


def all_reduce(group, buf, op=ReduceOp.SUM) -> None:
    """Reduce `buf` across the group in place; every rank ends with the same bits."""
    with host_view(buf, group, "all_reduce", reduces=True) as arr:
        op = reduce_op(op, arr.dtype, "all_reduce")
        if group.size == 1:
            return
        two = hierarchy.levels(group)
        with group.collective("all_reduce", op=op, dtype=arr.dtype, shape=np.shape(buf),
                              count=arr.size) as call:
            if two is not None:  # several hosts, several ranks on one: inside hosts first
                call.settle()  # every rank, before the subgroups move anything
                return _two_level_all_reduce(two, arr, op, group.size)
            if call.run_native("all_reduce", arr, op) or arr.size == 0:
                return
            small = arr.nbytes <= group.small_bytes or arr.size < group.size
            if small and group.carries_checks:  # the check rides in the data: no extra message
                carrier = call.carry_check()
                alg.all_reduce_rd_carried(carrier, arr, op)
                carrier.finish()
            # Two ranks move the same bytes either way, so up to one segment the single
            # exchange of recursive doubling beats the ring's four messages in two phases.
            elif small or (group.size == 2 and arr.nbytes <= group.segment_bytes):
                alg.all_reduce_rd(call, arr, op, call.tag)
            else:
                bounds = alg.chunk_bounds(arr.size, group.size)
                alg.ring_all_reduce(call, arr, op, bounds, call.tag)
            if op is ReduceOp.AVG:
                np.divide(arr, group.size, out=arr)


def broadcast(group, buf, root: int = 0) -> None:
    """Copy `buf` from group rank `root` into `buf` on every rank."""
    _check_root(group, root, "broadcast")
    with host_view(buf, group, "broadcast") as arr:
        if group.size == 1:
            return
        two = hierarchy.levels(group)
        with group.collective("broadcast", root=root, dtype=arr.dtype, shape=np.shape(buf),
                              count=arr.size) as call:
            if two is not None:
                call.settle()
                return _two_level_broadcast(two, arr, root, group.rank)
            if call.run_native("broadcast", arr, root) or arr.size == 0:
                return
            if arr.nbytes <= group.small_bytes:
                alg.tree_broadcast(call, arr, root, call.tag)
            else:
                alg.chain_broadcast(call, arr, root, call.tag)


def reduce(group, buf, root: int = 0, op=ReduceOp.SUM) -> None:
    """Reduce `buf` across the group into `buf` on `root`; other ranks' buffers are scratch."""
    _check_root(group, root, "reduce")
    with host_view(buf, group, "reduce", reduces=True) as arr:
        op = reduce_op(op, arr.dtype, "reduce")
        if group.size == 1:
            return
        with group.collective("reduce", op=op, root=root, dtype=arr.dtype, shape=np.shape(buf),
                              count=arr.size) as call:
            if call.run_native("reduce", arr, op, root) or arr.size == 0:
                return
            if arr.nbytes <= group.small_bytes or arr.size < group.size:
                alg.tree_reduce(call, arr, op, root, call.tag)
            else:  # ring reduce-scatter, then each rank's reduced chunk goes to the root
                bounds = alg.chunk_bounds(arr.size, group.size)
                alg.ring_reduce_scatter(call, arr, op, bounds, call.tag)
                _gather_chunks(call, arr, bounds, root, call.tag)
            if op is ReduceOp.AVG and group.rank == root:
                np.divide(arr, group.size, out=arr)


def _gather_chunks(call, arr, bounds, root, tag) -> None:
    r = call.rank
    if r != root:
        call.send(arr[bounds[r]:bounds[r + 1]], root, tag)
        return
    alg.wait_all([call.irecv(arr[bounds[p]:bounds[p + 1]], p, tag)
                  for p in range(call.size) if p != root and bounds[p + 1] > bounds[p]])


def _on_root(group, root: int, buf, what: str,
             writable: bool = True) -> host_view | nullcontext[None]:
    """host_view(buf) on `root`, nothing on the other ranks (gather's out, scatter's src)."""
    return host_view(buf, group, what, writable) if group.rank == root else nullcontext()


def gather(group, buf, out=None, root: int = 0) -> None:
    """Gather every rank's `buf` into `out` (world size x buf's elements) on `root`."""
    _check_root(group, root, "gather")
    with host_view(buf, group, "gather", writable=False) as arr, \
            _on_root(group, root, out, "gather out") as dst:
        if dst is not None:
            _check_size(dst, group.size * arr.size, "gather", "out")
            if group.size == 1:
                dst[:] = arr
                return
        with group.collective("gather", root=root, dtype=arr.dtype, shape=np.shape(buf),
                              count=arr.size) as call:
            if not call.run_native("gather", arr, dst, root) and arr.size:
                alg.gather_direct(call, arr, dst, root, call.tag)


def scatter(group, buf, src=None, root: int = 0) -> None:
    """Send row p of `src` (world size x buf's elements, on `root`) into `buf` on rank p."""
    _check_root(group, root, "scatter")
    with host_view(buf, group, "scatter") as arr, \
            _on_root(group, root, src, "scatter src", writable=False) as source:
        if source is not None:
            _check_size(source, group.size * arr.size, "scatter", "src")
            if group.size == 1:
                arr[:] = source
                return
        with group.collective("scatter", root=root, dtype=arr.dtype, shape=np.shape(buf),
                              count=arr.size) as call:
            if not call.run_native("scatter", arr, source, root) and arr.size:
                alg.scatter_direct(call, arr, source, root, call.tag)


def all_gather(group, out, buf) -> None:
    """Gather every rank's `buf` into `out` (world size x buf's elements) on every rank."""
    with host_view(buf, group, "all_gather", writable=False) as arr, \
            host_view(out, group, "all_gather out") as dst:
        _check_size(dst, group.size * arr.size, "all_gather", "out")
        if group.size == 1:
            dst[:] = arr
            return
        two = hierarchy.levels(group)
        with group.collective("all_gather", dtype=arr.dtype, shape=np.shape(buf),
                              count=arr.size) as call:
            if two is not None:
                call.settle()
                return _two_level_all_gather(two, dst, arr, group.rank)
            if call.run_native("all_gather", dst, arr) or arr.size == 0:
                return
            if dst.nbytes <= group.small_bytes:
                alg.all_gather_bruck(call, arr, dst, call.tag)
            else:
                c, r = arr.size, group.rank
                dst[r * c:(r + 1) * c] = arr
                alg.ring_all_gather(call, dst, [c * i for i in range(group.size + 1)], call.tag)


def all_gather_v(group, out, buf, counts) -> None:
    """all_gather where rank p contributes counts[p] elements (torch's uneven all_gather):
    `out` holds them in rank order; every rank passes the same counts."""
    counts = _counts(group, counts, "all_gather")
    with host_view(buf, group, "all_gather", writable=False) as arr, \
            host_view(out, group, "all_gather out") as dst:
        _check_size(arr, counts[group.rank], "all_gather", f"rank {group.rank}'s input")
        _check_size(dst, sum(counts), "all_gather", "out")
        bounds = [0, *np.cumsum(counts).tolist()]
        dst[bounds[group.rank]:bounds[group.rank + 1]] = arr
        if group.size == 1:
            return
        with group.collective("all_gather", dtype=arr.dtype, shape=(dst.size,), count=dst.size,
                              split=tuple(counts)) as call:
            if dst.size:  # the ring takes chunks of any size; Bruck's blocks are equal
                alg.ring_all_gather(call, dst, bounds, call.tag)


def reduce_scatter(group, out, src, op=ReduceOp.SUM) -> None:
    """Reduce `src` (world size x out's elements) across ranks; rank p gets row p in `out`."""
    with host_view(out, group, "reduce_scatter out", reduces=True) as dst, \
            host_view(src, group, "reduce_scatter", writable=False, reduces=True) as source:
        op = reduce_op(op, dst.dtype, "reduce_scatter")
        _check_size(source, group.size * dst.size, "reduce_scatter", "src")
        c, r = dst.size, group.rank
        if group.size == 1:
            dst[:] = source
            return
        with group.collective("reduce_scatter", op=op, dtype=dst.dtype, shape=np.shape(out),
                              count=c) as call:
            if call.run_native("reduce_scatter", dst, source, op) or c == 0:
                return
            bounds = [c * i for i in range(group.size + 1)]
            # the ring reduces in place: in a copy, so the caller's input stays intact; a
            # reused one up to a size (fresh pages fault on first write), beyond it a fresh
            # one (the scratch keeps its largest buffers: a process must not keep GiBs)
            copy = scratch(source.size, source.dtype) if source.nbytes <= _SCRATCH_COPY_BYTES \
                else nullcontext(np.empty_like(source))
            with copy as work:
                work[:] = source
                alg.ring_reduce_scatter(call, work, op, bounds, call.tag)
                dst[:] = work[r * c:(r + 1) * c]
            if op is ReduceOp.AVG:
                np.divide(dst, group.size, out=dst)


def all_to_all(group, out, src) -> None:
    """Rank r sends row p of `src` to rank p, which stores it as row r of its `out`."""
    with host_view(out, group, "all_to_all out") as dst, \
            host_view(src, group, "all_to_all", writable=False) as source:
        if dst.size != source.size or dst.size % group.size:
            raise ValueError(f"all_to_all: out and src must have the same size, a multiple of "
                             f"the world size {group.size} (got {dst.size} and {source.size})")
        if group.size == 1:
            dst[:] = source
            return
        with group.collective("all_to_all", dtype=dst.dtype, shape=np.shape(out),
                              count=dst.size) as call:
            if not call.run_native("all_to_all", dst, source) and dst.size:
                alg.all_to_all_pairwise(call, dst, source, call.tag)


def all_to_all_v(group, out, src, send_counts, recv_counts) -> None:
    """all_to_all with a count per peer: rank r sends send_counts[p] elements of `src` (in
    peer order) to rank p, which keeps them as its recv_counts[r] elements of `out`."""
    send_counts = _counts(group, send_counts, "all_to_all", "send ")
    recv_counts = _counts(group, recv_counts, "all_to_all", "recv ")
    with host_view(out, group, "all_to_all out") as dst, \
            host_view(src, group, "all_to_all", writable=False) as source:
        _check_size(source, sum(send_counts), "all_to_all", "the send array")
        _check_size(dst, sum(recv_counts), "all_to_all", "the recv array")
        r = group.rank
        if send_counts[r] != recv_counts[r]:
            raise ValueError(f"all_to_all: rank {r} sends itself {send_counts[r]} elements but "
                             f"expects {recv_counts[r]} from itself")
        sends = np.split(source, np.cumsum(send_counts)[:-1])
        recvs = np.split(dst, np.cumsum(recv_counts)[:-1])
        recvs[group.rank][:] = sends[group.rank]
        if group.size == 1:
            return
        # Ranks agree on the kind and dtype; a count that differs between a sender and its
        # receiver fails that receive, naming both sizes.
        with group.collective("all_to_all", dtype=dst.dtype, split=(-1,)) as call:
            alg.all_to_all_pairwise_v(call, recvs, sends, call.tag)


def barrier(group) -> None:
    """Return once every rank of the group has entered the barrier."""
    if group.size == 1:
        return
    with group.collective("barrier") as call:
        if call.run_native("barrier"):
            return
        if group.carries_checks:
            # The descriptors' all-gather is the barrier. It follows recursive doubling like
            # a small all_reduce, not dissemination, so that a barrier facing a mismatched
            # all_reduce meets it message for message and both raise instead of waiting.
            carrier = call.carry_check()
            alg.all_reduce_rd_carried(carrier, None, None)
            carrier.finish()
        else:
            alg.barrier_dissemination(call, call.tag)


_ARRIVED, _LATE, _GONE, _UNASKED = 0, 1, 2, 3  # a rank's status in a monitored barrier


def monitored_barrier(group, timeout: float, wait_all_ranks: bool = False) -> None:
    """A barrier for finding hangs: group rank 0 waits up to `timeout` s for the others and
    tells each rank who did not come (the first one; every one with `wait_all_ranks`)."""
    if group.size == 1:
        return
    with group.collective("barrier") as call:
        mine = np.frombuffer(call.take_check(), np.uint8)  # the arrival is the check
        n, width = group.size, mine.size
        verdict = np.zeros(n + n * width, np.uint8)  # a status per rank, then descriptors
        if group.rank == 0:
            _collect_arrivals(group, call.tag, timeout, wait_all_ranks, mine, verdict)
        else:
            group.raw_send(mine, 0, call.tag)
            try:  # rank 0 may come up to `timeout` after us, then wait as long for others
                group.raw_recv(verdict, 0, call.tag, timeout=2 * timeout)
            except ChannelError as exc:
                verdict[:n] = _UNASKED
                verdict[0] = _GONE if isinstance(exc, ChannelClosedError) else _LATE
    status, descs = verdict[:n], verdict[n:].reshape(n, width)
    late = [group.ranks[r] for r in range(n) if status[r] == _LATE]
    gone = [group.ranks[r] for r in range(n) if status[r] == _GONE]
    if late or gone:
        group.broken = True
        what = [f"ranks {late} did not arrive within {timeout} s"] if late else []
        what += [f"ranks {gone} closed their connection or died"] if gone else []
        raise ChannelTimeoutError(f"monitored_barrier on {group.name}, rank "
                                  f"{group.ranks[group.rank]}: {'; '.join(what)}; check the "
                                  "logs of those ranks")
    check(group, "barrier", {r: descs[r].tobytes() for r in range(n) if status[r] == _ARRIVED})


def _collect_arrivals(group, tag, timeout, wait_all, mine, verdict) -> None:
    """Rank 0's side: take each rank's descriptor by the deadline, then answer every rank."""
    n, width = group.size, mine.size
    status, descs = verdict[:n], verdict[n:].reshape(n, width)
    descs[0] = mine
    deadline = time.monotonic() + timeout
    for r in range(1, n):
        if not wait_all and (status[1:r] != _ARRIVED).any():
            status[r] = _UNASKED  # past the first missing rank: not waited for
            continue
        try:
            group.raw_recv(descs[r], r, tag, timeout=max(deadline - time.monotonic(), 0))
        except ChannelClosedError:
            status[r] = _GONE
        except ChannelError:
            status[r] = _LATE
    for r in range(1, n):
        if status[r] in (_ARRIVED, _UNASKED):
            try:
                group.raw_send(verdict, r, tag, timeout=timeout)
            except ChannelError:
                pass  # it left after arriving: its own wait says so


# -- two levels: inside hosts, then across them (the layout: hierarchy.py) --------------


def _two_level_all_reduce(lv: hierarchy.Levels, arr: np.ndarray, op: ReduceOp, size: int) -> None:
    """Reduce on each host, all_reduce across the leaders, broadcast on each host."""
    inner = ReduceOp.SUM if op is ReduceOp.AVG else op
    reduce(lv.host, arr, root=0, op=inner)
    if lv.leaders is not None:
        all_reduce(lv.leaders, arr, inner)
    broadcast(lv.host, arr, root=0)
    if op is ReduceOp.AVG:
        np.divide(arr, size, out=arr)


def _two_level_broadcast(lv: hierarchy.Levels, arr: np.ndarray, root: int, rank: int) -> None:
    """Out on the root's host, across the leaders from the root's leader, out on the others."""
    root_host = lv.host_of_rank[root]
    if lv.host_of_rank[rank] == root_host:
        broadcast(lv.host, arr, root=lv.host.ranks.index(lv.ranks[root]))
    if lv.leaders is not None:
        broadcast(lv.leaders, arr, root=root_host)
    if lv.host_of_rank[rank] != root_host:
        broadcast(lv.host, arr, root=0)


def _two_level_all_gather(lv: hierarchy.Levels, dst: np.ndarray, arr: np.ndarray,
                          rank: int) -> None:
    """Gather on each host, all_gather the hosts' blocks among the leaders, broadcast."""
    c, order = arr.size, [r for members in lv.members for r in members]
    staged = dst if order == sorted(order) else np.empty_like(dst)  # host-major order
    mine = lv.host_of_rank[rank]
    start = sum(len(m) for m in lv.members[:mine]) * c
    block = staged[start:start + len(lv.members[mine]) * c]
    gather(lv.host, arr, block if lv.leaders is not None else None, root=0)
    if lv.leaders is not None:
        all_gather_v(lv.leaders, staged, block, [len(m) * c for m in lv.members])
    broadcast(lv.host, staged, root=0)
    if staged is not dst:
        for i, r in enumerate(order):
            dst[r * c:(r + 1) * c] = staged[i * c:(i + 1) * c]
