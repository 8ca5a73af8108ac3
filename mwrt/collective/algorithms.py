"""The point-to-point patterns collectives are built from: rings, trees, recursive doubling.

Each function takes one collective call `g` of a process group (mwrt.collective.group:
rank, size, segment_bytes, eager_bytes, posted_receives, send/recv/isend/irecv to group
ranks) and flat NumPy arrays, and moves data under one tag; FIFO order per
(peer, tag) matches sends to receives. They assume the caller already handled world
size 1 and count 0 and checked that ranks agree (mwrt.collectives does both).
"""

from __future__ import annotations

import itertools

import numpy as np

from .reduce_ops import ReduceOp, combine
from .scratch import scratch


def exchange(g, send, to, recv, frm, tag) -> None:
    """Send `send` to rank `to` while receiving `recv` from rank `frm`."""
    if send.nbytes <= g.eager_bytes:  # completes without the peer: skip the thread hop
        g.send(send, to, tag)
        g.recv(recv, frm, tag)
        return
    work = g.isend(send, to, tag)
    g.recv(recv, frm, tag)
    work.wait()


def wait_all(works) -> None:
    for w in works:
        w.wait()


def all_gather_bruck(g, block: np.ndarray, out: np.ndarray, tag: int) -> None:
    """Bruck's all-gather: ceil(log2 n) rounds; round k pulls 2^k blocks from rank r + 2^k.

    Blocks are kept rotated (position i holds rank r+i's block) so each round sends a
    prefix and appends what arrives; a final rotation puts block i at out[i].
    """
    n, r, c = g.size, g.rank, block.size
    tmp = np.empty(n * c, block.dtype)
    tmp[:c] = block
    have, dist = 1, 1
    while have < n:
        k = min(dist, n - have)
        exchange(g, tmp[:k * c], (r - dist) % n, tmp[have * c:(have + k) * c],
                  (r + dist) % n, tag)
        have, dist = have + k, dist * 2
    out.reshape(n, c)[:] = np.roll(tmp.reshape(n, c), r, axis=0)


def _rd_schedule(n: int, r: int) -> tuple[str | None, list[tuple[int, bool]]]:
    """Rank r's part in recursive doubling over n ranks: (fold, [(partner, we_are_lower)]).

    Among p = 2^floor(lg n) ranks each step pairs vranks differing in one bit. With n > p
    the first 2(n-p) ranks pair up first: fold "out" for an odd one (it hands its buffer
    to r-1, sits out, gets the result back), "in" for the even one (it takes r+1's buffer
    first and hands the result back last), None for the others.
    """
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    if r < 2 * extra and r % 2:
        return "out", []
    fold = "in" if r < 2 * extra else None
    vr = r // 2 if fold else r - extra
    steps, mask = [], 1
    while mask < p:
        vpeer = vr ^ mask
        steps.append((vpeer * 2 if vpeer < extra else vpeer + extra, vr < vpeer))
        mask <<= 1
    return fold, steps


def all_reduce_rd(g, arr: np.ndarray, op: ReduceOp, tag: int) -> None:
    """Recursive doubling: lg p exchanges of the whole buffer (_rd_schedule).

    Partners combine as op(lower, higher), so both compute the same bits.
    """
    r = g.rank
    fold, steps = _rd_schedule(g.size, r)
    if fold == "out":
        g.send(arr, r - 1, tag)
        g.recv(arr, r - 1, tag)
        return
    with scratch(arr.size, arr.dtype) as tmp:
        if fold == "in":
            g.recv(tmp, r + 1, tag)
            combine(op, arr, tmp, mine_is_lower=True)
        for peer, lower in steps:
            exchange(g, arr, peer, tmp, peer, tag)
            combine(op, arr, tmp, mine_is_lower=lower)
    if fold == "in":
        g.send(arr, r + 1, tag)


def all_reduce_rd_carried(c, arr: np.ndarray | None, op: ReduceOp | None) -> None:
    """Recursive doubling whose messages also carry the agreement check; arr None: a barrier.

    The steps of all_reduce_rd, but through a Carrier `c` (mwrt.collective.agreement): each
    message is [every call descriptor its sender knows][its data], so the exchanges reduce the data
    and all-gather the descriptors at once, and a barrier is the all-gather alone. Once a
    received descriptor differs from ours, c.recv returns None and nothing is combined;
    the steps still run, so every rank learns every descriptor, and c.finish() raises.
    """
    r = c.rank
    fold, steps = _rd_schedule(c.size, r)
    if fold == "out":
        got = c.exchange(r - 1, arr, arr)
        if got is not None and arr is not None:  # a barrier's messages carry no data
            arr[:] = got
        return
    if fold == "in":
        got = c.recv(r + 1, arr)
        if got is not None and arr is not None and op is not None:
            combine(op, arr, got, mine_is_lower=True)
    for peer, lower in steps:
        got = c.exchange(peer, arr, arr)
        if got is not None and arr is not None and op is not None:
            combine(op, arr, got, mine_is_lower=lower)
    if fold == "in":
        c.send(r + 1, arr)


