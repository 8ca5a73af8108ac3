"""Mesh programs that gave wrong values, failed where NumPy runs, or hung: each as NumPy
writes it, every result compared with NumPy (value, dtype, shape of handle and copy)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.mesh.test_mesh import four, same  # noqa: F401 - four: the module's fixture

import mwrt
from mwrt import Partial, Replicate, Shard
from mwrt.master.tensor import Element

pytestmark = pytest.mark.timeout(120)

x12 = np.arange(12.).reshape(4, 3)


@pytest.fixture
def X(four):
    """The 4 x 3 tensor of the issue, row-sharded on nodes 0 and 1."""
    return mwrt.dist_send(x12, mesh=mwrt.mesh(nodes=[0, 1]), shard=0)


def test_a_0d_array_sent_onto_a_mesh_stays_0d(four):
    mesh = mwrt.mesh(nodes=[0, 1])
    t = mwrt.dist_send(np.array(2.5), mesh=mesh)
    same(t, np.array(2.5))
    same(t + 1, np.array(3.5))
    same(mwrt.dist_send(np.array(3, np.int32), mesh=mesh) * 2, np.array(6, np.int32))
    same(t.contiguous(), np.array(2.5))  # torch's contiguous() keeps the shape
    one = mwrt.dist_send(np.array(2.5), node=0).contiguous()
    assert one.shape == one.numpy().shape == ()


def _reshape(p):
    return p.reshape(3, 1)


def test_a_scalars_methods_on_a_mesh_give_scalars_as_on_one_place(X):
    """X.sum().astype(bool) is a scalar as NumPy's is: `v += 0` makes an int64, where it
    raised mwrt's in-place cast error; a scalar's reshape(()) and .T are new values."""
    host = x12.sum()
    for fn in (lambda s: s.astype(np.bool_), lambda s: s.copy(), lambda s: s.reshape(()),
               lambda s: s.T, lambda s: s[()]):
        expected, got = fn(host), fn(X.sum())
        assert isinstance(got, Element), got
        expected += 0
        got += 0
        same(got, expected)
    kept = X.sum()
    view = kept.reshape(())
    view += 1
    assert float(kept) == host and float(view) == host + 1
    assert type(np.copy(kept)).__name__ == "DistributedTensor"  # an array, as NumPy's


@pytest.mark.parametrize("view", [lambda p: p[None], _reshape,
                                  lambda p: p.T, lambda p: p[0:], lambda p: p[None][:, 1:]],
                         ids=["newaxis", "reshape", "T", "slice", "view of a view"])
def test_views_of_a_partial_tensor_share_its_all_reduce(X, view):
    p = X.sum(axis=0)
    v = view(p)
    assert p.placements == (Partial("sum"),) or view is _reshape  # may copy: made real first
    assert v.placements == p.placements
    same(p, x12.sum(axis=0))  # the base first
    same(v, view(x12.sum(axis=0)))
    same(p, x12.sum(axis=0))
    q = X.sum(axis=0)
    w = view(q)
    same(w, view(x12.sum(axis=0)))  # the view first
    same(q, x12.sum(axis=0))
    same(view(X.sum(axis=0)) * 2.0, view(x12.sum(axis=0)) * 2.0)  # a view stays Partial


def test_a_write_through_a_partial_view_resolves_the_base_once(X):
    p = X.sum(axis=0)
    v = p[None]
    v += 1.0  # not linear: the parts are combined first, through the base
    same(p, x12.sum(axis=0) + 1)
    same(v, x12.sum(axis=0)[None] + 1)


def test_a_partial_result_of_a_graph_is_partial_after_every_replay(X):
    with mwrt.graph() as g:
        p = X.sum(axis=0)
        v = p[None]
    for _ in range(3):
        g.replay()
        same(p, x12.sum(axis=0))
        same(v, x12.sum(axis=0)[None])
    w = p[:, None]  # made of a real p: Partial again after the next replay
    g.replay()
    assert w.placements == (Partial("sum"),)
    same(w, x12.sum(axis=0)[:, None])


def test_a_partial_made_before_a_graph_is_combined_once(X):
    p = X.sum(axis=0)
    r = X.sum(axis=0)
    with mwrt.graph() as g:
        q = p + 1
        r += 1  # in place: r is made real before the graph, the graph adds 1
    for n in range(1, 4):
        g.replay()
        same(q, x12.sum(axis=0) + 1)
        same(r, x12.sum(axis=0) + n)
    same(p, x12.sum(axis=0))


def test_cumsum_along_an_unsharded_axis_keeps_the_shards(four):
    mesh = mwrt.mesh(nodes=[0, 1])
    Y = mwrt.dist_send(x12, mesh=mesh, shard=1)
    c = Y.cumsum(axis=0)
    assert c.placements == (Shard(1),)
    same(c, x12.cumsum(axis=0))
    same(mwrt.dist_send(x12, mesh=mesh, shard=0).cumprod(axis=1), x12.cumprod(axis=1))


def test_mean_over_an_empty_sharded_axis_is_nan(four):
    mesh = mwrt.mesh(nodes=[0, 1])
    z = np.zeros((0, 3))
    Z = mwrt.dist_send(z, mesh=mesh, shard=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = z.mean(axis=0)
    with pytest.warns(RuntimeWarning) as record:  # and the workers' 0 / 0, as NumPy's
        got = Z.mean(axis=0)
        same(got, expected)
    assert "Mean of empty slice." in [str(w.message) for w in record]
    i = mwrt.dist_send(np.arange(6).reshape(2, 3), mesh=mesh, shard=0)
    same(i.mean(axis=0), np.arange(6).reshape(2, 3).mean(axis=0))  # ints: a float64 mean


@pytest.mark.parametrize("index", [(slice(None), 1), (slice(1, None), 0), (slice(None, None, 2),),
                                   (slice(None), slice(0, 2)), (Ellipsis, 2), 3, -4])
def test_setitem_of_an_array_spanning_shards(X, index):
    x = x12.copy()
    value = np.arange(x[index].size, dtype=float).reshape(x[index].shape) + 100
    x[index] = value
    X[index] = value
    same(X, x)
    first = value[:1] - 50 if value.ndim else value - 50  # broadcast along the first axis
    x[index] = first
    X[index] = first
    same(X, x)
    x[index] = X[index] = list(np.ravel(first)) if value.ndim == 1 else 7.0
    same(X, x)


@pytest.mark.parametrize("nodes", [[0, 1], [0, 1, 2, 3]])
def test_a_shard_of_a_length_one_axis_that_broadcasts(four, nodes):
    mesh = mwrt.mesh(nodes=nodes)
    one = mwrt.dist_send(np.ones((1, 3)) * 2, mesh=mesh, shard=0)
    R = mwrt.dist_send(x12, mesh=mesh)
    same(one + R, 2 + x12)
    same(R * one, x12 * 2)
    S = mwrt.dist_send(x12, mesh=mesh, shard=0)
    same(S - one, x12 - 2)
    same((S * 2).sum(), (x12 * 2).sum())  # and the session goes on


def test_a_shard_of_a_length_one_axis_on_a_2d_mesh(four):
    mesh = mwrt.mesh({"a": 2, "b": 2})
    row = np.arange(4.)[None] + 1
    x = np.arange(16.).reshape(4, 4)
    one = mwrt.dist_send(row, mesh=mesh, shard=(0, 1))  # axis 0 split where it broadcasts
    total = one + mwrt.dist_send(x, mesh=mesh, shard=(None, 1))
    assert total.placements == (Replicate(), Shard(1))
    same(total, row + x)
    same(mwrt.dist_send(x, mesh=mesh, shard=(0, None)) * one, x * row)


def test_collectives_on_strided_blocks(four):
    mesh = mwrt.mesh({"a": 2, "b": 2})
    x = np.arange(16.).reshape(4, 4)
    A = mwrt.dist_send(x, mesh=mesh, shard=(1, 1))  # each block a strided column pair
    same(A.replicate(), x)
    same(A * 2, x * 2)
    B = mwrt.dist_send(x, mesh=mesh, shard=(0, None))
    same(B.T.replicate(), x.T)
    same(B.T.sum(axis=1), x.T.sum(axis=1))


def test_an_int_index_of_a_strided_row_on_three_nodes(four):
    mesh = mwrt.mesh(nodes=[0, 1, 2])
    x = np.arange(12.).reshape(3, 2, 2)
    A = mwrt.dist_send(x, mesh=mesh, shard=0)
    same(A[0, :, 1], x[0, :, 1])
    same(A[2, 1], x[2, 1])
    same(A * 2, x * 2)


def test_a_place_that_fails_before_a_collective_fails_its_peers_at_once(four):
    """Node 1's block is read-only (a broadcast_to view): it cannot take part in an in-place
    all_reduce; the other nodes learn so at once, not after the group's timeout."""
    a = [mwrt.dist_send(np.ones(4), node=n) for n in range(3)]
    a[1] = np.broadcast_to(a[1], (4,))
    mwrt.all_reduce(a)
    with pytest.raises(mwrt.MwrtError, match="read-only"):
        a[1].numpy()
    for t in (a[0], a[2]):  # the peers' own errors, raised at their sync points
        with pytest.raises(mwrt.MwrtError, match="rank 1"):
            t.numpy()
    b = [mwrt.dist_send(np.full(4, float(n)), node=n) for n in range(3)]
    mwrt.all_reduce(b)  # the group goes on
    np.testing.assert_array_equal(b[2].numpy(), np.full(4, 3.0))


