"""Questions and waits addressed to whole nodes: num_nodes, synchronize, memory_stats,
devices."""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol import wire
from .cluster import current


def num_nodes() -> int:
    """How many worker nodes this master drives."""
    return len(current().nodes)


def synchronize(node: int | Sequence[int] | None = None) -> None:
    """Wait until every stream of `node` (of each node in a sequence of them, or of every
    node) has run all issued commands."""
    cluster = current()
    targets = cluster.nodes if node is None else [cluster.node(node)] if isinstance(
        node, int) else [cluster.node(i) for i in node]
    pending = []
    for target in targets:
        for stream in target.known_streams():
            sync = wire.Sync(id=next(target.ids), stream=stream, token=next(target.tokens))
            target.issue(sync)
            pending.append((target, sync.token, stream))
    for target in targets:  # every node starts on its Syncs before we wait on the first
        target.flush()
    for target, token, stream in pending:
        target.wait(token, f"synchronize() of stream {stream}")


def cancel(node: int | None = None) -> None:
    """Drop the commands queued on `node`'s streams (or every node's) behind the ones running
    now, which run to their end (a remote() function cannot be stopped halfway): what the
    dropped commands would make is an error naming mwrt.cancel() when read."""
    cluster = current()
    targets = cluster.nodes if node is None else [cluster.node(node)]
    asked = []
    for target in targets:
        cancel = wire.Cancel(id=next(target.ids), token=next(target.tokens))
        target.issue(cancel)
        target.flush()
        asked.append((target, cancel.token))
    for target, token in asked:
        target.wait(token, "mwrt.cancel()")


def memory_stats(node: int = 0) -> dict:
    """Live tensors and bytes that this master holds on `node`, once its streams are done."""
    target = current().node(node)
    synchronize(node)
    reply, _ = target.request(wire.Stats(id=next(target.ids), token=next(target.tokens)),
                              "memory_stats()")
    return {k: v for k, v in reply.value.items() if k not in ("worker", "running")}  # ours


def device_count(node: int = 0) -> int:
    """How many GPUs the worker of `node` has (0: host memory only)."""
    info = current().node(node).info  # None only before the worker's hello
    return info.devices if info is not None else 0


def devices(node: int = 0) -> list[dict]:
    """The GPUs of `node`'s worker, as it found them when this master connected: a dict each
    with index, name, total_memory and free_memory (bytes), compute_capability ("8.0")."""
    info = current().node(node).info
    return [dict(gpu) for gpu in info.gpus] if info is not None else []


def status() -> list[dict]:
    """Every node of this session as `mwrt status` shows it, without waiting for streams:
    its address, the worker's process, host memory and GPUs, and this master's share."""
    cluster, out = current(), []
    for node in cluster.nodes:
        row = {"node": node.index, "address": node.address, "lost": node.lost,
               "heartbeat_age": cluster.heartbeat.age(node.index)}
        if node.lost is None:
            reply, _ = node.request(wire.Stats(id=next(node.ids), token=next(node.tokens)),
                                    "status()")
            row["worker"] = reply.value.pop("worker", {})
            row["session"] = reply.value
        out.append(row)
    return out
