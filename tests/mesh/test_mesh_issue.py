"""A mesh op encoded once: its result's blocks share one id, operands with an id per place
are spliced in, streams and graphs still hold (values checked against NumPy)."""

from __future__ import annotations

import contextlib
import gc
import time

import numpy as np
import pytest

import mwrt
from mwrt.master.mesh import dispatch

pytestmark = pytest.mark.timeout(120)


def same(t, expected):
    got, expected = t.numpy(), np.asarray(expected)
    assert (t.shape, t.dtype) == (expected.shape, expected.dtype)
    assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def ids(t) -> set:
    return {s._id for s in t.shards()}


def test_results_and_constructors_have_one_id_at_every_place(cluster):
    mesh = mwrt.mesh()
    x = data(10, 3)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)  # sent place by place: an id each
    assert len(ids(X)) == 2
    Y = X * 2.0
    assert len(ids(Y)) == 1
    Z = mwrt.zeros(10, 3, mesh=mesh, shard=0)
    assert len(ids(Z)) == 1
    same(Y, x * 2.0)
    same(Z, np.zeros((10, 3), np.float32))


def test_operands_with_an_id_per_place_are_spliced_in(cluster):
    mesh = mwrt.mesh()
    x, y = data(10, 3), data(10, 3, seed=1)
    X, Y = mwrt.dist_send(x, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    U = X + 1.0  # one id
    same(X + Y, x + y)  # two operands spliced
    same(U * Y, (x + 1.0) * y)  # one shared, one spliced
    same(np.maximum(Y, U), np.maximum(y, x + 1.0))
    U += Y  # in place, on the shared one
    X -= U  # in place, on a spliced one
    same(U, (x + 1.0) + y)
    same(X, x - ((x + 1.0) + y))


def test_uneven_blocks_and_a_replicated_operand(cluster):
    mesh = mwrt.mesh()
    x, row = data(7, 2), data(2, seed=2)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)  # 4 and 3 rows
    R = mwrt.dist_send(row, mesh=mesh) * 1.0  # replicated, one id
    same(X * R, x * row)
    same(np.exp(X - R).sum(axis=1), np.exp(x - row).sum(axis=1))


def test_ops_on_chosen_streams_go_place_by_place(cluster):
    mesh = mwrt.mesh()
    x = data(9, 2)
    U = mwrt.dist_send(x, mesh=mesh, shard=0) * 1.0
    side = [mwrt.Stream(node=n) for n, _ in mesh.places]
    with contextlib.ExitStack() as stack:
        for s in side:
            stack.enter_context(mwrt.stream(s))
        U += 1.0  # a write on every side stream
        V = U * 3.0
    W = U + V  # back on the default streams, after the side streams' writes
    same(W, (x + 1.0) + (x + 1.0) * 3.0)


def test_a_graph_rebinds_an_input_with_one_id_at_every_place(cluster):
    mesh = mwrt.mesh()
    x, x2 = data(9, 2), data(9, 2, seed=3)
    U = mwrt.dist_send(x, mesh=mesh, shard=0) * 1.0
    with mwrt.graph(U=U) as g:
        total = (U * 2.0).sum(axis=0)
        total.reduce()
    g.replay()
    same(total, (x * 2.0).sum(axis=0))
    U += 1.0  # used since the replay, at every place: the next replay is ordered after it
    g.replay()
    same(total, ((x + 1.0) * 2.0).sum(axis=0))
    g.replay(U=mwrt.dist_send(x2, mesh=mesh, shard=0) * 1.0)
    same(total, (x2 * 2.0).sum(axis=0))


def test_many_ops_without_a_read_all_reach_the_workers(cluster):
    mesh = mwrt.mesh()
    U = mwrt.zeros(6, mesh=mesh, shard=0)
    for _ in range(1000):  # batches gathered past the quiet rule go out when full or old
        U += 1.0
    same(U, np.full(6, 1000.0, np.float32))


def test_mesh_ops_in_a_row_are_one_run_that_every_node_sends(cluster):
    """A mesh op after another, nothing queued between, is one append to a Run that every
    node's batch holds (not one append per node); each node sends it whole."""
    mesh = mwrt.mesh()
    U = mwrt.zeros(6, mesh=mesh, shard=0)
    mwrt.synchronize()
    nodes = mesh.nodes
    for node in nodes:
        node.last_flush = time.monotonic()  # not quiet: the first op waits in its batch
    for _ in range(5):
        U += 1.0
    runs = [node.batch[-1] for node in nodes if node.batch]
    if len(runs) == 2:  # (a loaded machine may have sent them already)
        assert runs[0] is runs[1] and len(runs[0]) >= 2
    same(U, np.full(6, 5.0, np.float32))


