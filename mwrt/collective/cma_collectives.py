"""Single-copy collectives between processes of one host, by cross-memory attach (CMA).

Linux's process_vm_readv/writev copy straight between two processes' memories, so on
one host a rank reads (and writes) its peers' buffers where they lie: no socket, no
staging segment, one copy per byte moved (Open MPI's shared-memory transport does the
same; the syscall itself is mwrt.channels.cma). The shm channel declares these as its
native collectives (mwrt.collective.cma_ops), used for every collective when the kernel
lets ranks reach each other (same user, ptrace allowed) and every rank of the group
shares this host: decided once per group, the same on every rank.

Each rank has a control block at the head of a small /dev/shm segment that every peer
maps once (then the name is unlinked): a stage counter, the addresses and sizes of this
call's buffers, and the call's agreement descriptor, so polling a peer is a plain memory
load. A collective with group sequence number s has two stages: 2s+1 (buffers
published) and 2s+2 (done with the others' buffers); every rank waits for every peer at
both, so a rank returns, and rewrites its block, only once nobody touches its memory.
At 2s+1 each rank compares all descriptors (the call's check, passed in): a mismatch
raises on every rank before any data moves. A waiter probes the ranks it waits for with
the syscall every millisecond: a dead one fails it (ESRCH) and is named; a live but
absent one times out. Waits spin briefly (ranks usually arrive within microseconds),
then yield, then sleep. The stores of a stage after its fields rely on x86-64's
ordering (what CMA hosts run; other CPUs would need a fence here).

After the block, the segment holds the rank's staging area (MWRT_SHM_STAGE_BYTES) for
all_reduce up to that size; a rank that cannot make one (a full or capped /dev/shm)
turns staging off for the group, and one without even a block turns CMA off.
"""

from __future__ import annotations

import logging
import os
import platform
import time

import numpy as np

from .. import config
from ..channels.cma import IoVec, available, read_remote
from ..channels.segments import Segment, new_name
from ..errors import ChannelClosedError, ChannelError, ChannelTimeoutError, CollectiveMismatchError
from .reduce_ops import combine

log = logging.getLogger("mwrt.collective")

_STAGE, BUF_A, _NA, BUF_B, _NB = 0, 1, 2, 3, 4
_DESC_AT = 40  # byte offset of the call's descriptor (mwrt.collective.agreement, 76 bytes)
_SEEN = 15  # the last stage this rank saw every peer reach (after the descriptor)
_LEAVE_SECONDS = 5.0
_BLOCK_WORDS = 16
_PIECE_BYTES = 512 << 10  # the reduction reads peers in pieces a quarter of L2 (2 MiB here)
_SPIN_SECONDS = 2e-3
_PROBE_SECONDS = 1e-3  # a waiter checks that the ranks it waits for still exist this often
_CONTROL_BYTES = 4096  # a segment's control block, then its staging area (page-aligned)


