"""The agreement check: every rank of a collective called it with the same kind, op, dtype,
shape and root, or every rank raises CollectiveMismatchError naming each rank's values.

Each rank packs its call into a fixed-size descriptor. The check costs no message of its
own where it can ride inside the collective's: an algorithm that all-gathers as it goes
(recursive doubling; the barrier) takes the check over (`ProcessGroup.carry_check`), and
each of its messages is [every descriptor its sender knows][payload] on the check tag.
After the last round every rank holds every rank's descriptor. A received descriptor
that differs from ours poisons the call: its data is never combined, but the messages
still flow, so every rank completes the all-gather and raises the same error.

Other collectives check lazily: their first message starts the check, which sends our
descriptor to every peer on the check tag (derived from the collective's sequence number,
so a message left over from a failed collective never meets the next one), and the first
*wait* for data (`ProcessGroup.recv`, a receive's `wait`, a native collective) or the end
of the collective settles it, receiving one message from every peer. A call that agrees
pays no extra round trip, and a call that does not is caught before any received byte is
used. That needs sends that complete without a matching receive (`buffered_sends`);
elsewhere, and above `DIRECT_MAX` ranks, the check runs first as a round of its own.

The two kinds meet: a rank that checks directly takes a carried message as its peer's
word, and a poisoned carrier sends what it knows to the peers its pattern never reached,
so a mismatch between, say, a barrier and a broadcast raises on every rank instead of
hanging. A carrier that fails (a peer died) tells every other peer, naming the dead rank,
so ranks that wait on it in later rounds fail at once rather than at their timeout.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from ..errors import (
    ChannelClosedError,
    ChannelError,
    ChannelTimeoutError,
    CollectiveMismatchError,
    WireError,
)
from . import algorithms as alg
from .reduce_ops import ReduceOp

DIRECT_MAX = 8
_ALREADY_HERE = 0.05  # seconds to wait for a check message that should have come long ago
ABORT, TIMED_OUT = 1, 2  # a check message's flags: the sender failed; it was a timeout
_NOBODY = 0xFFFFFFFF

_OPS = list(ReduceOp)
_KINDS = ["all_reduce", "broadcast", "reduce", "gather", "scatter", "all_gather",
          "reduce_scatter", "all_to_all", "barrier"]
# seq, kind, op, ndim, flags, root, count, dtype, dims[6]
_DESC = struct.Struct("<IBBBBiq8s6q")
_SEQ = struct.Struct("<I")
# A check message: count of descriptors, flags, the rank an ABORT names; then per descriptor
# its rank and bytes (80 bytes: the payload after them stays 8-byte aligned).
_HEAD = struct.Struct("<HHI")
_RANK = struct.Struct("<I")
_ENTRY = _RANK.size + _DESC.size
_TAILS: dict = {}
_CHANNEL_ERRORS = (ChannelError, TimeoutError, ConnectionError)


def describe_call(seq, kind, op=None, root=-1, dtype="u1", shape=(), count=0,
                  split=()) -> bytes:
    """The fixed-size descriptor of one collective call; `split`: uneven per-rank counts."""
    key = (kind, op, root, dtype, shape, count, split)
    tail = _TAILS.get(key)
    if tail is None:  # packing costs microseconds; a program repeats a few calls
        if len(_TAILS) > 4096:
            _TAILS.clear()
        dims = list(shape)[:6] + [0] * (6 - min(len(shape), 6))
        if split:  # in the last slot, past a shape of at most 5 dims: a digest of the counts
            dims[5] = zlib.crc32(np.asarray(split, np.int64).tobytes()) or 1
        tail = _TAILS[key] = _DESC.pack(
            0, _KINDS.index(kind), _OPS.index(op) if op else 255, len(shape), 0, root, count,
            np.dtype(dtype).str.encode(), *dims)[_SEQ.size:]
    return _SEQ.pack(seq & 0xFFFFFFFF) + tail


def explain(raw: bytes) -> str:
    """A descriptor in words, for the mismatch error."""
    seq, kind, op, ndim, _, root, count, dtype, *dims = _DESC.unpack(raw)
    kind = _KINDS[kind] if kind < len(_KINDS) else f"kind#{kind}"
    text = f"#{seq} {kind}"
    if op != 255:
        text += f" op={_OPS[op].name}"
    if root >= 0:
        text += f" root={root}"
    dtype = np.dtype(dtype.rstrip(b"\0").decode())
    if kind != "barrier":
        shape = list(dims[:ndim]) if ndim <= 6 else f"({ndim}-d, {count} elements)"
        text += f" {dtype}{shape}"
    if ndim < 6 and dims[5]:
        text += f" split by rank #{dims[5]:08x}"
    return text


def check_known(group, kind: str, known: dict[int, bytes]) -> None:
    """check() over descriptors by rank; one never received is a protocol error, unless
    those that did arrive already disagree (a rank that took another algorithm sent less)."""
    if len(known) == group.size and len(set(known.values())) == 1:
        return  # the common case, quickly
    check(group, kind, known)
    missing = [r for r in range(group.size) if r not in known]
    raise WireError(f"{kind} on {group.name}: the call descriptors of ranks {missing} "
                    "never arrived; are all ranks the same mwrt version?")


def check(group, kind: str, every) -> None:
    """Raise CollectiveMismatchError unless the descriptors in `every` (a list by rank, or
    {rank: descriptor} where a missing rank is unknown) are all equal."""
    every = dict(enumerate(every)) if isinstance(every, list) else every
    first = next(iter(every.values()))
    if all(d == first for d in every.values()):
        return
    groups: dict[str, list[int]] = {}
    for r in range(group.size):
        groups.setdefault(explain(every[r]) if r in every else "not heard from", []).append(r)
    detail = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {v}"
                       for v, rs in groups.items())
    raise CollectiveMismatchError(
        f"{kind} on {group.name}: ranks disagree on the collective ({detail}); every rank must "
        "call the same collectives in the same order with the same op, dtype, shape and root"
        + (_SAME_SIZE if _only_shapes_differ(every.values()) else ""))


_SAME_SIZE = ("; the shapes differ but hold as many elements: refused by design, as a shape "
              "that differs between ranks usually means they disagree on the data; reshape "
              "to one shape on every rank (t.reshape(-1)) if that is what you meant")


def _only_shapes_differ(descriptors) -> bool:
    """True if the calls differ in their shapes alone, all of one element count."""
    seen = set()
    for raw in descriptors:
        seq, kind, op, ndim, flags, root, count, dtype, *dims = _DESC.unpack(raw)
        shape = dims[:ndim] if ndim <= 6 else dims
        size = int(np.prod(shape, dtype=np.int64)) if ndim <= 6 else count
        seen.add((seq, kind, op, flags, root, dtype, size))
    return len(seen) == 1


# -- check messages ------------------------------------------------------------------------


def pack(entries: list[bytes], payload=None, flags: int = 0, aux: int = 0) -> bytes:
    """A check message: the header, packed entries (rank + descriptor), the payload's bytes."""
    head = _HEAD.pack(len(entries), flags, aux)
    return b"".join([head, *entries] if payload is None else [head, *entries, payload])


