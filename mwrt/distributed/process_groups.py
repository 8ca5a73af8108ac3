"""The torch.distributed-shaped SPMD API: one default group per process, arrays for tensors.

Names, arguments and semantics follow torch.distributed: `src`/`dst` are global ranks,
collectives work in place, `async_op=True` returns a Work, non-members of a group get
None. The algorithms live in mwrt.collective; this module holds the process-wide state.

Threads: give each thread its own group (`new_group`, called alike on every rank) for
collectives; async and object collectives may be mixed on one group (they run in
program order through `run_collective`), and point-to-point may run beside them. Two
threads racing collectives on one group do not corrupt it, but may pair different calls
across ranks (mwrt.collective.group says more).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import numpy as np

from .. import channels, config
from ..collective import api as C
from ..collective import watchdog
from ..collective.group import ProcessGroup, default_timeout
from ..errors import MwrtError
from ..protocol import auth
from ..store import Store, rendezvous, store_from_url

# A group argument: a ProcessGroup, None (the default group) or GroupMember.NON_GROUP_MEMBER.
GroupLike = Any
# A tensor argument: a NumPy or CuPy array, or a torch tensor (through DLPack).
Tensor = Any
Timeout = float | timedelta | None


class GroupMember:
    """torch's marker for a rank outside a group (new_group returns it to non-members)."""

    WORLD = None
    NON_GROUP_MEMBER = object()


group = GroupMember  # torch's `dist.group.WORLD`: None, the default group


class Work:
    """A pending async operation: wait(timeout) raises its error; is_completed() polls."""

    def __init__(self, future=None, work=None, after=None, source=None):
        self._future, self._work, self._after, self._source = future, work, after, source

    def source_rank(self) -> int:
        """The sender of a receive (for one from any source, once it completed)."""
        if self._source is None:
            self.wait()
            self._source = self._future.result()
        return self._source

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (at most `timeout` seconds) and raise the operation's error."""
        if self._work is not None:
            self._work.wait(timeout)
        else:
            try:
                self._future.result(timeout=timeout)
            except TimeoutError:
                if self._future.done():
                    raise
                raise TimeoutError(f"Work.wait: the collective is not done after {timeout} s; "
                                   "a peer may be slow or gone") from None
        if self._after is not None:
            self._after()
            self._after = None
        return True

    def is_completed(self) -> bool:
        """True once the operation has finished (does not wait)."""
        return self._work.is_completed() if self._work is not None else self._future.done()

    def is_success(self) -> bool:
        """True once it finished without an error (torch's; False while it runs)."""
        return self.is_completed() and self.exception() is None

    def exception(self):
        """The operation's error or None, waiting for it to finish."""
        try:
            self.wait()
        except BaseException as e:  # noqa: BLE001 - returned, as torch's Work.exception does
            return e
        return None


class _State:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """As before init_process_group."""
        self.group: ProcessGroup | None = None
        self.channel: channels.DataChannel | None = None
        self.store: Store | None = None
        self.backend = ""  # the name init_process_group was given
        self.groups: list[ProcessGroup] = []
        self.next_group_id = 1
        self.user_store_inits = 0
        self.any_source: ThreadPoolExecutor | None = None  # runs irecv(src=None), in order


