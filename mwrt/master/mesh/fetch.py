"""Copying many tensors to the master at once: every request goes out before the first
reply is read, so N nodes send their blocks concurrently (one round trip, not N)."""

from __future__ import annotations

import math

import numpy as np

from ... import config, staging
from ...arrays import HOST
from ...errors import MwrtError, RemoteError
from ...ops import Spec
from ...protocol import wire
from .. import ordering, transfer
from ..cluster import current


def fetch_many(tensors: list) -> list[np.ndarray]:
    """The values of `tensors` (DistributedTensors, any nodes) on the master, in order."""
    for t in tensors:  # a lost node is named before any request goes out
        t._node.check_lost()
    out: list = [None] * len(tensors)
    pending: list[tuple] = []  # (index, node, token, inline) of each request
    works: list[tuple] = []  # (node, receive) of each large one
    touched: list = []  # the nodes asked
    try:
        for k, t in enumerate(tensors):
            node, spec = t._node, t._spec
            nbytes = None if spec is None else math.prod(spec.shape) * spec.dtype.itemsize
            if nbytes is None or nbytes <= node.inline_bytes:
                stream = ordering.read_stream(t)  # a view's: its storage's last writer
                get = wire.Get(id=next(node.ids), stream=stream, ref=t._id,
                               token=next(node.tokens))
                node.issue(get)
                pending.append((k, node, get.token, True))
            elif nbytes > config.get("max_tensor_bytes"):
                out[k] = transfer.fetch(t)  # refused: the worker says why
                continue
            else:
                out[k] = _post_receive(t, node, pending, works, k)
            touched.append(node)
        for node in {id(n): n for n in touched}.values():
            node.flush()
        for n, (k, node, token, inline) in enumerate(pending):
            try:
                reply, frames = node.wait(token, f"numpy() of a shard on node {node.index}")
            except RemoteError:  # the other answers are on their way: none is left behind
                _drop_answers(pending[n + 1:])
                raise
            if inline:
                shape, dtype = tuple(reply.shape), np.dtype(reply.dtype)
                if tensors[k]._spec is None:
                    tensors[k]._spec = Spec(shape, dtype)
                out[k] = np.frombuffer(frames[0], dtype=dtype).reshape(shape).copy()
        for node, work in list(works):
            with transfer._naming_the_node(node):
                work.finish() if isinstance(work, staging.Receive) else work.wait()
            works = [w for w in works if w[1] is not work]
    finally:
        for _, work in works:  # an error above: no receive is left posted
            work.cancel()
    return out


def _post_receive(t, node, pending: list, works: list, k: int) -> np.ndarray:
    """Post the receive of t's bytes into a new array (a GPU's come in chunks, each chunk's
    receive posted as the one before lands), then ask its worker to send them."""
    cluster = current()
    node.check_lost()
    tag = staging.tag_for(wire.TRANSFER_TAGS | next(transfer._TAGS), t.nbytes,
                          t._device != HOST)
    with transfer._naming_the_node(node):
        if staging.chunked(tag):
            work = staging.Receive(cluster.channel(), t.shape, t.dtype, HOST, node.index, tag)
            array = work.out
        else:
            array = np.empty(t.shape, t.dtype)
            work = cluster.channel().irecv(array.reshape(-1).view(np.uint8), node.index, tag)
    works.append((node, work))
    stream = ordering.read_stream(t)
    send = wire.SendTo(id=next(node.ids), stream=stream, ref=t._id,
                       peer=cluster.master_rank, tag=tag, token=next(node.tokens))
    node.issue(send)
    pending.append((k, node, send.token, False))
    return array


def _drop_answers(pending: list) -> None:
    for _, node, token, _ in pending:
        try:
            node.wait(token, f"numpy() of a shard on node {node.index}")
        except MwrtError:
            pass  # the error being raised names the read


def settle(tensors: list) -> None:
    """After a failed read of a mesh tensor: each block's stream reports its error now (and
    clears it), so a failure at every place of a mesh op is raised once, not again at the
    next op that reads another of its places. Errors are dropped: the one raised names the
    op."""
    asked = []
    for t in tensors:
        node = t._node
        if node.lost is not None:
            continue
        sync = wire.Sync(id=next(node.ids), stream=ordering.read_stream(t),
                         token=next(node.tokens))
        node.issue(sync)
        asked.append((node, sync.token))
    for node, token in asked:
        try:
            node.wait(token, f"the streams of a failed read, on node {node.index}")
        except MwrtError:
            pass
