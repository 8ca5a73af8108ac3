"""ProcessGroup: a channel, the channel ranks it spans, a tag space and a sequence counter.

A group numbers its members 0..size-1 (group ranks) and maps them to channel ranks, so a
subgroup runs the same algorithms over the same channel. Tags are 64-bit:
(space << 56) | (group id << 32) | (sequence number or user tag), so collectives of two
groups, their control messages and user point-to-point never match each other. What the
channel can do it declares (mwrt.channels.DataChannel); the group reads it once.

Each collective is one `_Collective`, made by `group.collective(kind, ...)`: it holds the
call's sequence number, tag and agreement check, and the algorithms send and receive
through it, so nothing of a running call lives on the group. Every collective checks that
ranks agree on it (mwrt.collective.agreement). The check is lazy: the first send or
receive through the call sends this rank's descriptor, and the first wait for data (a
recv, a receive's wait, a native collective) or the end of the collective settles it. An
algorithm that carries the check in its own messages takes it over with
`call.carry_check()`, and no message of the check's own is sent. A channel's native
collectives (mwrt.collective.native) are offered the call first.

Threads: sequence numbers are drawn atomically and every call keeps its own state, so
two threads may run collectives on one group without corrupting it; native collectives
that need it (`in_order`) run in sequence order. But ranks match collectives by sequence
number: two threads that race on one group may pair different calls across ranks (a
mismatch error, as in torch, where the order of collectives is the program's; identical
calls pair any way). Safe: one group per thread; async and object collectives of one
group from any thread (they run in order on the group's thread, `call()`);
point-to-point beside collectives (its tags are apart).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from .. import config
from ..errors import ChannelClosedError, ChannelError, ChannelTimeoutError, ConfigError, MwrtError
from ..procs import process_alive
from . import native, watchdog
from .agreement import Agreement, Carrier, check, describe_call

_DATA, _CONTROL, _P2P = 0, 1, 2
_CHANNEL_ERRORS = (ChannelError, TimeoutError, ConnectionError)


def _blame(e: BaseException, peer: int) -> None:
    """Note on a channel's error which group rank it came from, for the group's message."""
    # The socket's own TimeoutError and ConnectionError take the note too, as any exception.
    e.group_peer = peer  # type: ignore[attr-defined]


class GroupWork:
    """A pending send or receive of a group: wait() checks the call first and names the
    group peer when it fails (the collective layer's one Work)."""

    __slots__ = ("_agreement", "_peer", "_timeout", "_work")

    def __init__(self, work, peer: int, timeout: float, agreement: Agreement | None = None):
        self._work, self._peer, self._timeout, self._agreement = work, peer, timeout, agreement

    def wait(self, timeout: float | None = None) -> None:
        """Block until done (default: the group's timeout) and raise its error."""
        if self._agreement is not None:
            self._agreement.settle()  # a receive: check the call before using data
        try:
            self._work.wait(self._timeout if timeout is None else timeout)
        except _CHANNEL_ERRORS as e:
            _blame(e, self._peer)
            raise

    def is_completed(self) -> bool:
        return self._work.is_completed()


class _Turns:
    """Which of a group's calls have ended on this rank, for native collectives that must
    run in sequence order (CMA's control block holds one call at a time)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.low, self.ended, self.waiters = 0, set(), 0  # every call below `low` ended

    def end(self, seq: int) -> None:
        with self.lock:
            if seq == self.low and not self.ended:
                self.low = seq + 1  # the common case: calls end in order
            else:
                self.ended.add(seq)
                while self.low in self.ended:
                    self.ended.remove(self.low)
                    self.low += 1
            if self.waiters:
                self.cond.notify_all()

    def wait(self, seq: int, timeout: float) -> bool:
        """True once every call before `seq` has ended; False after `timeout` s."""
        if self.low >= seq:
            return True  # the common case, without the lock: one thread uses the group
        with self.lock:
            self.waiters += 1
            try:
                return self.cond.wait_for(lambda: self.low >= seq, timeout)
            finally:
                self.waiters -= 1


class _Collective:
    """One collective on a group: its sequence number, tag, agreement check, and the
    point-to-point the algorithms use (with the check's hooks), and its failure report."""

    # A class rather than a generator-based context manager: small collectives pay for every
    # microsecond of it.

    __slots__ = ("agreement", "desc", "eager_bytes", "group", "kind", "posted_receives", "rank",
                 "segment_bytes", "seq", "size", "started", "tag")

    def __init__(self, group, kind: str, desc: dict):
        self.group, self.kind, self.desc = group, kind, desc
        self.rank, self.size, self.eager_bytes = group.rank, group.size, group.eager_bytes
        self.segment_bytes, self.posted_receives = group.segment_bytes, group.posted_receives

    def __enter__(self) -> _Collective:
        g = self.group
        self.seq = seq = next(g._seqs)  # atomic: two threads never draw the same number
        self.started = time.time()  # the hang reports count from here, not from their look
        g.current = self  # for the hang watchdog, which looks every few seconds
        try:
            self.agreement = Agreement(g, g._tag(_CONTROL, seq), self.kind,
                                       describe_call(seq, self.kind, **self.desc))
        except BaseException:
            g.idle_since = time.time()  # before finished: a look that sees one sees both
            g.finished = seq
            if g.turns is not None:
                g.turns.end(seq)  # no __exit__ will: later calls must not wait for this one
            raise
        self.tag = g._tag(_DATA, seq)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.agreement.settle()  # a rank that only sent, or never talked, checks here
                return
            if not issubclass(exc_type, _CHANNEL_ERRORS):
                return  # a mismatch, a bad argument: raised as it is
            self.agreement.settle_after_error()  # a mismatch explains the failure best
        except _CHANNEL_ERRORS as e:
            exc = e
        finally:
            self.group.idle_since = time.time()
            self.group.finished = self.seq
            if self.group.turns is not None:
                self.group.turns.end(self.seq)
        raise self.group._failure(f"{self.kind} #{self.seq}", exc) from exc

    # -- point-to-point among group ranks, checked -------------------------------------------

    def send(self, buf, peer: int, tag: int) -> None:
        self._before_send()
        self.group.raw_send(buf, peer, tag)

    def recv(self, buf, peer: int, tag: int) -> None:
        self.agreement.settle()  # the call must agree before we wait for its data
        self.group.raw_recv(buf, peer, tag)

    def isend(self, buf, peer: int, tag: int) -> GroupWork:
        self._before_send()
        return self.group.raw_isend(buf, peer, tag)

    def irecv(self, buf, peer: int, tag: int) -> GroupWork:
        # Posting is safe before the check settles: a receive's wait() settles it first.
        self.agreement.start()
        g = self.group
        try:
            work = g.channel.irecv(buf, g.ranks[peer], tag, g.timeout)
        except _CHANNEL_ERRORS as e:
            _blame(e, peer)
            raise
        return GroupWork(work, peer, g.timeout, self.agreement)

    def _before_send(self) -> None:
        agreement = self.agreement
        if not agreement.settled:
            if self.group.speculates:
                agreement.start()
            else:
                agreement.settle()

    # -- the check, for native collectives and algorithms that carry it ---------------------

    def settle(self) -> None:
        """Check now that every rank agrees on the call: before work that does not go
        through this call's own messages (two-level collectives run on subgroups)."""
        self.agreement.settle()

    def run_native(self, kind: str, *args) -> bool:
        """Run the channel's native `kind` if it has one; False means use the generic one."""
        natives = self.group.natives
        if natives is None or kind not in natives.kinds:
            return False
        g = self.group
        if g.turns is not None and not g.turns.wait(self.seq, g.timeout):
            raise ChannelTimeoutError(f"{kind} #{self.seq} on {g.name}, rank {g.channel.rank}: "
                                      f"an earlier collective of this group, entered from "
                                      f"another thread, is still running after {g.timeout} s")
        if not natives.checks_calls:
            self.agreement.settle()  # a native collective cannot be checked halfway
        return natives.run(kind, self, *args)

    def take_check(self) -> bytes:
        """The caller carries the agreement check: this rank's call descriptor; we send none."""
        # For algorithms whose messages carry descriptors, and native collectives that
        # check calls; call it before the collective's first message.
        return self.agreement.take()

    def carry_check(self) -> Carrier:
        """Take the check over for an algorithm whose messages carry it (agreement.Carrier)."""
        mine = self.take_check()
        return Carrier(self.group, self.agreement.tag, self.kind, mine)

    def check(self, every) -> None:
        """Raise CollectiveMismatchError unless every rank's descriptor (by rank) is equal."""
        check(self.group, self.kind, every)


def default_timeout(channel=None) -> float:
    """Seconds a group's waits last unless it was given its own: MWRT_COLLECTIVE_TIMEOUT, or
    where unset the channel's timeout (its creator's, or MWRT_CHANNEL_TIMEOUT)."""
    if os.environ.get(config.SETTINGS["collective_timeout"].env):
        return config.get("collective_timeout")
    return config.get("channel_timeout") if channel is None else channel.timeout


class ProcessGroup:
    """Collectives' view of a channel: group ranks, tags, sequence numbers, error context."""

    def __init__(self, channel, ranks=None, *, group_id: int = 0, store=None,
                 prefix: str = "mwrt", peers: dict | None = None, timeout: float | None = None,
                 segment_bytes: int | None = None, small_bytes: int | None = None):
        ranks = list(range(channel.world_size)) if ranks is None else [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or not all(0 <= r < channel.world_size for r in ranks):
            raise ConfigError(f"ProcessGroup: ranks must be distinct channel ranks in [0, "
                              f"{channel.world_size}) (got {ranks})")
        if channel.rank not in ranks:
            raise ConfigError(f"ProcessGroup: channel rank {channel.rank} is not in ranks "
                              f"{ranks}; only members build the group")
        self.channel, self.ranks, self.group_id = channel, ranks, int(group_id)
        self.rank, self.size = ranks.index(channel.rank), len(ranks)
        self.store, self.prefix, self.peers = store, prefix, peers or {}
        self.timeout = config.seconds(timeout, default_timeout(channel), "ProcessGroup: timeout")
        self.segment_bytes = int(segment_bytes or config.get("segment_bytes"))
        self.small_bytes = int(config.get("small_collective_bytes") if small_bytes is None
                               else small_bytes)
        # What the channel declares (mwrt.channels.DataChannel), read once.
        self.eager_bytes = int(config.get("eager_bytes") if channel.eager_bytes is None
                               else channel.eager_bytes)
        # Where sends complete without a receive, data may leave before the check settles;
        # where a receive takes a message of any size, the check may ride inside the data.
        self.speculates = bool(channel.buffered_sends)
        self.carries_checks = self.speculates and bool(channel.any_size_recv)
        self.posted_receives = bool(channel.posted_receives)
        self.device_buffers = bool(channel.device_buffers)
        self.name = f"group {group_id} (ranks {ranks})" if group_id else "the default group"
        self.natives = native.for_group(channel, self)
        self.turns = _Turns() if self.natives is not None and self.natives.in_order else None
        self._seqs = itertools.count()
        self.broken = False  # set once a collective failed midway: peers may be gone
        self.lost: int | None = None  # the channel rank abort() named: every call fails
        self.subgroups: dict = {}  # groups made from this one (mwrt.collective.hierarchy)
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future | None = None
        self._lock = threading.Lock()
        watchdog.watch(self)  # current, finished, p2p: what the hang reports look at

    def _tag(self, space: int, low: int) -> int:
        return (space << 56) | ((self.group_id & 0xFFFFFF) << 32) | (low & 0xFFFFFFFF)

    def p2p_tag(self, tag: int) -> int:
        """The channel tag for a user point-to-point message with `tag`."""
        if not 0 <= tag < 1 << 32:  # more bits would alias another tag
            raise ValueError(f"tag: must be in [0, 2**32) (got {tag})")
        return self._tag(_P2P, tag)

    # -- point-to-point among group ranks, unchecked (the check's own messages) ----------

    # The raw calls skip the agreement hooks: the check's own messages use them.

    def raw_send(self, buf, peer: int, tag: int, timeout: float | None = None) -> None:
        try:
            self.channel.send(buf, self.ranks[peer], tag,
                              self.timeout if timeout is None else timeout)
        except _CHANNEL_ERRORS as e:
            _blame(e, peer)
            raise

    def raw_recv(self, buf, peer: int, tag: int, timeout: float | None = None) -> None:
        try:
            self.channel.recv(buf, self.ranks[peer], tag,
                              self.timeout if timeout is None else timeout)
        except _CHANNEL_ERRORS as e:
            _blame(e, peer)
            raise

    def raw_recv_message(self, peer: int, tag: int, timeout: float | None = None) -> memoryview:
        try:
            return self.channel.recv_message(self.ranks[peer], tag,
                                             self.timeout if timeout is None else timeout)
        except _CHANNEL_ERRORS as e:
            _blame(e, peer)
            raise

    def raw_exchange_message(self, buf, peer: int, tag: int) -> memoryview:
        try:
            return self.channel.exchange_message(buf, self.ranks[peer], tag, self.timeout)
        except _CHANNEL_ERRORS as e:
            _blame(e, peer)
            raise

    def raw_isend(self, buf, peer: int, tag: int) -> GroupWork:
        return GroupWork(self.channel.isend(buf, self.ranks[peer], tag, self.timeout), peer,
                         self.timeout)

    # -- running collectives -------------------------------------------------------------

    def collective(self, kind: str, **desc) -> _Collective:
        """`with group.collective(kind, op=, dtype=, shape=, count=) as call`: the next one;
        the algorithms send and receive through `call`, on `call.tag`."""
        return _Collective(self, kind, desc)

    def call(self, fn, *args, async_op: bool = False):
        """Run fn(*args) now, or in order on the group's thread; async returns a Work."""
        with self._lock:
            last = self._last
            if async_op:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="mwrt-collective")
                self._last = self._pool.submit(fn, *args)
                return self._last
        if last is not None and not last.done():
            last.exception(timeout=self.timeout)  # keep program order after async calls
        return fn(*args)

    def close(self) -> None:
        """Stop the group's async thread, and its subgroups'; the channel belongs to its
        creator."""
        watchdog.forget(self)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        for made in self.subgroups.values():
            for sub in (made.host, made.leaders) if made is not None else ():
                if sub is not None:
                    sub.close()

    # -- failures ------------------------------------------------------------------------

    def abort(self, rank: int, why: str) -> None:
        """Channel rank `rank`, a member, is gone (its master says so): this group's running
        collectives fail now on this rank, whichever peer they wait for, and later ones at
        once, naming it. Its subgroups' too: their members wait on ours."""
        if self.lost is None:
            self.lost = rank
        self.channel.fail_tags(partial(_in_group, self.group_id & 0xFFFFFF), why)
        for made in list(self.subgroups.values()):
            for sub in (made.host, made.leaders) if made is not None else ():
                if sub is not None:
                    sub.abort(rank, why)

    def _failure(self, what: str, e: BaseException) -> MwrtError:
        self.broken = True
        peer = getattr(e, "group_peer", None)
        if self.lost is not None and self.lost in self.ranks:  # the one to name, whoever we
            peer = self.ranks.index(self.lost)                # were waiting for
        who = f"rank {self.ranks[peer]}" if peer is not None else "a peer"
        me = f"{what} on {self.name}, rank {self.channel.rank}"
        if isinstance(e, ChannelClosedError):
            text = f"{me}: {who} closed its connection or died ({e})"
        elif isinstance(e, TimeoutError):
            text = (f"{me}: timed out after {self.timeout} s waiting for {who} ({e}; the "
                    f"group's timeout: init_process_group(timeout=), new_group(timeout=) or "
                    f"MWRT_COLLECTIVE_TIMEOUT)")
        else:
            text = f"{me}: {e}"
        gone = self._gone_ranks()
        if gone:
            text += f"; ranks {gone} have exited (their processes are gone)"
        lost = isinstance(e, (ChannelClosedError, TimeoutError))
        reports = self._exchange_reports(f"rank {self.channel.rank}: {who} failed in {what}" if lost
                                         else f"rank {self.channel.rank}: {what}: {e}"[:300])
        if reports:
            text += "; reported by others: " + " | ".join(reports)
        text += "; check the logs of those ranks"
        cls = type(e) if isinstance(e, ChannelError) else (
            ChannelTimeoutError if isinstance(e, TimeoutError) else ChannelClosedError)
        err = cls(text)
        err.peer = self.ranks[peer] if peer is not None else None
        return err

    def _gone_ranks(self) -> list[int]:
        """Ranks on this host whose process no longer runs (a zombie counts as gone)."""
        here, gone = socket.gethostname(), []
        for rank, (host, pid) in sorted(self.peers.items()):
            if host == here and rank in self.ranks and not process_alive(pid):
                gone.append(rank)
        return gone

    def _exchange_reports(self, mine: str) -> list[str]:
        """Leave our report in the store and read the others' (best effort: it may be gone)."""
        if self.store is None:
            return []
        try:
            n = self.store.add(f"{self.prefix}/failures", 1)
            self.store.set(f"{self.prefix}/failure/{n}", mine)
            return [self.store.get(f"{self.prefix}/failure/{i}", timeout=1.0).decode()
                    for i in range(1, n)]
        except (MwrtError, OSError):
            return ["(the store is unreachable: rank 0, which serves it, may be gone)"]


def _in_group(group_id: int, tag: int) -> bool:
    """True if channel tag `tag` is one of a collective of group `group_id` (data, control
    or point-to-point space, any phase of it; transfers have a space of their own)."""
    return (tag >> 56) & 0xF <= _P2P and (tag >> 32) & 0xFFFFFF == group_id


__all__ = ["GroupWork", "ProcessGroup", "default_timeout"]
