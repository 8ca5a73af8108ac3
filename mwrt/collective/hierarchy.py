"""Two-level collectives: inside each host first, then across hosts, one rank per host.

A host's ranks share memory, so they combine there over the channel's same-host path
(shared memory, single-copy reads) and only one of them, the host's leader (its lowest
group rank), talks across the network: the proposal's hierarchy, as NCCL and tuned MPIs
do it. An all_reduce is a reduce to each leader, an all_reduce among the leaders and a
broadcast from each leader, so the network carries each host's data once instead of
once per rank. A broadcast goes out on the root's host, across the leaders, then out on
every other host. An all_gather gathers each host's blocks to its leader, gathers the
hosts' blocks among the leaders, and broadcasts the whole on each host (then puts the
blocks in rank order, where the hosts' ranks interleave).

The layout comes from the channel (`host_of`, the same answer on every rank), so every
rank takes the same path; it applies to groups spanning several hosts with several ranks
on some host. Each phase is an ordinary collective of a subgroup that the group makes
once, with its own agreement check: every rank is checked against its leader, every
leader against the others, so ranks that disagree anywhere still get
CollectiveMismatchError. Subgroups take group ids from the top of the 24-bit range, apart
from the ones new_group hands out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import config
from .group import ProcessGroup
from .reduce_ops import ReduceOp

_DERIVED = 0x800000  # group ids of subgroups: this bit, the parent's id, a subgroup number


@dataclass(frozen=True)
class Levels:
    """A rank's two levels: its host's group, the leaders' group (None unless it leads),
    and where the root's host and leader sit (for broadcast)."""

    host: object  # ProcessGroup of this host's ranks
    leaders: object | None  # ProcessGroup of one rank per host, in host order
    host_of_rank: list  # group rank -> host index
    leader_of_host: list  # host index -> the leader's group rank
    ranks: list  # group rank -> channel rank, as the parent group has them
    members: list  # host index -> its group ranks, ascending


def levels(group) -> Levels | None:
    """The two levels of `group` (made on first use), or None where they do not apply."""
    if "levels" not in group.subgroups:
        group.subgroups["levels"] = _make(group)
    return group.subgroups["levels"]


def _make(group) -> Levels | None:
    if not config.get("two_level"):
        return None
    names = [group.channel.host_of(r) for r in group.ranks]
    if None in names:
        return None
    hosts = list(dict.fromkeys(names))  # in order of their first group rank
    if len(hosts) == 1 or len(hosts) == group.size or len(hosts) > 255:
        return None
    host_of_rank = [hosts.index(n) for n in names]
    members = [[r for r in range(group.size) if host_of_rank[r] == h] for h in range(len(hosts))]
    leader_of_host = [m[0] for m in members]
    mine = host_of_rank[group.rank]
    host = _subgroup(group, members[mine], 1 + mine, f"host {mine}'s ranks")
    leaders = _subgroup(group, leader_of_host, 0, "host leaders") \
        if group.rank == leader_of_host[mine] else None
    return Levels(host, leaders, host_of_rank, leader_of_host, list(group.ranks), members)


def _subgroup(group, members: list[int], number: int, what: str):
    sub = ProcessGroup(group.channel, [group.ranks[r] for r in members],
                       group_id=_DERIVED | ((group.group_id & 0x7FFF) << 8) | number,
                       store=group.store, prefix=group.prefix, peers=group.peers,
                       timeout=group.timeout, segment_bytes=group.segment_bytes,
                       small_bytes=group.small_bytes)
    sub.name = f"{group.name}, {what} {[group.ranks[r] for r in members]}"
    return sub


def all_reduce(lv: Levels, arr: np.ndarray, op: ReduceOp, size: int) -> None:
    """Reduce on each host, all_reduce across the leaders, broadcast on each host."""
    from . import api

    inner = ReduceOp.SUM if op is ReduceOp.AVG else op
    api.reduce(lv.host, arr, root=0, op=inner)
    if lv.leaders is not None:
        api.all_reduce(lv.leaders, arr, inner)
    api.broadcast(lv.host, arr, root=0)
    if op is ReduceOp.AVG:
        np.divide(arr, size, out=arr)


def broadcast(lv: Levels, arr: np.ndarray, root: int, rank: int) -> None:
    """Out on the root's host, across the leaders from the root's leader, out on the others."""
    from . import api

    root_host = lv.host_of_rank[root]
    if lv.host_of_rank[rank] == root_host:
        api.broadcast(lv.host, arr, root=lv.host.ranks.index(lv.ranks[root]))
    if lv.leaders is not None:
        api.broadcast(lv.leaders, arr, root=root_host)
    if lv.host_of_rank[rank] != root_host:
        api.broadcast(lv.host, arr, root=0)


def all_gather(lv: Levels, dst: np.ndarray, arr: np.ndarray, rank: int) -> None:
    """Gather on each host, all_gather the hosts' blocks among the leaders, broadcast."""
    from . import api

    c, order = arr.size, [r for members in lv.members for r in members]
    staged = dst if order == sorted(order) else np.empty_like(dst)  # host-major order
    mine = lv.host_of_rank[rank]
    start = sum(len(m) for m in lv.members[:mine]) * c
    block = staged[start:start + len(lv.members[mine]) * c]
    api.gather(lv.host, arr, block if lv.leaders is not None else None, root=0)
    if lv.leaders is not None:
        api.all_gather_v(lv.leaders, staged, block, [len(m) * c for m in lv.members])
    api.broadcast(lv.host, staged, root=0)
    if staged is not dst:
        for i, r in enumerate(order):
            dst[r * c:(r + 1) * c] = staged[i * c:(i + 1) * c]