_state = _State()
_init_lock = threading.Lock()
_inits = [0]


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: Timeout = None, world_size: int = -1, rank: int = -1,
                       store: Store | None = None,
                       group_name: str = "") -> None:
    """Join the default group: rendezvous through a store, then connect the channel."""
    with _init_lock:
        if _state.group is not None:
            raise RuntimeError("init_process_group: already initialized; call "
                               "destroy_process_group() first")
        # timeout= governs both, as torch's; unset, each has its own variable.
        waits = config.seconds(timeout, default_timeout())
        timeout = config.seconds(timeout, config.get("rendezvous_timeout"))
        asked = backend = backend or config.get("channel")
        # gloo is torch's CPU backend: its tutorials run unchanged on the auto channel, shm
        # between the ranks of a host and tcp between hosts.
        backend = "auto" if backend == "gloo" else backend
        channels.get(backend)  # an unknown name fails now, before the other ranks wait on us
        prefix, own_store = "mwrt/pg", store is None
        key = auth.job_secret()  # the store and the channel admit only ranks that prove it
        if store is None:
            _inits[0] += 1  # SPMD: every rank counts its inits alike
            store, rank, world_size = store_from_url(init_method, rank, world_size, timeout,
                                                     generation=_inits[0], key=key)
        else:
            if rank < 0 or world_size < 1:
                raise ValueError(f"init_process_group: with store=, pass rank and world_size "
                                 f"(got rank={rank}, world_size={world_size})")
            _state.user_store_inits += 1  # a reused store: fresh keys for each init
            prefix = f"mwrt/pg{_state.user_store_inits}"
        channel = None
        try:
            peers = rendezvous(store, rank, world_size, prefix=prefix, timeout=timeout)
            channel = channels.create(backend, rank, world_size, store=store, prefix=prefix,
                                      timeout=timeout, key=key)
            group = ProcessGroup(channel, store=store, prefix=prefix, peers=peers,
                                 timeout=timeout)
            # Connect every pair now, while rank 0 (which serves the store) is sure to be up.
            with watchdog.internal(group, "init_process_group"):
                if channel.device_buffers:  # host memory is not its to move (nccl): a barrier
                    C.barrier(group)
                else:
                    probe = np.zeros(world_size, np.uint8)
                    C.all_to_all(group, probe.copy(), probe)
            group.timeout = waits
        except BaseException:
            if channel is not None:
                channel.close()
            if own_store:
                store.close()
            raise
        _state.group, _state.channel, _state.store = group, channel, store
        _state.backend, _state.groups, _state.next_group_id = asked, [group], 1


def destroy_process_group(group: GroupLike = None) -> None:
    """Leave `group`, or (no argument) tear down everything; init may be called again."""
    if group is not None and group is not _state.group:
        if group is not GroupMember.NON_GROUP_MEMBER:
            group.close()
            _state.groups.remove(group)
        return
    g = _default()
    if not g.broken:
        try:  # rank 0 serves the store: keep it up until everyone is done with it
            g.timeout = min(g.timeout, 30.0)
            with watchdog.internal(g, "destroy_process_group"):
                C.barrier(g)
        except MwrtError:
            pass
    for pg in _state.groups:
        pg.close()
    if _state.any_source is not None:  # a receive still waiting there fails as the channel closes
        _state.any_source.shutdown(wait=False, cancel_futures=True)
    if _state.channel is not None:  # both are, with a default group
        _state.channel.close()
    if _state.store is not None:
        _state.store.close()
    _state.reset()


@atexit.register
def leave_at_exit() -> None:
    """A script that ends without destroy_process_group still leaves its peers cleanly."""
    if _state.channel is not None:
        _state.channel.leave()  # the sockets close with the process, as an exit should


def is_initialized() -> bool:
    """True between init_process_group and destroy_process_group."""
    return _state.group is not None


def _default() -> ProcessGroup:
    if _state.group is None:
        raise RuntimeError("mwrt.distributed: the default process group is not initialized; "
                           "call init_process_group() first")
    return _state.group


def resolve_group(group) -> ProcessGroup | None:
    if group is None or group is GroupMember.WORLD:
        return _default()
    return None if group is GroupMember.NON_GROUP_MEMBER else group


def get_rank(group: GroupLike = None) -> int:
    """This process's rank in `group` (default: the global rank); -1 for non-members."""
    g = resolve_group(group)
    return -1 if g is None else g.rank


def get_world_size(group: GroupLike = None) -> int:
    """The number of ranks in `group` (default: all); -1 for non-members."""
    g = resolve_group(group)
    return -1 if g is None else g.size


def get_num_processes(group: GroupLike = None) -> int:
    """get_world_size under the 2017 proposal's name."""
    return get_world_size(group)


def get_backend(group: GroupLike = None) -> str:
    """The backend (channel) name the default group was made with."""
    _default()
    return _state.backend


def _member_group(group: GroupLike, what: str) -> ProcessGroup:
    """The group `group` names, for a question only its members can answer."""
    g = resolve_group(group)
    if g is None:
        raise ValueError(f"{what}: this rank is not in the group (got "
                         f"GroupMember.NON_GROUP_MEMBER); ask on the group's members, or pass "
                         f"a group this rank belongs to")
    return g


def get_process_group_ranks(group: GroupLike) -> list[int]:
    """The global ranks of `group`, in group-rank order."""
    return list(_member_group(group, "get_process_group_ranks").ranks)