def test_a_mesh_run_waits_its_window_not_a_quiet_spell_or_the_straggler_age(cluster,
                                                                             monkeypatch):
    """A stream of mesh ops grows one run for its window, which grows with the mesh's nodes
    (16 ms at 128): the heartbeat thread sends a batch that holds a run once the run's
    window is past, not 2 ms after it began, and a node is quiet for a mesh op after its
    window without a send, not 1 ms. At 128 nodes on a loaded machine, each op took more
    than 1 ms and the heartbeat (woken every few ms by their pongs) sent each batch after
    2 ms: runs of a few ops, N sends each (bench_mesh, X += 1.0: 20-30 sends per op)."""
    monkeypatch.setattr(dispatch, "_WINDOW", 60.0)  # a window as long as a large mesh's, longer
    mesh = mwrt.mesh()
    U = mwrt.zeros(6, mesh=mesh, shard=0)
    mwrt.synchronize()
    for _ in range(3):
        U += 1.0
    now = time.monotonic()
    for node in mesh.nodes:
        assert node.batch, "the first op went alone: the node was taken for quiet"
        node.flush_stale(now + 1.0, 2e-3)  # as the heartbeat thread, a second later
        assert node.batch, "the batch went before its run's window"
        node.flush_stale(now + 61.0, 2e-3)
        assert not node.batch
    same(U, np.full(6, 3.0, np.float32))


def test_a_command_between_mesh_ops_at_one_node_ends_the_run(cluster):
    """A command queued at one node (a place's own op, a flush, a free) seals the nodes'
    run: the mesh op after it starts a new one, so every node runs its commands in the
    order they were issued."""
    mesh = mwrt.mesh()
    x = data(6)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    U = X * 1.0  # one id at every place
    first = U.shards()[0]
    expected = x * 1.0
    for step in range(30):
        U += 1.0
        expected += 1.0
        if step % 3 == 0:
            first *= 2.0  # at node 0 alone, between two mesh ops
            expected[:3] *= 2.0
        if step % 7 == 0:
            mesh.nodes[1].flush()  # node 1's batch goes out mid-run
        if step % 5 == 0:
            del first
            first = U.shards()[0]
            _ = U * 3.0  # a result dropped at once: its frees queued at every node
    same(U, expected)


def test_a_graph_result_read_on_another_stream_is_ordered_after_each_replay(cluster):
    mesh = mwrt.mesh()
    x = data(8, 2)
    U = mwrt.dist_send(x, mesh=mesh, shard=0) * 1.0
    with mwrt.graph() as g:
        t = U * 2.0
        for _ in range(20):  # temporaries only the graph holds
            t = t + 1.0
        kept = t * 1.0
    side = [mwrt.Stream(node=n) for n, _ in mesh.places]
    for k in range(1, 4):
        U += 1.0
        g.replay()
        with contextlib.ExitStack() as stack:
            for s in side:
                stack.enter_context(mwrt.stream(s))
            seen = kept * 1.0  # on the side streams: after this replay's write of `kept`
        same(seen, (x + k) * 2.0 + 20.0)


def _hold(t):
    time.sleep(0.3)


def test_a_place_used_alone_takes_its_own_record_of_uses(cluster):
    """A mesh tensor's places share one record of their uses while they are alike (a mesh
    op orders them once); a place used alone, here written on a side stream of its node,
    takes its own: the next mesh op waits for that stream there only."""
    mesh = mwrt.mesh()
    x = data(8, 2)
    U = mwrt.dist_send(x, mesh=mesh, shard=0) * 1.0  # made by one command: one record
    first = U.shards()[0]
    side = mwrt.Stream(node=mesh.places[0][0])
    with mwrt.stream(side):
        mwrt.remote(_hold, outputs=0)(first)  # the side stream is busy 0.3 s
        first += 1.0
    U *= 2.0  # place 0 after the side stream's write; place 1 has no side stream
    V = U + 1.0
    expected = x.copy()
    expected[:4] += 1.0
    same(U, expected * 2.0)
    same(V, expected * 2.0 + 1.0)


def _held() -> list:
    return [mwrt.memory_stats(n)["tensors"] for n in range(2)]


def test_a_result_made_everywhere_has_no_handle_per_place_until_one_is_asked_for(cluster):
    """A mesh op's result is one handle and one record: its blocks' handles are made when
    a plan or the user (shards()) needs them, named by the one id, and the values hold."""
    mesh = mwrt.mesh()
    x = data(10, 3)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    Y = X * 2.0
    Z = mwrt.zeros(10, 3, mesh=mesh, shard=0)
    assert Y._blocks is None and Z._blocks is None
    Y += Z  # an in-place op of two such tensors makes none either
    W = Y - 1.0
    assert (Y._blocks, Z._blocks, W._blocks) == (None, None, None)
    blocks = Y.shards()
    assert [b._node for b in blocks] == list(mesh.nodes) and len(ids(Y)) == 1
    assert [b.shape for b in blocks] == [(5, 3), (5, 3)]
    assert all(b._storage is Y._storage for b in blocks)  # the one record, shared
    same(blocks[1], x[5:] * 2.0)
    same(W, x * 2.0 - 1.0)


def test_a_dropped_mesh_result_frees_its_block_at_every_node(cluster):
    """A result made everywhere frees every place's block when dropped (one Free per node);
    once its blocks' handles were asked for, each frees its own when the last of the mesh
    handle and it goes."""
    mesh = mwrt.mesh()
    x = data(8)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    gc.collect()
    before = _held()
    made = [X * float(k) for k in range(20)]
    assert _held() == [n + 20 for n in before]
    del made
    gc.collect()
    assert _held() == before
    Y = X + 1.0
    first = Y.shards()[0]
    del Y
    gc.collect()
    assert _held() == [before[0] + 1, before[1]]  # place 0's block lives on with its handle
    same(first, x[:4] + 1.0)
    del first
    gc.collect()
    assert _held() == before
