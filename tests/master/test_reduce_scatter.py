"""reduce_scatter issued by the master, and Partial -> Shard by it on meshes (NumPy the
oracle: value, dtype and shape of the handle and of .numpy()): meshes of 1-4 nodes, 2-D
meshes, uneven parts, every Partial op and every axis, inside a graph, on fake GPUs, and a
dead node named."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from tests.support.daemons import quick_to_notice_losses
from tests.mesh.test_mesh import data, four, same  # noqa: F401 - four: the module's fixture

import mwrt
from mwrt import Partial, Replicate, Shard

pytestmark = pytest.mark.timeout(180)

NUMPY_OF = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


# -- the master-issued collective ----------------------------------------------------------

@pytest.mark.parametrize("rows", [8, 7, 2, 0, 1 << 16])
def test_reduce_scatter_gives_each_node_its_part_as_array_split(four, rows):
    arrays = [np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * (i + 1)
              for i in range(4)]
    ts = [mwrt.dist_send(a, node=i) for i, a in enumerate(arrays)]
    parts = mwrt.reduce_scatter(ts)
    assert [p.get_node() for p in parts] == [0, 1, 2, 3]
    for part, expected in zip(parts, np.array_split(sum(arrays), 4)):
        same(part, expected, exact=True)
    same(ts[2], arrays[2], exact=True)  # the inputs are left intact


@pytest.mark.parametrize("op", ["sum", "max", "min", "product", mwrt.ReduceOp.BOR])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reduce_scatter_ops_and_dtypes_on_some_nodes(four, op, dtype):
    nodes = [3, 1, 0]  # any order: part i goes to nodes[i]
    arrays = [(np.arange(10, dtype=dtype) % 5 + i + 1).astype(dtype) for i in range(3)]
    ts = [mwrt.dist_send(a, node=n) for n, a in zip(nodes, arrays)]
    if op is mwrt.ReduceOp.BOR and dtype == np.float32:
        with pytest.raises(TypeError, match="integer or bool"):
            mwrt.reduce_scatter(ts, op=op)
        return
    parts = mwrt.reduce_scatter(ts, op=op)
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply,
             mwrt.ReduceOp.BOR: np.bitwise_or}[op]
    whole = ufunc.reduce(np.stack(arrays), axis=0, dtype=dtype)  # a collective keeps it
    assert [p.get_node() for p in parts] == nodes
    for part, expected in zip(parts, np.array_split(whole, 3)):
        same(part, expected, exact=True)


def test_reduce_scatter_mistakes_are_raised_at_issue_time_naming_nodes(four):
    a, b = mwrt.ones(4, 2, node=0), mwrt.ones(4, 3, node=1)
    with pytest.raises(ValueError, match=r"node 0: float32\[4, 2\], node 1: float32\[4, 3\]"):
        mwrt.reduce_scatter([a, b])
    with pytest.raises(ValueError, match=r"own node \(got nodes \[0, 0\]\)"):
        mwrt.reduce_scatter([a, mwrt.ones(4, 2, node=0)])
    with pytest.raises(ValueError, match=r"no axis 0 to split \(nodes \[0, 1\]\)"):
        mwrt.reduce_scatter([mwrt.ones((), node=0), mwrt.ones((), node=1)])
    with pytest.raises(TypeError, match="one per node"):
        mwrt.reduce_scatter([a, np.ones((4, 2))])
    with pytest.raises(ValueError, match="op"):
        mwrt.reduce_scatter([a, mwrt.ones(4, 2, node=1)], op="median")
    one = mwrt.reduce_scatter([mwrt.full((3,), 2.0, node=2)])  # one node: the whole of it
    same(one[0], np.full(3, 2.0, np.float32), exact=True)


# -- Partial -> Shard on meshes ------------------------------------------------------------

@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_partial_to_shard_along_every_axis(four, nodes, op):
    mesh = mwrt.mesh(nodes=list(range(nodes)))
    for shape in ((8, 6, 5), (9, 7, 3)):  # even and uneven parts
        x = data(*shape, seed=nodes)
        P = getattr(mwrt.dist_send(x, mesh=mesh, shard=0), op)(axis=0)
        expected = NUMPY_OF[op](x, axis=0)
        for axis in (0, 1, -1):
            Y = P.redistribute(shard=axis)
            assert Y.placement == Shard(axis % 2)
            assert [s.shape for s in Y.shards()] == \
                [p.shape for p in np.array_split(expected, nodes, axis=axis)]
            same(Y, expected, exact=False)
        if nodes > 1:  # reduce_scatter leaves its input as it was (all_reduce resolved it)
            assert P.placement == Partial(op)
        same(P, expected, exact=False)


def test_more_places_than_rows(four):
    mesh = mwrt.mesh()
    x = data(8, 2, 3)
    P = mwrt.dist_send(x, mesh=mesh, shard=0).sum(axis=0)
    Y = P.redistribute(shard=0)  # 2 rows over 4 places: two parts are empty
    assert [s.shape for s in Y.shards()] == [(1, 3), (1, 3), (0, 3), (0, 3)]
    same(Y, x.sum(axis=0), exact=False)


SOURCES = [(0, 0), (0, 1), (1, 0), (0, None), (None, 0)]
TARGETS = [(0, 0), (1, 1), (0, 1), (1, 0), (0, None), (None, 0), (None, 1), (1, None),
           (None, None)]


@pytest.mark.parametrize("source", SOURCES)
def test_two_dimensional_mesh_every_way(four, source):
    mesh = mwrt.mesh({"dp": 2, "tp": 2})
    x = data(10, 7, 5, dtype=np.float64)
    X = mwrt.dist_send(x, mesh=mesh, shard=source)
    for target in TARGETS:
        P = X.sum(axis=0)
        Y = P.redistribute(shard=target)
        assert Y.placements == tuple(Replicate() if a is None else Shard(a) for a in target)
        same(Y, x.sum(axis=0), exact=False)


def test_an_outer_dimension_cutting_an_axis_an_inner_one_shards(four):
    """(Replicate, Shard(0)) -> (Shard(0), Shard(0)): the inner split is gathered first, as
    the outer dimension splits the axis outermost (it gave wrong blocks before)."""
    mesh = mwrt.mesh({"dp": 2, "tp": 2})
    x = data(11, 3)
    for source, target in [((None, 0), (0, 0)), ((0, 0), (None, 0)), ((None, 1), (1, 1))]:
        Y = mwrt.dist_send(x, mesh=mesh, shard=source).redistribute(shard=target)
        same(Y, x, exact=True)


def test_inside_a_graph(four):
    mesh = mwrt.mesh()
    x, x2 = data(9, 2, 6), data(9, 2, 6, seed=3)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    with mwrt.graph(X=X) as g:
        Y = (X * 2).max(axis=0).redistribute(shard=1)
    g.replay()
    assert Y.placement == Shard(1)
    same(Y, (x * 2).max(axis=0), exact=False)
    g.replay(X=mwrt.dist_send(x2, mesh=mesh, shard=0))
    same(Y, (x2 * 2).max(axis=0), exact=False)


def test_zero_style_step_takes_its_shard_of_the_gradient(four):
    """ZeRO: a Partial gradient redistributed to the shard of the weights each node keeps."""
    mesh = mwrt.mesh()
    x, y = data(32, 6), data(32, seed=1)
    X, Y = mwrt.dist_send(x, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    w = mwrt.zeros(6, mesh=mesh)
    w_shard = mwrt.zeros(6, mesh=mesh, shard=0)
    ref = np.zeros(6, np.float32)
    for _ in range(3):
        grad = X.T @ (X @ w - Y)
        assert grad.placement == Partial("sum")
        w_shard -= 0.01 * grad.redistribute(shard=0)
        w = w_shard.replicate()
        ref = ref - 0.01 * (x.T @ (x @ ref - y))
    same(w, ref, exact=False)


def test_a_partial_operand_joining_a_sharded_result_takes_only_its_blocks(four):
    """w_shard -= lr * grad: the Partial gradient is reduce_scattered to w's blocks."""
    mesh = mwrt.mesh(nodes=[0, 1, 2])
    x, y = data(31, 7), data(31, seed=1)
    X, Y = mwrt.dist_send(x, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    w = mwrt.zeros(7, mesh=mesh, shard=0)
    ref = np.zeros(7, np.float32)
    for _ in range(3):
        step = 0.01 * (X.T @ (X @ w.replicate() - Y))
        w -= step
        assert step.placement == Partial("sum")  # not all_reduced: it stays as it was
        ref = ref - 0.01 * (x.T @ (x @ ref - y))
    assert w.placement == Shard(0)
    same(w, ref, exact=False)
    with mwrt.graph() as g:  # the same step captured: its collectives replay
        w -= 0.01 * (X.T @ (X @ w.replicate() - Y))
    for _ in range(2):
        g.replay()
        ref = ref - 0.01 * (x.T @ (x @ ref - y))
    same(w, ref, exact=False)
    grad = X.T @ (X @ mwrt.ones(7, mesh=mesh) - Y)
    Z = mwrt.dist_send(data(4, 7, seed=2), mesh=mesh, shard=1)
    same(Z * grad, Z.numpy() * (x.T @ (x @ np.ones(7, np.float32) - y)), exact=False)
    assert grad.placement == Partial("sum")  # broadcast against Z's rows, cut along its axis
    G = mwrt.dist_send(data(5, 7, seed=3), mesh=mesh, shard=0)
    same(G + grad, G.numpy() + (x.T @ (x @ np.ones(7, np.float32) - y)), exact=False)
    assert grad.placement == Replicate()  # its axis is not G's sharded one: all_reduced


# -- beyond one healthy host ---------------------------------------------------------------

@pytest.mark.slow  # fake GPUs and NCCL on fresh daemons
def test_a_mesh_of_fake_gpus(monkeypatch):
    mwrt.shutdown()
    monkeypatch.setenv("MWRT_FAKE_GPUS", "2")
    monkeypatch.setenv("MWRT_FAKE_GPU_BYTES", str(64 << 20))
    mwrt.init_master_worker(local_workers=2, timeout=30)
    try:
        mesh = mwrt.mesh(devices="gpu")  # node x gpu: the "gpu" lines share a node
        x = data(9, 5, 4)
        P = mwrt.dist_send(x, mesh=mesh, shard=0).sum(axis=0)
        assert P.placements == (Partial("sum"), Partial("sum"))
        for target in [(0, 0), (1, None), (None, 1), (0, 1), 0]:
            Y = P.redistribute(shard=target)
            assert Y.is_cuda and [s.get_device() for s in Y.shards()] == [0, 1, 0, 1]
            same(Y, x.sum(axis=0), exact=False)
        for dtype in (np.complex64, np.int16):  # NCCL reduces neither: staged through host
            C = mwrt.dist_send(x.astype(dtype), mesh=mesh, shard=0).sum(axis=0)
            same(C.redistribute(shard=(0, None)), x.astype(dtype).sum(axis=0, dtype=C.dtype),
                 exact=False)
        X = mwrt.dist_send(x, mesh=mesh, shard=0)
        with mwrt.graph(X=X) as g:  # the node lines' collective and the GPU lines' moves
            Y = (X * 2).sum(axis=0).redistribute(shard=(0, 1))
        g.replay()
        same(Y, (x * 2).sum(axis=0), exact=False)
        parts = mwrt.reduce_scatter([s for s in P.shards() if s.get_device() == 1])
        assert [(p.get_node(), p.get_device()) for p in parts] == [(0, 1), (1, 1)]
        local = [np.asarray(s.numpy()) for s in P.shards()]
        for part, expected in zip(parts, np.array_split(local[1] + local[3], 2)):
            same(part, expected, exact=False)
    finally:
        mwrt.shutdown()


@pytest.fixture
def three(monkeypatch):
    yield from quick_to_notice_losses(monkeypatch, 3)


@pytest.mark.slow  # kills a node of its own daemons
def test_a_dead_node_is_named(three):
    mesh = mwrt.mesh()
    x = data(12, 4)
    P = mwrt.dist_send(x, mesh=mesh, shard=0).sum(axis=0)
    same(P.redistribute(shard=0), x.sum(axis=0), exact=False)  # done before the kill
    three.local[1].process.send_signal(signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        mwrt.synchronize(1)  # until the master hears (at once, or 3 s without heartbeats)
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        P.redistribute(shard=0)  # refused before any survivor is left waiting in it
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        mwrt.reduce_scatter(P.shards())
    assert time.monotonic() - start < 60
    survivors = mwrt.mesh(nodes=[0, 2])  # their streams hold no error: a mesh of them works
    Q = mwrt.dist_send(x, mesh=survivors, shard=0).sum(axis=0)
    same(Q.redistribute(shard=0), x.sum(axis=0), exact=False)
