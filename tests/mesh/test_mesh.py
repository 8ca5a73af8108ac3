"""Meshes and sharded tensors against NumPy on the whole array: every placement rule, uneven
shards, meshes of 1-4 nodes and 2-D meshes, redistribution both ways, Partial resolved on
read and on combine, the error for an op without a rule, graphs over meshes."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import mwrt
from mwrt import Partial, Replicate, Shard
from tests.support.daemons import shared_session

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def four():
    """Four local worker daemons for the module (and the next, if it asks)."""
    yield from shared_session(4)


@pytest.fixture(params=[1, 2, 3, 4])
def m(four, request):
    """A 1-D mesh of the first 1, 2, 3 or 4 nodes."""
    return mwrt.mesh(nodes=list(range(request.param)))


def same(t, expected, exact=True):
    """t (a ShardedTensor) holds `expected`: value, dtype and shape, handle and copy."""
    got = t.numpy()
    expected = np.asarray(expected)
    assert (t.shape, t.dtype) == (expected.shape, expected.dtype)
    assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
    if exact:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@contextlib.contextmanager
def strict():
    """MWRT_STRICT_PLACEMENT=1 inside the block: an op with no local plan raises."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MWRT_STRICT_PLACEMENT", "1")
        yield


def data(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# -- placing -------------------------------------------------------------------------------

def test_one_handle_class_holds_one_place_and_a_mesh(four):
    """A mesh tensor is a DistributedTensor (ShardedTensor is its other name), and every
    handle has .shards(), .placement and .mesh: one place is a one-place mesh."""
    X = mwrt.dist_send(np.arange(12.0).reshape(4, 3), mesh=mwrt.mesh(nodes=[0, 1]), shard=0)
    assert isinstance(X, mwrt.DistributedTensor) and mwrt.ShardedTensor is mwrt.DistributedTensor
    assert all(isinstance(b, mwrt.DistributedTensor) for b in X.shards())
    assert [b.get_node() for b in X.shards()] == [0, 1] and X.placement == Shard(0)
    with pytest.raises(TypeError, match="shards"):
        X.get_node()
    x = mwrt.dist_send(np.arange(3.0), node=1)
    assert x.shards() == [x] and x.placement == Replicate() and x.placements == (Replicate(),)
    assert x.mesh.places == ((1, -1),) and x.replicate() is x
    with pytest.raises(mwrt.PlacementError, match="mesh tensor meets"):
        x + X.shards()[1] + X
    np.testing.assert_array_equal((X.sum(axis=0) + 1).numpy(), [19.0, 23.0, 27.0])


def test_dist_send_splits_as_array_split(m):
    x = data(11, 3)
    for axis in (0, 1):
        t = mwrt.dist_send(x, mesh=m, shard=axis)
        assert t.placement == Shard(axis) and t.mesh is m
        parts = np.array_split(x, m.size, axis=axis)
        assert [s.shape for s in t.shards()] == [p.shape for p in parts]
        assert [s.get_node() for s in t.shards()] == [n for n, _ in m.places]
        for shard, part in zip(t.shards(), parts):
            np.testing.assert_array_equal(shard.numpy(), part)
        same(t, x)
    r = mwrt.dist_send(x, mesh=m)
    assert r.placement == Replicate()
    assert all(s.shape == x.shape for s in r.shards())
    same(r, x)


def test_large_replicated_send_is_broadcast_between_workers(m):
    x = data(300, 256)  # above the inline limit: one send, then a broadcast
    r = mwrt.dist_send(x, mesh=m)
    for s in r.shards():
        np.testing.assert_array_equal(s.numpy(), x)
    same(mwrt.dist_send(x, mesh=m, shard=0), x)


def test_constructors_take_mesh_and_shard(m):
    same(mwrt.zeros(7, 2, mesh=m, shard=0), np.zeros((7, 2), np.float32))
    same(mwrt.ones(3, 5, mesh=m, shard=1, dtype=np.int64), np.ones((3, 5), np.int64))
    same(mwrt.full((5,), 2.5, mesh=m, shard=0), np.full(5, 2.5, np.float32))
    same(mwrt.arange(13, mesh=m, shard=0), np.arange(13))
    same(mwrt.arange(0.0, 1.0, 0.1, mesh=m, shard=0), np.arange(0.0, 1.0, 0.1), exact=False)
    r = mwrt.rand(4, 3, mesh=m)  # replicated: the same samples at every place
    values = [s.numpy() for s in r.shards()]
    assert all(np.array_equal(v, values[0]) for v in values)
    with m:
        t = mwrt.ones(6, shard=0)
        d = mwrt.dist_send(np.arange(6))
    assert t.placement == Shard(0) and d.placement == Replicate()
    one = mwrt.ones(3)  # outside the block: on one node again
    assert type(one) is mwrt.DistributedTensor


# -- elementwise ---------------------------------------------------------------------------

def test_elementwise_runs_shard_by_shard(m):
    x, y = data(9, 4), data(9, 4, seed=1)
    X, Y = mwrt.dist_send(x, mesh=m, shard=0), mwrt.dist_send(y, mesh=m, shard=0)
    same(X + Y, x + y)
    same(X * 2 - Y / 3, x * 2 - y / 3)
    same(np.exp(X), np.exp(x), exact=False)
    same(np.maximum(X, Y), np.maximum(x, y))
    same(X > Y, x > y)
    same(-X, -x)
    same(X.astype(np.float64), x.astype(np.float64))
    same(X.clip(-0.5, 0.5), x.clip(-0.5, 0.5))
    same(np.where(X > 0, X, Y), np.where(x > 0, x, y))
    same(2 ** abs(X).astype(np.int32), 2 ** abs(x).astype(np.int32))


def test_replicated_operand_joins_sharded(m):
    x, row, col = data(9, 4), data(4, seed=2), data(9, 1, seed=3)
    X = mwrt.dist_send(x, mesh=m, shard=0)
    same(X + mwrt.dist_send(row, mesh=m), x + row)  # broadcast along the unsharded axis
    same(X * mwrt.dist_send(col, mesh=m), x * col)  # sliced along the sharded axis
    same(mwrt.dist_send(x, mesh=m) - X, x - x)
    X1 = mwrt.dist_send(x, mesh=m, shard=1)
    same(X1 + mwrt.dist_send(row, mesh=m), x + row)  # sliced: row spans the sharded axis


def test_in_place_ops(m):
    x, y = data(10, 3), data(10, 3, seed=1)
    X, Y = mwrt.dist_send(x, mesh=m, shard=0), mwrt.dist_send(y, mesh=m, shard=0)
    X += Y
    X *= 2
    np.multiply(X, 0.5, out=X)
    X += mwrt.dist_send(y[0], mesh=m)
    same(X, ((x + y) * 2) * 0.5 + y[0])
    X.fill_(3)
    same(X, np.full_like(x, 3))
    R = mwrt.dist_send(y, mesh=m)
    with strict():
        R += X  # a replicated target takes X whole at every place (gathered)
    same(R, y + 3)


# -- reductions ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod"])
def test_reductions_over_sharded_and_unsharded_axes(m, name):
    x = data(10, 3) * 0.5 + 1
    X = mwrt.dist_send(x, mesh=m, shard=0)
    f = getattr(np, name)
    whole = getattr(X, name)()
    assert whole.placement == Partial({"mean": "sum"}.get(name, name))
    same(whole, f(x), exact=False)
    same(getattr(X, name)(axis=0), f(x, axis=0), exact=False)
    same(getattr(X, name)(axis=0, keepdims=True), f(x, axis=0, keepdims=True), exact=False)
    across = getattr(X, name)(axis=1)
    assert across.placement == Shard(0)
    same(across, f(x, axis=1), exact=False)
    same(getattr(X, name)(axis=1, keepdims=True), f(x, axis=1, keepdims=True), exact=False)


def test_reduction_dtypes_and_other_shapes(m):
    i = np.arange(24, dtype=np.int32).reshape(4, 6)
    I = mwrt.dist_send(i, mesh=m, shard=1)
    same(I.sum(), i.sum())
    same(I.mean(), i.mean(), exact=False)  # a sum of partial sums: rounding may differ
    same(I.mean(axis=1), i.mean(axis=1), exact=False)
    same(I.sum(axis=0), i.sum(axis=0))
    b = i % 3 == 0
    B = mwrt.dist_send(b, mesh=m, shard=1)
    same(B.any(axis=1), b.any(axis=1))
    same(B.all(), b.all())
    same(np.sum(I, axis=1), np.sum(i, axis=1))
    x = data(2, 5, 6)
    X = mwrt.dist_send(x, mesh=m, shard=1)
    same(X.sum(axis=(0, 2)), x.sum(axis=(0, 2)), exact=False)
    assert X.sum(axis=(0, 2)).placement == Shard(0)
    same(X.argmax(axis=2), x.argmax(axis=2))


# -- matmul --------------------------------------------------------------------------------

def test_matmul_rules(m):
    a, b, v = data(7, 5), data(5, 6, seed=1), data(5, seed=2)
    A0, A1 = mwrt.dist_send(a, mesh=m, shard=0), mwrt.dist_send(a, mesh=m, shard=1)
    B0, B1 = mwrt.dist_send(b, mesh=m, shard=0), mwrt.dist_send(b, mesh=m, shard=1)
    AR, BR = mwrt.dist_send(a, mesh=m), mwrt.dist_send(b, mesh=m)
    V, V0 = mwrt.dist_send(v, mesh=m), mwrt.dist_send(v, mesh=m, shard=0)
    for got, placement, expected in [
            (A0 @ BR, Shard(0), a @ b), (AR @ B1, Shard(1), a @ b),
            (A1 @ B0, Partial("sum"), a @ b), (AR @ BR, Replicate(), a @ b),
            (A0 @ V, Shard(0), a @ v), (A1 @ V0, Partial("sum"), a @ v),
            (V0 @ B0, Partial("sum"), v @ b), (V @ B1, Shard(0), v @ b),
            (A0 @ B1, Shard(0), a @ b)]:  # the smaller, B, replicated first
        assert got.placement == placement
        same(got, expected, exact=False)
    s2, s0 = data(3, 7, 5), data(3, 5, 6)
    S2, S0 = mwrt.dist_send(s2, mesh=m, shard=2), mwrt.dist_send(s0, mesh=m, shard=0)
    with strict():  # the contracted axis and a batch axis: one exchanged to pair (products.py)
        same(S2 @ S0, s2 @ s0, exact=False)


# -- Partial -------------------------------------------------------------------------------

def test_partial_resolved_on_read_and_on_combine(m):
    x, y = data(12, 4), data(12, seed=1)
    X, Y = mwrt.dist_send(x, mesh=m, shard=0), mwrt.dist_send(y, mesh=m, shard=0)
    w = mwrt.zeros(4, mesh=m)
    err = X @ w - Y
    grad = 2 * X.T @ err / 12
    assert grad.placement == Partial("sum")  # scalar multiples stay Partial
    step = 0.1 * grad
    w -= step  # combined: an all_reduce first
    assert step.placement == Replicate() and grad.placement == Partial("sum")
    expected_w = -0.1 * (2 * x.T @ (x @ np.zeros(4, np.float32) - y) / 12)
    same(w, expected_w, exact=False)
    loss = (err ** 2).mean()
    assert loss.placement == Partial("sum")
    assert loss.item() == pytest.approx(float(np.mean(y ** 2)), rel=1e-5)  # read
    total = X.sum(axis=0)
    same(total + 1, x.sum(axis=0) + 1, exact=False)  # a scalar add resolves first
    p = X.sum(axis=0)
    assert p.reduce() is p and p.placement == Replicate()
    for s in p.shards():  # every place holds the sum
        np.testing.assert_allclose(s.numpy(), x.sum(axis=0), rtol=1e-5)


# -- redistribution ------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(10, 7), (3, 2), (5, 9, 2)])
def test_redistribute_both_ways(m, shape):
    x = data(*shape)
    for src in range(len(shape)):
        X = mwrt.dist_send(x, mesh=m, shard=src)
        for dst in range(len(shape)):
            Y = X.redistribute(shard=dst)
            assert Y.placement == Shard(dst)
            assert [s.shape for s in Y.shards()] == \
                [p.shape for p in np.array_split(x, m.size, axis=dst)]
            same(Y, x)
        R = X.replicate()
        assert R.placement == Replicate()
        for s in R.shards():
            np.testing.assert_array_equal(s.numpy(), x)
        same(R.redistribute(Shard(src)), x)
    P = mwrt.dist_send(x, mesh=m, shard=0).sum(axis=0)
    same(P.redistribute(shard=0), x.sum(axis=0), exact=False)


def test_redistribute_copies(m):
    x = data(6, 2)
    R = mwrt.dist_send(x, mesh=m)
    S = R.redistribute(shard=0)
    S += 1  # a new tensor: the replicated one is untouched
    same(R, x)
    same(S, x + 1)


# -- shapes, indexing, functions -----------------------------------------------------------

def test_shape_ops_follow_the_sharded_axis(m):
    x = data(6, 4, 2)
    X = mwrt.dist_send(x, mesh=m, shard=1)
    assert X.T.placement == Shard(1)
    same(X.T, x.T)
    same(X.transpose(1, 0, 2), x.transpose(1, 0, 2))
    assert X.swapaxes(0, 1).placement == Shard(0)
    same(X.swapaxes(0, 1), x.swapaxes(0, 1))
    same(np.moveaxis(X, 1, 2), np.moveaxis(x, 1, 2))
    same(X.expand_dims(0), x[None])
    same(X.reshape(6, 4, 2, 1).squeeze(3), x)
    same(X.reshape(6, 4, 1, 2), x.reshape(6, 4, 1, 2))
    with strict():  # axis 0 sharded first, then the rows regrouped: no replicate
        flat = X.reshape(-1)
    assert flat.placement == Shard(0)
    same(flat, x.reshape(-1))
    with strict(), pytest.raises(mwrt.PlacementError, match="replicate"):
        X.reshape(-1, order="F")


def test_indexing_along_and_across_the_sharded_axis(m):
    x = data(9, 5)
    X = mwrt.dist_send(x, mesh=m, shard=0)
    assert X[:, 2].placement == Shard(0)
    same(X[:, 2], x[:, 2])
    same(X[..., 1:4], x[..., 1:4])
    same(X[:, None, 0], x[:, None, 0])
    for i in (0, 4, 8, -1):
        row = X[i]  # along: taken where it lies, broadcast from there
        assert row.placement == Replicate()
        same(row, x[i])
    same(X[-2, 3], x[-2, 3])
    if m.size > 1:
        assert X[2:5].placement == Shard(0)  # the selected rows moved to even blocks
    same(X.replicate()[2:5], x[2:5])
    X[:, 1] = 0.0
    X[4] = 7.0
    X[1:8:3, 2] = -1.0
    x[:, 1], x[4], x[1:8:3, 2] = 0.0, 7.0, -1.0
    same(X, x)


def test_remote_and_numpy_functions(m):
    x = data(8, 3)
    X = mwrt.dist_send(x, mesh=m, shard=0)
    doubled = mwrt.remote(lambda a: a * 2 + 1)(X)
    assert doubled.placement == Shard(0)
    same(doubled, x * 2 + 1)
    R = mwrt.dist_send(x, mesh=m)
    same(np.linalg.norm(R, axis=1), np.linalg.norm(x, axis=1), exact=False)
    same(np.sum(X, axis=0), x.sum(axis=0), exact=False)
    assert np.shape(X) == x.shape
    with strict(), pytest.raises(mwrt.PlacementError, match="replicate"):
        np.linalg.norm(X, axis=1) if m.size > 1 else (_ for _ in ()).throw(
            mwrt.PlacementError("replicate"))


def test_no_rule_is_an_error_naming_placements_and_fix(m, monkeypatch):
    if m.size == 1:
        pytest.skip("one place: every placement agrees")
    monkeypatch.setenv("MWRT_STRICT_PLACEMENT", "1")
    X0 = mwrt.dist_send(data(4, 4), mesh=m, shard=0)
    S2, S0 = mwrt.dist_send(data(3, 4, 5), mesh=m, shard=2), mwrt.dist_send(data(3, 5, 2),
                                                                          mesh=m, shard=0)
    with pytest.raises(mwrt.PlacementError) as info:
        np.kron(S2, S0)
    text = str(info.value)
    assert "Shard(2)" in text and "Shard(0)" in text and "replicate them first" in text
    with pytest.raises(mwrt.PlacementError, match="median.*replicate"):
        np.median(X0, axis=0, overwrite_input=True)
    with pytest.raises(mwrt.PlacementError, match="one node"):
        X0 + mwrt.ones(4, 4)
    with pytest.raises(mwrt.PlacementError, match="one node"):
        mwrt.ones(4, 4) + X0


# -- 2-D meshes ----------------------------------------------------------------------------

def test_two_dimensional_mesh(four):
    mesh = mwrt.mesh({"dp": 2, "tp": 2})
    assert mesh.shape == (2, 2) and mesh.dim_names == ("dp", "tp")
    assert mesh.groups(mesh.dim("tp")) == [[0, 1], [2, 3]]
    x = data(10, 6)
    flat = mwrt.dist_send(x, mesh=mesh, shard=0)  # split over all four places, dp outermost
    assert flat.placements == (Shard(0), Shard(0))
    assert [s.shape[0] for s in flat.shards()] == [3, 2, 3, 2]  # 10 -> 5, 5 -> 3, 2 (DTensor's)
    same(flat, x)
    both = mwrt.dist_send(x, mesh=mesh, shard=(0, 1))
    assert [s.shape for s in both.shards()] == [(5, 3)] * 4
    same(both, x)
    same(both * 2 + 1, x * 2 + 1)
    half = mwrt.dist_send(x, mesh=mesh, shard=(0, None))
    same(half + both, x + x)
    s = both.sum(axis=1)
    assert s.placements == (Shard(0), Partial("sum"))
    same(s, x.sum(axis=1), exact=False)
    same(both.sum(), x.sum(), exact=False)
    for target in [(1, None), (None, 0), (1, 0), None, 0]:
        same(both.redistribute(shard=target), x)
    w = data(6, 4, seed=1)
    W = mwrt.dist_send(w, mesh=mesh, shard=(None, 0))
    out = half @ W.redistribute(shard=(None, 0)).redistribute(Replicate(), Replicate())
    same(out, x @ w, exact=False)
    part = mwrt.dist_send(x, mesh=mesh, shard=(0, 1)) @ W
    assert part.placements == (Shard(0), Partial("sum"))
    same(part, x @ w, exact=False)


# -- graphs --------------------------------------------------------------------------------

def test_graph_over_a_mesh(four):
    mesh = mwrt.mesh()
    x, y = data(16, 4), data(16, seed=1)
    X, Y = mwrt.dist_send(x, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
    w = mwrt.zeros(4, mesh=mesh)
    with mwrt.graph() as g:
        err = X @ w - Y
        grad = 2 * X.T @ err / 16
        w -= 0.1 * grad
        loss = (err ** 2).mean()
        loss.reduce()
    ref = np.zeros(4, np.float32)
    for _ in range(3):
        g.replay()
        e = x @ ref - y
        ref = ref - 0.1 * (2 * x.T @ e / 16)
        assert float(loss) == pytest.approx(float(np.mean(e ** 2)), rel=1e-4)
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-4, atol=1e-6)


# -- streams, profiles ---------------------------------------------------------------------

def test_streams_and_profiles_hold_for_mesh_tensors(four):
    import contextlib

    mesh = mwrt.mesh(nodes=[0, 1, 2])
    x = data(30, 4)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    side = [mwrt.Stream(node=n) for n, _ in mesh.places]
    with contextlib.ExitStack() as stack:
        for s in side:  # every place's ops go to its side stream
            stack.enter_context(mwrt.stream(s))
        Y = np.exp(X) * 2  # ordered after X's making on the default streams
        X += 1  # a write on the side streams
    Z = Y + X  # back on the default streams: ordered after the side streams' writes
    same(Z, np.exp(x) * 2 + (x + 1), exact=False)
    with mwrt.profile() as prof:
        (X * 3).sum().item()
    table = prof.table()
    assert "multiply" in table and "sum" in table


def test_more_places_than_rows(four):
    mesh = mwrt.mesh()
    x = data(3, 2)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)  # one place holds no row
    assert [s.shape[0] for s in X.shards()] == [1, 1, 1, 0]
    for name in ("sum", "mean", "max", "min", "prod"):
        same(getattr(X, name)(axis=0), getattr(np, name)(x, axis=0), exact=False)
    i = np.arange(3, dtype=np.int64)
    same(mwrt.dist_send(i, mesh=mesh, shard=0).max(), i.max())
    same(X.redistribute(shard=1), x)
    same(X @ mwrt.dist_send(x.T, mesh=mesh), x @ x.T, exact=False)


