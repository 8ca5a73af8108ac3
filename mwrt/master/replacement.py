"""Replacing a lost node (replace_node): a fresh worker connects, the survivors finish what
was in flight, the new node takes the lost one's place (on every mesh too) with the heartbeat
stopped only for the swap, and once no node is lost every node joins a new data channel."""

from __future__ import annotations

import logging

from ..errors import AuthError, MwrtError, WorkerLostError
from ..protocol import wire
from .client import Node
from .heartbeat import Heartbeat
from .local import start_one_local_worker

log = logging.getLogger("mwrt")


def replace(cluster, index: int, address: str | None, timeout: float) -> None:
    """Put a fresh node in the place of lost node `index` (see replace_node)."""
    old = cluster.node(index)
    if old.lost is None:
        raise MwrtError(f"replace_node: {old} is not lost; only a lost node is replaced "
                        "(its tensors would be dropped)")
    worker = None
    if address is None:
        if cluster.worker_keys is None:
            raise MwrtError(f"replace_node: give the address of a worker to take node "
                            f"{index}'s place (this session did not start its own workers)")
        worker = start_one_local_worker(cluster.worker_keys, timeout, len(cluster.nodes),
                                        index)
        address = worker.address
    try:
        route = worker.route if worker is not None else None
        _take_place(cluster, index, Node(cluster, index, address, route), worker, timeout)
    except BaseException as exc:
        if worker is not None and cluster.nodes[index] is old:
            worker.stop()
        raise _not_replaced(cluster, index, address, exc) from exc


def _take_place(cluster, index: int, new: Node, worker, timeout: float) -> None:
    """Connect `new`, then swap it in for lost node `index` and rejoin the data channel.
    The heartbeat stops only for the swap itself: the survivors' sessions must never
    go silent past the workers' lease, whatever the new worker does."""
    try:
        new.connect(timeout)
    except BaseException:
        new.close(goodbye=False)
        raise
    _settle(cluster, index)
    old = cluster.nodes[index]
    cluster.heartbeat.stop()
    try:
        old.replaced_by = new.address
        old.close(goodbye=False)
        cluster.nodes[index] = new
        for mesh in list(cluster.meshes):  # new ops on a mesh go to the new node
            mesh.nodes = tuple(cluster.nodes[n] for n, _ in mesh.places)
        _swap_local(cluster, old, worker)
    finally:
        cluster.heartbeat = Heartbeat(cluster)  # it watches the new node from here on
        cluster.heartbeat.start()
    if all(n.lost is None for n in cluster.nodes):  # collectives need every node of the world
        cluster.rejoin(timeout)
    else:
        log.warning("replace_node: node %d is back; collectives and transfers between "
                    "nodes wait until every lost node is replaced", index)


def _settle(cluster, lost: int) -> None:
    """Let the surviving nodes finish what was in flight when node `lost` went; what
    failed with it (a collective it was part of) is logged, not left as a sticky error
    to surprise the first sync after the replacement. Its results stay unreadable."""
    pending = []
    for node in cluster.nodes:
        if node.lost is None and node.index != lost:
            for stream in node.known_streams():
                sync = wire.Sync(id=next(node.ids), stream=stream, token=next(node.tokens))
                node.issue(sync)
                pending.append((node, sync.token, stream))
    for node, token, stream in pending:
        try:
            node.wait(token, f"settling stream {stream} before replacing node {lost}")
        except MwrtError as exc:
            log.warning("replace_node: on %s, stream %d, work in flight when node %d was "
                        "lost failed (its results are gone): %s", node, stream, lost,
                        str(exc).splitlines()[0])


def _swap_local(cluster, old, worker) -> None:
    """Stop the lost node's daemon if this master started it; keep the new one's."""
    for i, local in enumerate(cluster.local):
        if f"tcp://{local.address}" == old.address or local.address == old.address:
            local.stop()
            del cluster.local[i]
            break
    if worker is not None:
        cluster.local.append(worker)


def _not_replaced(cluster, index: int, address: str, exc: BaseException) -> BaseException:
    """The error of a replace_node that failed: what became of the new worker, and that the
    other nodes go on (node `index` stays lost, to be replaced again)."""
    if not isinstance(exc, Exception):  # a Ctrl-C stays one
        return exc
    what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    others = [str(n.index) for n in cluster.nodes if n.index != index and n.lost is None]
    message = (f"replace_node: node {index} not replaced by the worker at {address}: {what}; "
               f"node {index} is still lost and nodes {', '.join(others) or 'none'} go on; "
               f"call replace_node({index}, ADDRESS) with a live worker")
    cls = type(exc) if isinstance(exc, (AuthError, WorkerLostError)) else WorkerLostError
    return cls(message)