def unpack(group, msg: memoryview, peer: int):
    """(descriptors by rank, flags, aux, payload) of group rank `peer`'s check message."""
    count, flags, aux = _HEAD.unpack_from(msg) if len(msg) >= _HEAD.size else (-1, 0, 0)
    end = _HEAD.size + count * _ENTRY
    if not 0 <= count <= group.size or end > len(msg):
        raise WireError(f"check message from rank {group.ranks[peer]} on {group.name}: "
                        f"malformed ({len(msg)} bytes, {count} descriptors); are both sides "
                        "the same mwrt version?")
    known = {}
    for at in range(_HEAD.size, end, _ENTRY):
        (rank,) = _RANK.unpack_from(msg, at)
        if rank >= group.size:
            raise WireError(f"check message from rank {group.ranks[peer]} on {group.name}: a "
                            f"descriptor of rank {rank} in a group of {group.size}")
        known[rank] = bytes(msg[at + _RANK.size:at + _ENTRY])
    if flags & ABORT:
        raise _aborted(group, peer, aux, flags, msg[end:])
    return known, msg[end:]


def _aborted(group, peer: int, failed: int, flags: int, reason) -> ChannelError:
    """The error a rank raises when `peer` says the collective failed there."""
    text = f"rank {group.ranks[peer]} gave up on the collective: {str(reason, 'utf-8', 'replace')}"
    err: ChannelError
    if flags & TIMED_OUT:  # we, too, waited for `peer` in vain
        err = ChannelTimeoutError(text)
        err.group_peer = peer
        return err
    failed = failed if failed < group.size else peer
    err = ChannelClosedError(text, peer=group.ranks[failed])
    err.group_peer = failed
    return err