def test_master_arrays_join_mesh_ops(m):
    x, y, row = data(9, 4), data(9, 4, seed=1), data(4, seed=2)
    X = mwrt.dist_send(x, mesh=m, shard=0)
    same(X + y, x + y)  # cut into each place's block on the master
    same(X * row, x * row)  # broadcast: sent whole
    same(y - X, y - x)
    X += y
    same(X, x + y)


def test_graph_inputs_on_a_mesh_are_rebound(four):
    mesh = mwrt.mesh()
    x, x2 = data(10, 3), data(10, 3, seed=5)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    with mwrt.graph(X=X) as g:
        total = (X * 2).sum(axis=0)
        total.reduce()
    g.replay()
    same(total, (x * 2).sum(axis=0), exact=False)
    g.replay(X=mwrt.dist_send(x2, mesh=mesh, shard=0))
    same(total, (x2 * 2).sum(axis=0), exact=False)
    with pytest.raises(ValueError, match="like the captured input"):
        g.replay(X=mwrt.dist_send(x2[:4], mesh=mesh, shard=0))


def test_redistribute_inside_a_graph_gathers(four):
    mesh = mwrt.mesh()
    x = data(10, 6)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    with mwrt.graph() as g:  # the pairwise exchange moves between nodes: the gather instead
        Y = X.redistribute(shard=1)
    g.replay()
    assert Y.placement == Shard(1)
    same(Y, x)