def _fails(block):
    raise ValueError("fails at every place")


def test_a_mesh_op_that_fails_at_every_place_is_raised_once(four):
    mesh = mwrt.mesh(nodes=[0, 1, 2])
    R = mwrt.dist_send(np.arange(6.), mesh=mesh)  # replicated: a read asks one place
    S = mwrt.dist_send(np.arange(6.), mesh=mesh, shard=0)  # a read asks every place
    failed = mwrt.remote(_fails)(R)
    with pytest.raises(mwrt.RemoteError, match="fails at every place"):
        failed.numpy()
    sharded = mwrt.remote(_fails, spec=((2,), np.float64))(S)  # every place's block asked
    with pytest.raises(mwrt.RemoteError, match="fails at every place"):
        sharded.numpy()
    assert not any(n.replies for n in mwrt.master.cluster.current().nodes)  # none left over
    same(S * 3, np.arange(6.) * 3)  # the other places' errors of it are not raised here
    same(R + 1, np.arange(6.) + 1)


def test_sort_of_a_0d_or_flattened_tensor(four):
    mesh = mwrt.mesh(nodes=[0, 1])
    same(np.argsort(mwrt.dist_send(np.array(3.0), mesh=mesh)), np.argsort(np.array(3.0)))
    x = np.array([[3.0, 1.0], [0.0, 2.0]])
    for fn in (np.sort, np.argsort):
        same(fn(mwrt.dist_send(x, mesh=mesh), axis=None), fn(x, axis=None))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mwrt.PlacementWarning)  # sharded: replicated
            same(fn(mwrt.dist_send(x, mesh=mesh, shard=0), axis=None), fn(x, axis=None))


