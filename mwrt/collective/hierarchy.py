"""Two-level collectives' layout: each host's group and the leaders' group, one rank per host.

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
from the ones new_group hands out. This module makes the layout and the subgroups; the
phases are collectives, so they are written in api.py beside the ones they call.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import config
from .group import ProcessGroup

_DERIVED = 0x800000  # group ids of subgroups: this bit, the parent's id, a subgroup number


@dataclass(frozen=True)
class Levels:
    """A rank's two levels: its host's group, the leaders' group (None unless it leads),
    and where the root's host and leader sit (for broadcast)."""

    host: ProcessGroup  # this host's ranks
    leaders: ProcessGroup | None  # one rank per host, in host order
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