def test_concatenate_and_stack_along_an_unsharded_axis(m):
    x, y = data(7, 3), data(7, 2, seed=1)
    X, Y = mwrt.dist_send(x, mesh=m, shard=0), mwrt.dist_send(y, mesh=m, shard=0)
    joined = np.concatenate([X, Y], axis=1)
    assert joined.placement == Shard(0)
    same(joined, np.concatenate([x, y], axis=1))
    stacked = np.stack([X, X * 2], axis=0)
    assert stacked.placement == Shard(1)
    same(stacked, np.stack([x, x * 2], axis=0))
    same(np.stack([X, X], axis=-1), np.stack([x, x], axis=-1))
    same(np.concatenate([X.replicate(), X.replicate()]), np.concatenate([x, x]))
    with strict():  # along the sharded axis: each place receives its block's rows
        joined = np.concatenate([X, X])
    assert joined.placement == Shard(0)
    same(joined, np.concatenate([x, x]))


def test_an_operand_numpy_takes_no_array_of_is_pythons_type_error_on_a_mesh(m):
    # As on one place (tests/ops/test_tensor_ops.py): NotImplemented, then Python's own
    # TypeError; lists go as NumPy takes them, == of None is an array of False.
    a = np.arange(8.0)
    t = mwrt.dist_send(a, mesh=m)
    for other in (object(), None, {}):
        kind = type(other).__name__
        with pytest.raises(TypeError, match=rf"for \+: 'DistributedTensor' and '{kind}'"):
            t + other
        with pytest.raises(TypeError, match=rf"for \*: '{kind}' and 'DistributedTensor'"):
            other * t
    same(t + [1.0] * 8, a + 1.0)
    same(t == None, a == None)  # noqa: E711 - NumPy's elementwise comparison