def get_group_rank(group: GroupLike, global_rank: int) -> int:
    """`global_rank`'s rank within `group`."""
    return group_rank_of(_member_group(group, "get_group_rank"), global_rank, "get_group_rank")


def get_global_rank(group: GroupLike, group_rank: int) -> int:
    """The global rank of `group_rank` within `group`."""
    g = _member_group(group, "get_global_rank")
    if not 0 <= group_rank < g.size:
        raise ValueError(f"get_global_rank: group rank must be in [0, {g.size}) (got "
                         f"{group_rank})")
    return g.ranks[group_rank]


def is_available() -> bool:
    """True: mwrt.distributed is always available (torch's question)."""
    return True


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its machine (LOCAL_RANK, set by mwrt-launch and spawn)."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is None:
        raise RuntimeError("get_node_local_rank: LOCAL_RANK is not set; start with mwrt-launch "
                           "or pass fallback_rank")
    return fallback_rank


def new_group(ranks: Iterable[int] | None = None, timeout: Timeout = None,
              backend: str | None = None) -> GroupLike:
    """A subgroup of global `ranks`; every rank must call it, in the same order."""
    parent = _default()
    ranks = sorted(range(parent.size) if ranks is None else {int(r) for r in ranks})
    if not all(0 <= r < parent.size for r in ranks):
        raise ValueError(f"new_group: ranks must be in [0, {parent.size}) (got {ranks})")
    gid, _state.next_group_id = _state.next_group_id, _state.next_group_id + 1
    if parent.channel.rank not in ranks:
        return GroupMember.NON_GROUP_MEMBER
    g = ProcessGroup(parent.channel, ranks, group_id=gid, store=parent.store,
                     prefix=parent.prefix, peers=parent.peers,
                     timeout=parent.timeout if timeout is None else config.seconds(timeout, 0))
    _state.groups.append(g)
    return g


def new_subgroups_by_enumeration(ranks_per_subgroup_list: Sequence[Sequence[int]],
                                 timeout: Timeout = None, backend: str | None = None
                                 ) -> tuple[GroupLike, list[GroupLike]]:
    """One new_group per list of ranks (every rank calls this alike): (ours, all of them)."""
    mine, groups = None, []
    for ranks in ranks_per_subgroup_list:
        g = new_group(ranks, timeout, backend)
        groups.append(g)
        if g is not GroupMember.NON_GROUP_MEMBER:
            if mine is not None:
                raise ValueError(f"new_subgroups_by_enumeration: rank {get_rank()} is in two "
                                 f"subgroups ({mine.ranks} and {g.ranks})")
            mine = g
    return mine, groups


def new_subgroups(group_size: int | None = None, group: GroupLike = None,
                  timeout: Timeout = None, backend: str | None = None
                  ) -> tuple[GroupLike, list[GroupLike]]:
    """Split the world into subgroups of `group_size` consecutive ranks (default: the ranks
    of one machine, LOCAL_WORLD_SIZE): (ours, all of them)."""
    if group is not None:
        raise ValueError("new_subgroups: splitting a group other than the world is not "
                         "supported; list the ranks with new_subgroups_by_enumeration")
    n = get_world_size()
    size = group_size or int(os.environ.get("LOCAL_WORLD_SIZE", n))
    if size < 1 or n % size:
        raise ValueError(f"new_subgroups: group_size must divide the world size {n} (got "
                         f"{size})")
    return new_subgroups_by_enumeration([range(i, i + size) for i in range(0, n, size)],
                                        timeout, backend)


def run_collective(group, async_op, fn, *args, after=None, result=None):
    """Run fn(g, *args) on `group` now, or (async_op) in order on its thread, returning a
    Work; then after() (a copy out of a staging buffer), or when the Work is waited. Every
    collective of the facade, object collectives included, enters here. Not async, it
    returns `result` (the collective's output, as the 2017 proposal's spelling has it)."""
    g = resolve_group(group)
    if g is None:
        return None
    if async_op:
        return Work(future=g.call(fn, g, *args, async_op=True), after=after)
    g.call(fn, g, *args)
    if after is not None:
        after()
    return result


def group_rank_of(g: ProcessGroup, rank: int, what: str) -> int:
    try:
        return g.ranks.index(rank)
    except ValueError:
        raise ValueError(f"{what}: rank {rank} is not in the group (ranks {g.ranks})") from None