# -- the check in its two forms ------------------------------------------------------------


class Agreement:
    """One collective's check: started by its first message, settled before data is used."""

    def __init__(self, group, tag: int, kind: str, mine: bytes):
        self.group, self.tag, self.kind, self.mine = group, tag, kind, mine
        self.started = self.settled = False

    def start(self) -> None:
        """Send our descriptor to every peer (once), or run the all-gather round now."""
        if self.started:
            return
        self.started = True
        g = self.group
        if g.size > DIRECT_MAX or not g.speculates:
            self._all_gather()
            return
        msg = pack([_RANK.pack(g.rank) + self.mine]) if g.carries_checks else \
            np.frombuffer(self.mine, np.uint8)
        for peer in range(g.size):
            if peer != g.rank:
                g.raw_send(msg, peer, self.tag)

    def take(self) -> bytes:
        """Hand the check to the caller, who carries it: nothing of ours will be sent."""
        if self.started:
            raise RuntimeError(f"take_check on {self.group.name}: the check of this "
                               f"{self.kind} already started (sent, or taken before); take it "
                               "once, before the collective's first send or receive")
        self.started = self.settled = True
        return self.mine

    def settle(self) -> None:
        """Receive one message from every peer (once) and raise if any descriptor differs."""
        if self.settled:
            return
        self.start()
        if self.settled:
            return
        self.settled = True
        g, every = self.group, {self.group.rank: self.mine}
        for peer in range(g.size):
            if peer == g.rank:
                continue
            try:
                self._hear(peer, every)
            except ChannelTimeoutError:
                # Ranks that disagree may be why this one is late: that is the better error.
                for other in range(peer + 1, g.size):
                    if other != g.rank:
                        try:
                            self._hear(other, every, timeout=_ALREADY_HERE)
                        except ChannelError:
                            pass
                check(g, self.kind, every)
                raise
        check_known(g, self.kind, every)

    def _hear(self, peer: int, every: dict, timeout: float | None = None) -> None:
        """Add the descriptors in `peer`'s check message to `every`."""
        g = self.group
        if g.carries_checks:
            msg = g.raw_recv_message(peer, self.tag, timeout)
            for rank, desc in unpack(g, msg, peer)[0].items():
                every.setdefault(rank, desc)
        else:
            buf = np.empty(len(self.mine), np.uint8)
            g.raw_recv(buf, peer, self.tag, timeout)
            every[peer] = buf.tobytes()

    def settle_after_error(self) -> None:
        """On a failed collective: raise the mismatch if that was the cause, else return."""
        try:
            self.settle()
        except ChannelError:
            pass  # the peer is gone or silent: the original error says so

    def _all_gather(self) -> None:
        g = self.group
        if g.carries_checks:  # the same pattern as carried collectives, so the two meet
            carrier = Carrier(g, self.tag, self.kind, self.mine)
            alg.all_reduce_rd_carried(carrier, None, None)
            self.settled = True
            carrier.finish()
            return
        mine = np.frombuffer(self.mine, np.uint8)
        every = np.empty((g.size, mine.size), np.uint8)
        alg.all_gather_bruck(_Raw(g), mine, every.reshape(-1), self.tag)
        self.settled = True
        check(g, self.kind, [row.tobytes() for row in every])