_AHEAD = 2  # reduce-scatter receives posted ahead of the one being reduced
_GATHER_PHASE = 1 << 60  # marks a collective's second-phase tag (group tag spaces are < 16)


def chunk_bounds(count: int, parts: int) -> list[int]:
    return [count * i // parts for i in range(parts + 1)]


def _segments(g, bounds: list[int], itemsize: int) -> int:
    """How many segments each ring chunk is cut into (the same on every rank)."""
    largest = max(b - a for a, b in itertools.pairwise(bounds))
    return max(1, -(-largest * itemsize // g.segment_bytes))


def _seg(bounds, chunk, j, nseg) -> slice:
    a, b = bounds[chunk], bounds[chunk + 1]
    return slice(a + (b - a) * j // nseg, a + (b - a) * (j + 1) // nseg)


def ring_reduce_scatter(g, arr, op, bounds, tag, on_final=None) -> None:
    """Ring reduce-scatter: after n-1 steps rank r holds the reduction of chunk r.

    At step s rank r sends chunk r-s-1 to its right and receives chunk r-s-2 from its left,
    reducing it into its own copy. Each chunk is cut into segments. Step 0's segments leave
    at once; every later one leaves the moment it is reduced (what step s receives, step
    s+1 sends), and receives are posted ahead into a few scratch buffers, so the wire, the
    reduction and the peer's sends all overlap. `on_final(slice)` is called with each
    segment of chunk r as soon as it is fully reduced (the last step's).
    """
    n, r = g.size, g.rank
    nseg = _segments(g, bounds, arr.itemsize)
    plan = [(_seg(bounds, (r - s - 1) % n, j, nseg), _seg(bounds, (r - s - 2) % n, j, nseg))
            for s in range(n - 1) for j in range(nseg)]
    width = max(sl.stop - sl.start for _, sl in plan)
    depth = min(len(plan), _AHEAD + 1)
    with scratch(width * depth, arr.dtype) as space:
        tmps = [space[k * width:(k + 1) * width] for k in range(depth)]
        _ring_reduce_steps(g, arr, op, tag, plan, nseg, tmps, on_final)


def _ring_reduce_steps(g, arr, op, tag, plan, nseg, tmps, on_final) -> None:
    right, left, depth = (g.rank + 1) % g.size, (g.rank - 1) % g.size, len(tmps)
    sends, recvs = [], {}

    def post(i):
        sl = plan[i][1]
        if sl.stop > sl.start:
            recvs[i] = g.irecv(tmps[i % depth][:sl.stop - sl.start], left, tag)

    def send(i):
        sl = plan[i][0]
        if sl.stop > sl.start:
            sends.append(g.isend(arr[sl], right, tag))

    for i in range(depth):
        post(i)
    for i in range(nseg):
        send(i)
    for i, (_, in_sl) in enumerate(plan):
        if i in recvs:
            recvs.pop(i).wait()
            # the incoming partial sum covers lower ranks on the ring: a fixed order per chunk
            combine(op, arr[in_sl], tmps[i % depth][:in_sl.stop - in_sl.start],
                    mine_is_lower=False)
        if on_final is not None and i >= len(plan) - nseg and in_sl.stop > in_sl.start:
            on_final(in_sl)
        if i + depth < len(plan):
            post(i + depth)
        if i + nseg < len(plan):
            send(i + nseg)
    wait_all(sends)


def ring_all_reduce(g, arr, op, bounds, tag) -> None:
    """Ring all-reduce: reduce-scatter, then all-gather on a tag of its own.

    The all-gather's receives land in place and are posted before the reduce-scatter
    starts, so a fast neighbour's forwarded chunks never wait in a stash. It is safe: a
    chunk comes back only once it is fully reduced, after our share of it has left. The
    all-gather's first step leaves segment by segment, as the reduce-scatter finishes them.
    """
    gather_tag = tag | _GATHER_PHASE
    # A channel whose irecv runs on a thread would block the reduce-scatter's receives
    # behind these: post them early only where receives are truly posted.
    early = g.posted_receives
    recvs = _post_all_gather(g, arr, bounds, gather_tag) if early else None
    right, sends = (g.rank + 1) % g.size, []

    def forward(sl):  # the all-gather's first step, one segment at a time: no gap between
        sends.append(g.isend(arr[sl], right, gather_tag))

    ring_reduce_scatter(g, arr, op, bounds, tag, on_final=forward)
    ring_all_gather(g, arr, bounds, gather_tag, recvs, sends)


def _all_gather_plan(g, bounds, itemsize):
    n, r = g.size, g.rank
    nseg = _segments(g, bounds, itemsize)
    return nseg, [(_seg(bounds, (r - s) % n, j, nseg), _seg(bounds, (r - s - 1) % n, j, nseg))
                  for s in range(n - 1) for j in range(nseg)]


def _post_all_gather(g, arr, bounds, tag) -> dict:
    _, plan = _all_gather_plan(g, bounds, arr.itemsize)
    left = (g.rank - 1) % g.size
    return {i: g.irecv(arr[sl], left, tag) for i, (_, sl) in enumerate(plan)
            if sl.stop > sl.start}


def ring_all_gather(g, arr, bounds, tag, recvs=None, sends=None) -> None:
    """Ring all-gather: rank r starts with chunk r; at step s it forwards chunk r-s rightward.

    Every receive lands in place, so all are posted at once (or were, as `recvs`); step
    0's segments leave at once (or left, as `sends`) and each later one is forwarded the
    moment it has arrived.
    """
    right = (g.rank + 1) % g.size
    nseg, plan = _all_gather_plan(g, bounds, arr.itemsize)
    if recvs is None:
        recvs = _post_all_gather(g, arr, bounds, tag)
    if sends is None:
        sends = [g.isend(arr[sl], right, tag) for sl, _ in plan[:nseg] if sl.stop > sl.start]
    for i in range(len(plan)):
        if i in recvs:
            recvs.pop(i).wait()
        if i + nseg < len(plan) and plan[i + nseg][0].stop > plan[i + nseg][0].start:
            sends.append(g.isend(arr[plan[i + nseg][0]], right, tag))
    wait_all(sends)


def tree_reduce(g, arr, op, root, tag) -> None:
    """Binomial-tree reduce to `root`: lg n rounds; vrank v takes from v + 2^k, sends to v - 2^k."""
    n = g.size
    vr = (g.rank - root) % n
    tmp, mask = None, 1
    while mask < n:
        if vr & mask:
            g.send(arr, (vr - mask + root) % n, tag)
            return
        if vr + mask < n:
            tmp = np.empty_like(arr) if tmp is None else tmp
            g.recv(tmp, (vr + mask + root) % n, tag)
            combine(op, arr, tmp, mine_is_lower=True)
        mask <<= 1


def tree_broadcast(g, arr, root, tag) -> None:
    """Binomial-tree broadcast from `root`: a rank receives from its parent, then feeds its
    children."""
    n = g.size
    vr = (g.rank - root) % n
    mask = 1
    while mask < n:
        if vr & mask:
            g.recv(arr, (vr - mask + root) % n, tag)
            break
        mask <<= 1
    sends = []
    mask >>= 1
    while mask > 0:
        if vr + mask < n:
            sends.append(g.isend(arr, (vr + mask + root) % n, tag))
        mask >>= 1
    wait_all(sends)


def chain_broadcast(g, arr, root, tag) -> None:
    """Pipelined chain broadcast: root -> root+1 -> ...; each segment is forwarded as it lands."""
    n = g.size
    vr = (g.rank - root) % n
    nxt, prev = (g.rank + 1) % n, (g.rank - 1) % n
    bounds = chunk_bounds(arr.size, -(-arr.nbytes // g.segment_bytes) or 1)
    segs = [slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]
    recvs = [g.irecv(arr[sl], prev, tag) for sl in segs] if vr else []
    sends = []
    for i, sl in enumerate(segs):
        if vr:
            recvs[i].wait()
        if vr < n - 1:
            sends.append(g.isend(arr[sl], nxt, tag))
    wait_all(sends)


def gather_direct(g, block, out, root, tag) -> None:
    """Direct gather: the root posts n-1 receives straight into its output rows."""
    n, c = g.size, block.size
    if g.rank != root:
        g.send(block, root, tag)
        return
    rows = out.reshape(n, c)
    works = [g.irecv(rows[p], p, tag) for p in range(n) if p != root]
    rows[root] = block
    wait_all(works)


def scatter_direct(g, block, src, root, tag) -> None:
    """Direct scatter: the root sends row p of `src` to rank p; others receive their row."""
    n, c = g.size, block.size
    if g.rank != root:
        g.recv(block, root, tag)
        return
    rows = src.reshape(n, c)
    works = [g.isend(rows[p], p, tag) for p in range(n) if p != root]
    block[:] = rows[root]
    wait_all(works)


def all_to_all_pairwise(g, out, src, tag) -> None:
    """all_to_all_pairwise_v over equal rows: row p of `src` to rank p, row p of `out` from p."""
    n, r = g.size, g.rank
    rows_out, rows_src = out.reshape(n, -1), src.reshape(n, -1)
    rows_out[r] = rows_src[r]
    all_to_all_pairwise_v(g, rows_out, rows_src, tag)


def all_to_all_pairwise_v(g, recvs, sends, tag) -> None:
    """Pairwise exchange: at step i rank r sends sends[r+i] to rank r+i and takes recvs[r-i]
    from r-i; arrays of any size (an empty one still travels, so both sides keep step)."""
    n, r = g.size, g.rank
    for i in range(1, n):
        to, frm = (r + i) % n, (r - i) % n
        exchange(g, sends[to], to, recvs[frm], frm, tag)


def barrier_dissemination(g, tag) -> None:
    """Dissemination barrier: round k signals rank r + 2^k and waits for rank r - 2^k."""
    n, r = g.size, g.rank
    token, got = np.zeros(1, np.uint8), np.empty(1, np.uint8)
    dist = 1
    while dist < n:
        exchange(g, token, (r + dist) % n, got, (r - dist) % n, tag)
        dist *= 2