class CmaGroup:
    """One process group's CMA state on this rank: every rank's control block and staging area."""

    def __init__(self, channel, group, peers: dict[int, tuple[int, int]], probe, segments):
        self.channel, self.group, self._probe_word = channel, group, probe
        self.peers = peers  # group rank -> (pid, address of a word to probe it with)
        self.segments = segments  # group rank -> Segment: control block, then staging area
        self.blocks = {p: np.frombuffer(seg.mm, np.uint64, _BLOCK_WORDS)
                       for p, seg in segments.items()}
        self.block = self.blocks[group.rank]
        self.stage_bytes = min(seg.mm.size() for seg in segments.values()) - _CONTROL_BYTES
        self.others = sorted(peers)
        self._stage = np.zeros(1, np.uint64)
        self._stage_at = self._stage.ctypes.data
        self._iov = (IoVec(), IoVec())  # reused: building them costs more than the syscall
        self._fields = np.zeros((group.size, _BLOCK_WORDS), np.uint64)
        self._tmp = np.empty(_PIECE_BYTES, np.uint8)

    # -- publishing and waiting ----------------------------------------------------------

    def publish(self, stage: int, a=None, b=None, desc: bytes | None = None) -> None:
        """Make this call's buffers (and descriptor) visible, then the stage: in that order."""
        blk = self.block
        if desc is not None:
            for word, arr in ((BUF_A, a), (BUF_B, b)):
                blk[word] = 0 if arr is None else arr.ctypes.data
                blk[word + 1] = 0 if arr is None else arr.nbytes
            blk.view(np.uint8)[_DESC_AT:_DESC_AT + len(desc)] = np.frombuffer(desc, np.uint8)
        blk[_STAGE] = stage  # x86 stores are seen in order: fields before the stage

    def wait(self, stage: int, what: str) -> None:
        """Return once every peer's stage is at least `stage`."""
        pending, start, pause, probed = list(self.others), time.monotonic(), 0.0, 0.0
        blocks = self.blocks
        while pending:
            pending = [p for p in pending if blocks[p][_STAGE] < stage]
            if not pending:
                self.block[_SEEN] = stage  # tells a leaving peer we no longer poll it
                return
            waited = time.monotonic() - start
            if waited > self.group.timeout:
                ranks = [self.group.ranks[p] for p in pending]
                err = ChannelTimeoutError(
                    f"shm {what} on rank {self.channel.rank}: ranks {ranks} did not reach "
                    f"the collective within {self.group.timeout} s; are they calling it?")
                err.group_peer = pending[0]
                raise err
            self._check_alive(pending, what)
            if waited - probed > _PROBE_SECONDS:  # a block in shared memory outlives its owner
                probed = waited
                for p in pending:
                    self.read(p, self._stage_at, self.peers[p][1], 8, what)
            if waited < _SPIN_SECONDS:
                os.sched_yield()  # lets an oversubscribed peer run; releases the GIL
            else:
                pause = min(max(pause * 2, 2e-5), 1e-3, waited / 20)
                time.sleep(pause)

    def leave(self) -> None:
        """Before this rank goes, wait (briefly) until no peer still polls our last stage.

        A rank returns from a collective once it sees every peer done, but a peer may not
        have seen it done yet; leaving then would make that peer's last poll fail.
        """
        last = int(self.block[_STAGE])
        if last % 2:  # we left a call midway: it failed, the peers get the error anyway
            return
        pending, deadline = list(self.others), time.monotonic() + _LEAVE_SECONDS
        while pending and time.monotonic() < deadline:
            pending = [p for p in pending if not self._has_seen(p, last)]
            if pending:
                time.sleep(1e-4)

    def staged(self, rank: int, dtype, count: int) -> np.ndarray:
        """The first `count` elements of group rank `rank`'s staging area, as `dtype`."""
        return np.frombuffer(self.segments[rank].mm, dtype, count, offset=_CONTROL_BYTES)

    def close(self) -> None:
        # Views first: a mapping cannot close under them.
        self.blocks, self.block = {}, np.empty(0, np.uint64)
        for segment in self.segments.values():
            segment.close()
        self.segments, self.stage_bytes = {}, 0

    def _has_seen(self, peer: int, stage: int) -> bool:
        """True if peer saw every rank reach `stage`, or can no longer look."""
        if self.channel.gone(self.group.ranks[peer]) is not None:
            return True
        try:
            read_remote(self.peers[peer][0], self._stage_at, self.peers[peer][1], 8, self._iov)
        except OSError:
            return True  # gone
        return int(self.blocks[peer][_SEEN]) >= stage

    def _check_alive(self, pending, what) -> None:
        channel, lost = self.channel, self.group.lost
        if lost is not None:  # its master said a member is gone (ProcessGroup.abort)
            self._lost(self.group.ranks.index(lost), what, "is lost")
        for p in pending:
            why = channel.gone(self.group.ranks[p])
            if why is not None or channel.closed:
                self._lost(p, what, why or "closed the channel")

    def read(self, peer: int, local: int, remote: int, nbytes: int, what: str,
             write: bool = False) -> None:
        """Copy `nbytes` of peer's memory at address `remote` to our address `local` (or back)."""
        try:
            read_remote(self.peers[peer][0], local, remote, nbytes, self._iov, write)
        except OSError as exc:
            self._lost(peer, what, f"cannot be read ({exc.strerror})")

    def _lost(self, peer: int, what: str, why: str):
        rank = self.group.ranks[peer]
        err = ChannelClosedError(f"shm {what} on rank {self.channel.rank}: rank {rank} {why}; "
                                 f"it died or left, check the logs of rank {rank}", peer=rank)
        err.group_peer = peer
        raise err

    # -- the call's frame ------------------------------------------------------------------

    def begin(self, what: str, seq: int, mine: bytes, check, a=None, b=None) -> int:
        """Publish call `seq` (descriptor `mine`), wait for every peer to publish theirs,
        and check(every descriptor by rank), which raises unless they agree."""
        base = 2 * seq
        self.publish(base + 1, a, b, mine)
        self.wait(base + 1, what)
        every = []
        for p in range(self.group.size):
            if p == self.group.rank:
                every.append(mine)
                continue
            self._fields[p] = self.blocks[p]
            every.append(self._fields[p].view(np.uint8)[_DESC_AT:_DESC_AT + len(mine)].tobytes())
        try:
            check(every)
        except CollectiveMismatchError:
            self._linger(base, what)
            raise
        return base

    def _linger(self, base: int, what: str) -> None:
        """Before raising a mismatch, wait until every peer has read our descriptor too."""
        try:
            self.finish(base, what)
        except ChannelError:
            pass  # a peer left or went silent: the mismatch is still the error to report

    def finish(self, base: int, what: str) -> None:
        """Say we are done reading the others, and wait until they are done reading us."""
        self.publish(base + 2)
        self.wait(base + 2, what)

    def buffer(self, peer: int, which: int) -> tuple[int, int]:
        """A peer's published buffer `which` (BUF_A or BUF_B): address and size in bytes."""
        return int(self._fields[peer, which]), int(self._fields[peer, which + 1])

    def read_part(self, peer, which, dst: np.ndarray, offset_bytes: int, what: str,
                  write: bool = False) -> None:
        """Read dst.nbytes bytes of a peer's buffer from `offset_bytes` into `dst` (or back)."""
        addr, size = self.buffer(peer, which)
        if offset_bytes + dst.nbytes > size:
            raise ChannelError(f"shm {what} on rank {self.channel.rank}: rank "
                               f"{self.group.ranks[peer]} published {size} bytes, "
                               f"{offset_bytes + dst.nbytes} needed")
        if dst.nbytes:
            self.read(peer, dst.ctypes.data, addr + offset_bytes, dst.nbytes, what, write)

    def reduce_from(self, peers, which, out: np.ndarray, start: int, op, what: str,
                    avg: int = 0, write_to=()) -> None:
        """out op= every peer's elements [start, start + out.size) of buffer `which`.

        Piece by piece, so the peers' data passes through cache once; with `avg` the sum is
        divided by it, and each finished piece is written back into the `write_to` peers'
        buffers at the same place while it is still in cache.
        """
        step = max(1, _PIECE_BYTES // out.itemsize)
        tmp = self._tmp[:step * out.itemsize].view(out.dtype)
        for lo in range(0, out.size, step):
            piece, at = out[lo:lo + step], (start + lo) * out.itemsize
            for p in peers:
                part = tmp[:piece.size]
                self.read_part(p, which, part, at, what)
                combine(op, piece, part, mine_is_lower=False)
            if avg:
                np.divide(piece, avg, out=piece)
            for p in write_to:
                self.read_part(p, which, piece, at, what, write=True)


def setup(channel, group) -> CmaGroup | None:
    """Share our control segment, map the peers', and agree whether CMA works for all."""
    store, prefix = channel.store, f"{channel.prefix}/cma/{group.group_id}"
    probe = np.zeros(1, np.uint64)  # any word of ours: reading it tells a peer we exist
    mine, why = _new_segment(channel, group)
    name, size = (mine.path.rsplit("/", 1)[1], mine.mm.size()) if mine else ("-", 0)
    peers, segments = {}, {group.rank: mine} if mine else {}
    try:  # from the publication on: the session may end, its store closed, at any step
        store.set(f"{prefix}/{channel.rank}", f"{os.getpid()}:{probe.ctypes.data}:{name}:{size}")
        for p, rank in enumerate(group.ranks):
            if rank != channel.rank:
                pid, addr, name, size = _get(store, prefix, rank, group).split(":")
                peers[p] = (int(pid), int(addr))
                why = why or _map(segments, p, name, int(size), channel, rank)
        store.set(f"{prefix}/ok/{channel.rank}", why or _verdict(channel, group, peers))
        verdicts = [_get(store, f"{prefix}/ok", r, group) for r in group.ranks]
    finally:
        if mine:
            mine.unlink()  # every peer has mapped it (or never will): no name left behind
    refused = [v[2:] for v in verdicts if not v.startswith("1")]
    if refused:
        for segment in segments.values():
            segment.close()
        if channel.rank == group.ranks[0]:
            log.warning("%s channel: single-copy collectives off for %s (%s); using the "
                        "socket and slot path", channel.name, group.name, "; ".join(refused))
        return None
    return CmaGroup(channel, group, peers, probe, segments)


def _new_segment(channel, group):
    """Our control block and staging area, or the block alone where /dev/shm is short."""
    size = max(config.get("shm_stage_bytes"), 0)
    if size:
        try:
            return Segment(new_name(), 1, _CONTROL_BYTES + size, create=True), None
        except OSError as exc:
            log.warning("shm channel: no %d-byte staging area for %s (%s); all_reduce reads "
                        "peers in place instead", size, group.name, exc)
    try:
        return Segment(new_name(), 1, _CONTROL_BYTES, create=True), None
    except OSError as exc:
        return None, f"0 rank {channel.rank} has no shared control block ({exc})"


def _map(segments, p, name, size, channel, rank) -> str | None:
    """Map group rank p's segment; a refusal verdict if we cannot."""
    if name == "-":
        return f"0 rank {rank} has no shared control block"
    try:
        segments[p] = Segment(name, 1, size, create=False)
    except OSError as exc:
        return f"0 rank {channel.rank} cannot map rank {rank}'s control block ({exc})"
    return None


def _verdict(channel, group, peers) -> str:
    """'1' if this rank can use CMA with every peer, else '0 <why>'."""
    if not config.get("shm_cma"):
        return f"0 rank {channel.rank} has MWRT_SHM_CMA=0"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"0 rank {channel.rank}: control blocks assume x86-64 store order"
    if not available():
        return f"0 rank {channel.rank}: no process_vm_readv/writev in this C library"
    probe = np.zeros(1, np.uint64)
    for p, (pid, addr) in peers.items():
        try:
            read_remote(pid, probe.ctypes.data, addr, probe.nbytes)
        except OSError as exc:
            return f"0 rank {channel.rank} cannot read rank {group.ranks[p]} ({exc.strerror})"
    return "1"


def _get(store, prefix: str, rank: int, group) -> str:
    """What `rank` published under `prefix` during setup; an error naming it if it never does."""
    channel, deadline = group.channel, time.monotonic() + group.timeout
    while True:
        try:  # in short slices: a rank declared gone meanwhile must fail us now
            return store.get(f"{prefix}/{rank}", timeout=0.2).decode()
        except TimeoutError:
            pass
        why = channel.gone(rank) or ("closed the channel" if channel.closed else None)
        if why is not None or time.monotonic() > deadline:
            cls = ChannelTimeoutError if why is None else ChannelClosedError
            err = cls(f"shm channel: rank {rank} did not join the first collective of "
                      f"{group.name} ({why or f'nothing in the store after {group.timeout} s'});"
                      f" is it running and calling it?")
            err.group_peer = group.ranks.index(rank)
            raise err


__all__ = ["CmaGroup", "setup"]