class Carrier:
    """The check riding in a collective's own messages: [descriptors known][payload]."""

    def __init__(self, group, tag: int, kind: str, mine: bytes):
        self.group, self.tag, self.kind, self.mine = group, tag, kind, mine
        self.rank, self.size = group.rank, group.size
        self.known = {group.rank: mine}
        self.entries = [_RANK.pack(group.rank) + mine]
        self.poisoned, self.notified = False, False
        self.sent: set[int] = set()

    def send(self, peer: int, payload=None) -> None:
        """Send every descriptor we know, then `payload` (a flat array or None), to `peer`."""
        try:
            self.group.raw_send(pack(self.entries, payload), peer, self.tag)
        except _CHANNEL_ERRORS as exc:
            self._notify(exc)
            raise
        self.sent.add(peer)

    def exchange(self, peer: int, payload=None, like=None):
        """send(peer, payload), then recv(peer, like), in one channel call."""
        try:
            msg = self.group.raw_exchange_message(pack(self.entries, payload), peer, self.tag)
        except ChannelTimeoutError as exc:
            msg = self._wait_late(peer, exc)  # raises: ours, or the peer's notice
        except _CHANNEL_ERRORS as exc:
            self._notify(exc)
            raise
        self.sent.add(peer)
        return self._take(msg, peer, like)

    def recv(self, peer: int, like=None):
        """`peer`'s payload as an array like `like`; None without one, or once poisoned."""
        return self._take(self._wait_message(peer), peer, like)

    def _take(self, msg: memoryview, peer: int, like):
        try:
            known, payload = unpack(self.group, msg, peer)
        except _CHANNEL_ERRORS as exc:
            self._notify(exc)
            raise
        for rank, desc in known.items():
            if rank not in self.known:
                self.known[rank] = desc
                self.entries.append(_RANK.pack(rank) + desc)
            self.poisoned = self.poisoned or desc != self.mine
        if like is None or self.poisoned:
            return None
        if len(payload) != like.nbytes:
            raise WireError(f"check message from rank {self.group.ranks[peer]}: {len(payload)} "
                            f"bytes of data for a call that needs {like.nbytes}")
        return np.frombuffer(payload, like.dtype)

    def finish(self) -> None:
        """Raise the mismatch, as every rank of a poisoned call does; else return."""
        if self.poisoned and self.size <= DIRECT_MAX:
            # Ranks that check directly wait for a message from every peer: reach the rest.
            note = pack(self.entries)
            for peer in range(self.size):
                if peer != self.rank and peer not in self.sent:
                    self._quietly(note, peer)
        check_known(self.group, self.kind, self.known)

    def _wait_message(self, peer: int) -> memoryview:
        try:
            return self.group.raw_recv_message(peer, self.tag)
        except ChannelTimeoutError as exc:
            return self._wait_late(peer, exc)
        except _CHANNEL_ERRORS as exc:
            self._notify(exc)
            raise

    def _wait_late(self, peer: int, first: ChannelTimeoutError) -> memoryview:
        """After a timeout waiting for `peer`: tell the others, then await `peer`'s notice."""
        # The peer may wait in turn on a rank that failed a moment after we began to wait:
        # its notice, which names that rank, gets a short while to arrive.
        self._notify(first)
        g = self.group
        try:
            late = g.raw_recv_message(peer, self.tag, timeout=min(g.timeout, 1.0))
        except ChannelTimeoutError:
            raise first from None
        unpack(g, late, peer)  # raises the peer's notice, if that is what came
        raise first

    def _notify(self, exc: BaseException) -> None:
        """Tell every peer but the failed one that this collective failed here (once)."""
        if self.notified:
            return
        self.notified, g = True, self.group
        failed = getattr(exc, "group_peer", None)
        timed_out = isinstance(exc, TimeoutError)
        what = "timed out waiting for" if timed_out else "lost"
        who = "a peer" if failed is None else f"rank {g.ranks[failed]}"
        reason = f"rank {g.ranks[self.rank]} {what} {who}: {exc}"[:500].encode()
        note = pack([], reason, ABORT | (TIMED_OUT if timed_out else 0),
                    _NOBODY if failed is None else failed)
        for peer in range(self.size):
            if peer not in (self.rank, failed):
                self._quietly(note, peer)

    def _quietly(self, msg: bytes, peer: int) -> None:
        try:  # best effort: the error being raised already explains the failure
            self.group.raw_send(msg, peer, self.tag, timeout=min(self.group.timeout, 1.0))
        except _CHANNEL_ERRORS:
            pass


class _Raw:
    """A group whose point-to-point skips the agreement hooks (for the Bruck fallback)."""

    def __init__(self, group):
        self.rank, self.size, self.eager_bytes = group.rank, group.size, group.eager_bytes
        self.send, self.recv, self.isend = group.raw_send, group.raw_recv, group.raw_isend
