"""Questions and waits addressed to whole nodes: num_nodes, synchronize, memory_stats."""

from __future__ import annotations

from ..protocol import wire
from .cluster import current

_SYNC, _STATS = wire.code(wire.Sync), wire.code(wire.Stats)


def num_nodes() -> int:
    """How many worker nodes this master drives."""
    return len(current().nodes)


def synchronize(node: int | None = None) -> None:
    """Wait until every stream of `node` (or of every node) has run all issued commands."""
    cluster = current()
    targets = cluster.nodes if node is None else [cluster.node(node)]
    pending = []
    for target in targets:
        for stream in target.known_streams():
            token = next(target.tokens)
            target.issue((_SYNC, next(target.ids), stream, token))
            pending.append((target, token, stream))
    for target, token, stream in pending:
        target.wait(token, f"synchronize() of stream {stream}")


def memory_stats(node: int = 0) -> dict:
    """Live tensors and bytes that this master holds on `node`, once its streams are done."""
    target = current().node(node)
    synchronize(node)
    token = next(target.tokens)
    target.issue((_STATS, next(target.ids), token))
    reply, _ = target.wait(token, "memory_stats()")
    return reply.value


def device_count(node: int = 0) -> int:
    """How many GPUs the worker of `node` has (0: host memory only)."""
    return current().node(node).info.devices