@pytest.mark.parametrize("name", ["min", "max"])
def test_min_and_max_of_complex_with_an_empty_block(four, name):
    mesh = mwrt.mesh(nodes=[0, 1, 2])
    z = np.array([4 - 12j, 5 + 3j]) * (1 if name == "min" else -1)  # beyond 1 and 0 (True,
    # False: what an empty block's min and max were), on three places: one block is empty
    same(getattr(mwrt.dist_send(z, mesh=mesh, shard=0), name)(axis=0), getattr(np, name)(z))


def test_a_reduction_of_a_0d_mesh_tensor_along_axis_minus_one(four):
    T = mwrt.dist_send(np.array(3), mesh=mwrt.mesh(nodes=[0, 1]))
    for name in ("min", "sum", "max"):
        same(getattr(np, name)(T, axis=-1), getattr(np, name)(np.array(3), axis=-1))


def test_a_remembered_plan_is_not_reused_for_another_arrays_dtype_or_shape(four):
    """A mesh op's plan is remembered by its arguments' kinds: a master array's type alone
    let X * np.array(2, np.int16) reuse X * np.array(4.0)'s float64 handle (its value
    int64), and X * np.ones((2, 6)) the (6,) shape of X * np.ones(1) (the mesh
    differential, a random seed: v0 * np.array(2, np.int16))."""
    mesh = mwrt.mesh(nodes=[0, 1])
    x = np.arange(6, dtype=np.int64)
    X = mwrt.dist_send(x, mesh=mesh)
    for other in (np.array(4.0), np.array(2, np.int16), np.ones(1), np.ones((2, 6)),
                  np.ones((2, 6), np.float32)):
        same(X * other, x * other)


def test_a_remembered_plan_keeps_a_partial_by_a_finite_scalar_only(four):
    """P * 2.0 stays Partial (each place scales its part); P * inf is combined first, as
    the parts' infinities sum to nan where the whole's does not. The plan of the first was
    reused for the second (a scalar's type alone): [nan, nan], NumPy's [nan, inf]."""
    mesh = mwrt.mesh(nodes=[0, 1])
    parts = np.array([[1.0, -2.0], [-1.0, 3.0]])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        for scalar in (2.0, float("inf"), 3.0, -float("inf"), np.float64(2.0),
                       np.float64(np.inf), 2.0 + 0j, complex(np.inf, 0)):
            P = mwrt.dist_send(parts, mesh=mesh, shard=0).sum(axis=0)
            same(P * scalar, parts.sum(axis=0) * scalar)
