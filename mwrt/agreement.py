"""The agreement check: every rank of a collective called it with the same kind, op, dtype,
shape and root, or every rank raises CollectiveMismatchError naming each rank's values.

Each rank packs its call into a fixed-size descriptor and sends it to every peer on a
control tag of its own (derived from the collective's sequence number, so a descriptor
left over from a failed collective never meets the next one). The check is fused with the
data rather than run as a round before it: the algorithm's first sends leave at once, next
to the descriptors, and the descriptors are received and compared just before the rank
first *waits* for data (`ProcessGroup.recv`, a receive's `wait`, a native collective) or,
for a rank that only sends, when the collective ends. So a call that agrees pays no extra
round trip, and a call that does not is caught before any received byte is used: a
speculative send of the wrong size only lands in a stash under a tag that nothing will
ever claim again.

This is safe only where a send completes without a matching receive (the socket channels
drain every connection; inproc queues): channels say so with `buffered_sends = True`.
Elsewhere, and above `DIRECT_MAX` ranks (n-1 descriptors per rank would dominate), the
check runs first as Bruck's all-gather, as a round of its own.
"""

from __future__ import annotations

import struct

import numpy as np

from . import algorithms as alg
from .errors import ChannelError, CollectiveMismatchError
from .reduce_ops import ReduceOp

DIRECT_MAX = 8

_OPS = list(ReduceOp)
_KINDS = ["all_reduce", "broadcast", "reduce", "gather", "scatter", "all_gather",
          "reduce_scatter", "all_to_all", "barrier"]
# seq, kind, op, ndim, flags, root, count, dtype, dims[6]
_DESC = struct.Struct("<IBBBBiq8s6q")


def describe_call(seq, kind, op=None, root=-1, dtype="u1", shape=(), count=0) -> bytes:
    """The fixed-size descriptor of one collective call."""
    dims = list(shape)[:6] + [0] * (6 - min(len(shape), 6))
    return _DESC.pack(seq & 0xFFFFFFFF, _KINDS.index(kind), _OPS.index(op) if op else 255,
                      len(shape), 0, root, count, np.dtype(dtype).str.encode(), *dims)


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
    return text


def check(group, kind: str, every: list[bytes]) -> None:
    """Raise CollectiveMismatchError unless all descriptors in `every` (by rank) are equal."""
    if all(d == every[0] for d in every):
        return
    groups: dict[str, list[int]] = {}
    for r, raw in enumerate(every):
        groups.setdefault(explain(raw), []).append(r)
    detail = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {v}"
                       for v, rs in groups.items())
    raise CollectiveMismatchError(
        f"{kind} on {group.name}: ranks disagree on the collective ({detail}); every rank must "
        "call the same collectives in the same order with the same op, dtype, shape and root")


class Agreement:
    """One collective's check in flight: our descriptor is sent, the peers' are due."""

    def __init__(self, group, tag: int, kind: str, mine: bytes):
        self.group, self.tag, self.kind, self.mine = group, tag, kind, mine
        self.settled = self.started = False

    def start(self) -> None:
        """Send our descriptor to every peer (once); before the data where sends may block."""
        if self.started:
            return
        self.started, g = True, self.group
        if g.size > DIRECT_MAX or not getattr(g.channel, "buffered_sends", False):
            self._all_gather()
            return
        for peer in range(g.size):
            if peer != g.rank:
                g.raw_send(np.frombuffer(self.mine, np.uint8), peer, self.tag)

    def _all_gather(self) -> None:
        g = self.group
        mine = np.frombuffer(self.mine, np.uint8)
        every = np.empty((g.size, mine.size), np.uint8)
        alg.all_gather_bruck(_Raw(g), mine, every.reshape(-1), self.tag)
        self.settled = True
        check(g, self.kind, [row.tobytes() for row in every])

    def settle(self) -> None:
        """Receive every peer's descriptor (once) and raise if any differs from ours."""
        self.start()
        if self.settled:
            return
        self.settled = True
        g, every = self.group, []
        buf = np.empty(len(self.mine), np.uint8)
        for peer in range(g.size):
            if peer == g.rank:
                every.append(self.mine)
                continue
            g.raw_recv(buf, peer, self.tag)
            every.append(buf.tobytes())
        check(g, self.kind, every)

    def settle_after_error(self) -> None:
        """On a failed collective: raise the mismatch if that was the cause, else return."""
        try:
            self.settle()
        except ChannelError:
            pass  # the peer is gone or silent: the original error says so


class _Raw:
    """A group whose point-to-point skips the agreement hooks (for the Bruck fallback)."""

    def __init__(self, group):
        self.rank, self.size, self.eager_bytes = group.rank, group.size, group.eager_bytes
        self.send, self.recv, self.isend = group.raw_send, group.raw_recv, group.raw_isend
