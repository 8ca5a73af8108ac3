"""Ops that users write on mesh tensors and that once had no placement rule: each runs with
NumPy's value, by a local plan where there is one and otherwise on operands the workers
redistribute (a PlacementWarning once per call site; MWRT_STRICT_PLACEMENT=1 raises)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tests.mesh.test_mesh import data, four, same, strict  # noqa: F401 - four: the module's fixture
from tests.mesh.test_mesh_plans_moves import planned, square  # noqa: F401 - a fixture

import mwrt
from mwrt import Partial, Replicate, Shard

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=[2, 3])
def m(four, request):
    """A 1-D mesh of 2 or 3 nodes."""
    return mwrt.mesh(nodes=list(range(request.param)))


def told(fn):
    """fn()'s result and the PlacementWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, mwrt.PlacementWarning)]


# -- the default: redistribute, and say so once per call site ------------------------------

def test_an_op_without_a_plan_runs_and_warns_once_per_call_site(four):
    m = mwrt.mesh(nodes=[0, 1, 2])  # once: the call site below is told once in a session
    x, y = data(6, 4, 5), data(6, 5, 3, seed=1)  # np.kron has no local plan
    X2, Y0 = mwrt.dist_send(x, mesh=m, shard=2), mwrt.dist_send(y, mesh=m, shard=0)

    def three_times():
        return [np.kron(X2, Y0) for _ in range(3)]
    results, warned = told(three_times)
    assert len(warned) == 1
    text = str(warned[0].message)
    assert "Shard(2) and Shard(0)" in text and "bytes" in text and "worker to worker" in text
    assert "replicate them first" in text and "MWRT_STRICT_PLACEMENT=1" in text
    assert warned[0].filename == __file__
    for r in results:
        same(r, np.kron(x, y), exact=False)
    _, again = told(three_times)
    assert again == []  # the same call site: told already


def test_kron_of_a_sharded_and_a_whole_operand_keeps_the_shards(m, square):
    """np.kron(A, B), A sharded along one axis, B replicated or a master array: each place's
    kron of its block is a run of the result's axis (a run per row of B where B is the
    sharded one), moved to the result's blocks; it ran on replicated copies with a
    PlacementWarning."""
    for x, y, shard in [(data(5, 3), data(2, 4, seed=1), 0), (data(5, 3), data(3, 2, seed=1), 1),
                        (data(4, 3, 2), data(3, 2, seed=1), 2), (data(7), data(2, 3), 0),
                        (data(2, 3), data(2, 2, 3, seed=1), 0), (data(0, 3), data(2, 2), 0)]:
        for mesh, placed in [(m, shard), (square, (shard, shard)), (square, (None, shard))]:
            X = mwrt.dist_send(x, mesh=mesh, shard=placed)
            for Y in (mwrt.dist_send(y, mesh=mesh), y):
                got = planned(lambda: np.kron(X, Y))
                same(got, np.kron(x, y), exact=False)
                assert Shard(shard + got.ndim - x.ndim) in got.placements
                got = planned(lambda: np.kron(Y, X))  # the sharded one on the right
                same(got, np.kron(y, x), exact=False)
                assert Shard(shard + got.ndim - x.ndim) in got.placements


def test_einsum_whose_operands_agree_on_a_sharded_letter_runs_at_each_place(m, square):
    """np.einsum with operands sharded on one subscript letter per mesh dimension (the
    others replicated along it, cut to each place's block where they hold the letter) runs
    on each place's blocks: a letter kept gives a result
    sharded there, a letter summed a Partial sum; it ran on replicated copies with a
    PlacementWarning. Operands sharded on different letters still do (the warning)."""
    a, b, c = data(5, 4), data(4, 3, seed=1), data(5, 4, seed=2)
    cases = [("ij,jk->ik", a, 0, b, None, Shard(0)), ("ij,jk->ik", a, 1, b, 0, Partial()),
             ("ij,ij->i", a, 0, c, 0, Shard(0)), ("ij,ij->j", a, 0, c, 0, Partial()),
             ("ij,jk->ki", a, 0, b, None, Shard(1)), ("ij,kj->ijk", a, None, b.T, 0,
                                                      Shard(2)),
             ("ij,jk->ik", a, None, b, 0, Partial()), ("ij,ij->i", a, None, c, 0, Shard(0)),
             ("ij,jk->ik", a, 1, b, None, Partial())]
    for subscripts, x, sx, y, sy, placed in cases:
        X, Y = mwrt.dist_send(x, mesh=m, shard=sx), mwrt.dist_send(y, mesh=m, shard=sy)
        got = planned(lambda: np.einsum(subscripts, X, Y))
        assert got.placements == (placed,)
        same(got, np.einsum(subscripts, x, y), exact=False)
    X, Y = mwrt.dist_send(a, mesh=square, shard=(0, None)), mwrt.dist_send(b, mesh=square,
                                                                          shard=(None, 1))
    got = planned(lambda: np.einsum("ij,jk->ik", X, Y))
    assert got.placements == (Shard(0), Shard(1))
    same(got, a @ b, exact=False)
    same(planned(lambda: np.einsum("ij,jk->ik", X, b)), a @ b, exact=False)
    same(planned(lambda: np.einsum("ij,jk->ik", a, Y)), a @ b, exact=False)  # a cut
    Y = mwrt.dist_send(b, mesh=square, shard=(0, 0))  # j split by both dimensions
    same(planned(lambda: np.einsum("ij,jk->ik", a, Y)), a @ b, exact=False)
    X, Y = mwrt.dist_send(a, mesh=m, shard=0), mwrt.dist_send(b, mesh=m, shard=1)
    with strict(), pytest.raises(mwrt.PlacementError):
        np.einsum("ij,jk->ik", X, Y)  # i and k along one dimension: no plan


def test_the_strict_setting_raises_instead(m):
    X0, X2 = mwrt.dist_send(data(6, 4), mesh=m, shard=0), mwrt.dist_send(data(6, 4, 5), mesh=m,
                                                                          shard=2)
    with strict(), pytest.raises(mwrt.PlacementError, match="replicate them first"):
        np.kron(X2, mwrt.dist_send(data(6, 5, 3), mesh=m, shard=0))
    with strict(), pytest.raises(mwrt.PlacementError, match="median"):
        np.median(X0, axis=0, overwrite_input=True)


def test_operands_sharded_on_different_axes_are_exchanged_to_the_first(m, square):
    """X0 + X1, X0 *= X1, and their kind on a 2-D mesh: the other operand is exchanged to
    the first's (the target's) blocks, each place receiving only its block (all-to-all),
    and the result is placed as the first; they ran on replicated copies of the other
    operand, with a PlacementWarning."""
    x, y = data(6, 4), data(6, 4, seed=1)
    for mesh, sx, sy in [(m, 0, 1), (m, 1, 0), (square, (0, 1), (1, 0)),
                         (square, (0, None), (None, 0)), (square, (0, 0), (1, 1))]:
        X, Y = mwrt.dist_send(x, mesh=mesh, shard=sx), mwrt.dist_send(y, mesh=mesh, shard=sy)
        got = planned(lambda: X - Y)
        assert got.placements == X.placements
        same(got, x - y)
        same(planned(lambda: np.maximum(Y, X)), np.maximum(y, x))
        V = mwrt.dist_send(y[0], mesh=mesh, shard=0)  # along the result's axis 1
        same(planned(lambda: X * V), x * y[0])
        planned(lambda: X.__imul__(Y))
        assert X.placements == mwrt.dist_send(x, mesh=mesh, shard=sx).placements
        same(X, x * y, exact=False)
        same(Y, y)


def test_in_place_ops_without_a_plan_write_into_their_target(m):
    x, y = data(6, 4), data(6, 4, seed=1)
    X0, X1 = mwrt.dist_send(x, mesh=m, shard=0), mwrt.dist_send(y, mesh=m, shard=1)
    R = mwrt.dist_send(x, mesh=m)
    told(lambda: R.__iadd__(X0))
    assert R.placement == Replicate()
    same(R, x + x)
    told(lambda: X0.__imul__(X1))
    assert X0.placement == Shard(0)
    same(X0, x * y, exact=False)
    V = mwrt.dist_send(np.arange(4, dtype=np.float32), mesh=m, shard=0)
    told(lambda: X0.__setitem__(slice(1, 5), V))
    expected = x * y
    expected[1:5] = np.arange(4)
    assert X0.placement == Shard(0)
    same(X0, expected, exact=False)


def test_an_in_place_op_on_a_partial_target_with_a_sharded_operand(m, square):
    """P += X0 with P a Partial sum: P is made real (its all_reduce) and X0 all_gathered to
    it, worker to worker, then the op runs at every place; it ran on replicated copies (a
    PlacementWarning) as the target's placements and the operand's did not agree."""
    for mesh, shard in [(m, 0), (square, (0, None)), (square, (0, 1))]:
        for shape, other in [((4, 3), (4, 3)), ((4, 3), (3,)), ((4, 3), (4, 1)), ((1,), (1,)),
                             ((2, 0), (2, 0))]:
            parts = np.arange(mesh.size * np.prod(shape), dtype=np.int32).reshape(
                (mesh.size,) + shape)
            o = np.arange(np.prod(other), dtype=np.int32).reshape(other) + 1
            for op in ("__iadd__", "__isub__", "__imul__"):
                P = mwrt.dist_send(parts, mesh=mesh, shard=0).sum(axis=0)
                X = mwrt.dist_send(o, mesh=mesh, shard=shard if len(other) > 1 else 0)
                planned(lambda: getattr(P, op)(X))
                assert set(P.placements) == {Replicate()}
                same(P, getattr(parts.sum(axis=0), op)(o))
                same(X, o)


ISSUE_OPS = {  # what users hit, as the issue counted it: each now NumPy's value
    "cumsum along the sharded axis": lambda a: a.cumsum(axis=0),
    "sort along it": lambda a: np.sort(a, axis=0),
    "argsort along it": lambda a: np.argsort(a, axis=0),
    "std along it": lambda a: a.std(axis=0),
    "var with ddof": lambda a: a.var(axis=0, ddof=1),
    "argmax along it": lambda a: a.argmax(axis=0),
    "argmin of the whole": lambda a: np.argmin(a),
    "reshape merging it": lambda a: a.reshape(-1),
    "flatten": lambda a: a.flatten(),
    "ravel": lambda a: a.ravel(),
    "concatenate along it": lambda a: np.concatenate([a, a * 2]),
    "a slice along it": lambda a: a[2:5],
    "a stepped slice along it": lambda a: a[::-2],
    "an int list along it": lambda a: a[[4, 0, 0]],
    "a mask along it": lambda a: a[np.array([True, False, True, True, False, True, False])],
    "a norm along another axis": lambda a: np.linalg.norm(a, axis=1),
}


@pytest.mark.parametrize("what", ISSUE_OPS)
def test_what_users_hit_runs_with_numpys_value(m, what):
    x = data(7, 3)
    X = mwrt.dist_send(x, mesh=m, shard=0)
    got, _ = told(lambda: ISSUE_OPS[what](X))
    same(got, ISSUE_OPS[what](x), exact=False)
    same(X, x)  # the operand is as it was


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_, np.complex128])
def test_var_std_argmax_argmin_over_a_sharded_axis_take_two_phases(m, dtype):
    x = (np.random.default_rng(3).standard_normal((7, 3)) * 4).astype(dtype)
    if dtype == np.float64:
        x[4, 1] = x[5, 2] = np.nan  # the first NaN is the extreme, as NumPy's
    calls = [("var", {"axis": 0}), ("std", {"axis": 0, "ddof": 1}), ("var", {}),
             ("std", {"axis": (0, 1), "keepdims": True})]
    if dtype != np.complex128:
        calls += [("argmax", {"axis": 0}), ("argmin", {"axis": 0, "keepdims": True}),
                  ("argmax", {"axis": 1})]
    for shard in (0, 1):
        X = mwrt.dist_send(x, mesh=m, shard=shard)
        for name, kwargs in calls:
            got, warned = told(lambda: getattr(X, name)(**kwargs))
            assert warned == []  # a local plan: no block moves
            same(got, getattr(x, name)(**kwargs), exact=name.startswith("arg"))


def test_a_slice_along_the_sharded_axis_stays_sharded_with_even_blocks(m):
    x = np.arange(1000.0).reshape(1000, 1)
    A = mwrt.dist_send(x, mesh=m, shard=0)
    got, warned = told(lambda: A[10:500])
    assert warned == [] and got.placement == Shard(0)
    assert [s.shape[0] for s in got.shards()] == [len(p) for p in np.array_split(x[10:500],
                                                                                    m.size)]
    same(got, x[10:500])
    for index in (np.s_[1::3], np.s_[990:], np.s_[4:4], np.s_[::7, :], np.s_[-3:]):
        got, warned = told(lambda: A[index])
        assert warned == [] and got.placement == Shard(0)
        same(got, x[index])
    B = mwrt.dist_send(x.reshape(10, 100), mesh=m, shard=1)
    same(B[:, 5:77:2], x.reshape(10, 100)[:, 5:77:2])
    got = A[2:5]
    A += 1  # a copy, not a view: NumPy's would change
    same(got, x[2:5])


def test_matmul_of_stacks_keeps_the_batch_shards(m):
    rng = np.random.default_rng(4)
    a, b, one = rng.standard_normal((5, 4, 3)), rng.standard_normal((5, 3, 2)), \
        rng.standard_normal((1, 3, 2))
    c = rng.standard_normal((2, 5, 4, 3))
    for x, sx, y, sy, axis in [(a, 0, b, 0, 0), (a, 0, b[0], None, 0), (a, 0, one, None, 0),
                               (a, None, b, 0, 0), (a, 0, b, None, 0), (c, 1, b, 0, 1),
                               (c, 0, b, None, 0), (a, 0, b[0, :, 0], None, 0)]:
        X, Y = mwrt.dist_send(x, mesh=m, shard=sx), mwrt.dist_send(y, mesh=m, shard=sy)
        got, warned = told(lambda: X @ Y)
        assert warned == [] and got.placement == Shard(axis)
        same(got, x @ y, exact=False)


def test_matmul_of_stacks_sharded_on_the_contraction_and_a_batch_axis(m):
    """Shard(2) @ Shard(0) (the left's contracted axis, the right's batch axis) and its kind:
    the operand that moves fewer bytes is exchanged to pair with the other (an all-to-all,
    worker to worker): the left to the right's batch shards, or the right to the left's
    contracted axis (a local product, then a Partial sum), a Partial's all_reduce counted.
    They ran on replicated copies (a PlacementWarning); a sharded batch axis of length 1
    (broadcast) left some places with no block of it (a ValueError)."""
    rng = np.random.default_rng(8)
    partial = mwrt.Partial("sum")
    for sa, sx, sb, sy, placed in [((6, 4, 5), 2, (6, 5, 3), 0, Shard(0)),
                                   ((2, 3, 40), 2, (2, 40, 2), 0, partial),
                                   ((6, 4, 5), 0, (6, 5, 3), 1, Shard(0)),
                                   ((2, 6, 4, 5), 3, (6, 5, 3), 0, Shard(1)),
                                   ((5,), 0, (6, 5, 3), 0, Shard(0)),
                                   ((6, 4, 5), 2, (5,), 0, partial),
                                   ((6, 4, 5), 0, (1, 5, 3), 0, Shard(0)),
                                   ((6, 4, 5), None, (1, 5, 3), 0, Replicate())]:
        x, y = rng.integers(-4, 5, sa).astype(np.float64), rng.integers(-4, 5, sb)
        X, Y = mwrt.dist_send(x, mesh=m, shard=sx), mwrt.dist_send(y, mesh=m, shard=sy)
        got = planned(lambda: X @ Y)
        assert got.placement == placed
        same(got, x @ y)
        same(X, x)
        same(Y, y)


def test_matmul_of_stacks_on_a_2d_mesh_pairs_nested_batch_shards(square):
    """A batch axis sharded along both dimensions of a 2x2 mesh in one operand, and along
    one of them in the other, held other blocks of it: the places multiplied blocks that do
    not match (a ValueError where NumPy runs); now the other is exchanged to the first's."""
    rng = np.random.default_rng(9)
    a, b, c = rng.standard_normal((6, 4, 5)), rng.standard_normal((6, 5, 3)), \
        rng.standard_normal((2, 6, 4, 5))
    for x, sx, y, sy in [(a, (None, 0), b, (0, None)), (a, (0, 0), b, (None, 0)),
                         (a, (0, None), b, (0, 0)), (c, (None, 1), b, (0, 0)),
                         (c, (1, 1), b, (None, 0)), (a, (2, 0), b[:1], (None, 0)),
                         (a, (0, 2), b, (1, 0))]:
        X, Y = mwrt.dist_send(x, mesh=square, shard=sx), mwrt.dist_send(y, mesh=square,
                                                                        shard=sy)
        same(planned(lambda: X @ Y), x @ y, exact=False)
        same(planned(lambda: np.matmul(Y.swapaxes(-1, -2), X.swapaxes(-1, -2))),
             np.matmul(y.swapaxes(-1, -2), x.swapaxes(-1, -2)), exact=False)


def test_dot_of_stacks_places_its_result_by_its_own_axes(m, square):
    """np.dot of stacks contracts the left's last axis with the right's second-to-last and
    has no batch axes ((6, 4, 5) . (6, 5, 3) is (6, 4, 6, 3)): matmul's rules placed it,
    which raised where NumPy runs, or gave another value. Now the left's kept axes lead,
    then the right's, the contracted axes give a Partial sum, and operands sharded both on
    kept axes have the smaller replicated first."""
    rng = np.random.default_rng(10)
    pairs = [((6, 4, 5), (6, 5, 3)), ((4, 5), (6, 5, 3)), ((2, 3, 4, 5), (6, 5, 3)),
             ((6, 4, 5), (5, 3)), ((5,), (6, 5, 3))]
    for sa, sb in pairs:
        x, y = rng.integers(-4, 5, sa), rng.integers(-4, 5, sb).astype(np.float64)
        for sx in [None, *range(len(sa))]:
            for sy in [None, *range(len(sb))]:
                X, Y = mwrt.dist_send(x, mesh=m, shard=sx), mwrt.dist_send(y, mesh=m, shard=sy)
                same(planned(lambda: np.dot(X, Y)), np.dot(x, y))
    x, y = rng.integers(-4, 5, (6, 4, 5)), rng.standard_normal((6, 5, 3))
    for sx, sy in [((0, 1), None), (None, (0, 2)), ((2, 2), (1, 1)), ((0, 2), (1, None)),
                   ((0, 0), (0, 0)), ((1, None), (None, 2))]:
        X, Y = mwrt.dist_send(x, mesh=square, shard=sx), mwrt.dist_send(y, mesh=square,
                                                                        shard=sy)
        same(planned(lambda: np.dot(X, Y)), np.dot(x, y), exact=False)


def test_matmul_with_the_contracted_axis_sharded_on_one_side_is_partial(m):
    """Shard(1) @ Replicate, Replicate @ Shard(0), a sharded vector at either side: each
    place cuts the replicated operand to the other's block of the contracted axis, and the
    result is a Partial sum; all ran on replicated copies (a PlacementWarning)."""
    rng = np.random.default_rng(6)
    a, b, v, w = rng.standard_normal((4, 5)), rng.standard_normal((5, 3)), \
        rng.standard_normal(5), rng.integers(-3, 4, (3, 2, 5))
    for x, sx, y, sy in [(a, 1, b, None), (a, None, b, 0), (v, 0, b, None), (a, None, v, 0),
                         (v, 0, v, None), (w, 2, w[0].T.copy(), None),
                         (a > 0, 1, b > 0, None), (a[:, :1], 1, b[:1], None)]:
        X, Y = mwrt.dist_send(x, mesh=m, shard=sx), mwrt.dist_send(y, mesh=m, shard=sy)
        for op in (np.matmul, np.dot):
            got, warned = told(lambda: op(X, Y))
            assert warned == []
            assert got.placement == mwrt.Partial("sum") or x.shape[-1] == 1
            same(got, op(x, y), exact=x.dtype.kind != "f")
        same(X, x)
        same(Y, y)


def test_matmul_cutting_the_contraction_on_a_2d_mesh(square):
    a, b = data(4, 6), data(6, 3, seed=1)
    for sa, sb in [((1, 1), None), ((1, None), (None, 1)), (None, (0, 0)), ((0, 1), None)]:
        A, B = mwrt.dist_send(a, mesh=square, shard=sa), mwrt.dist_send(b, mesh=square, shard=sb)
        got, warned = told(lambda: A @ B)
        assert warned == []
        same(got, a @ b, exact=False)


def test_argmin_and_argmax_with_no_axis_take_two_phases(m):
    """Of the flattened tensor: they ran on replicated copies (a PlacementWarning)."""
    x = (np.random.default_rng(7).integers(-5, 5, (7, 3))).astype(np.float64)
    x[5, 1] = np.nan
    for v, shard in [(x, 0), (x, 1), (x[:, 0], 0), (x[:4, :1], 1), (x[:2] > 0, 0)]:
        X = mwrt.dist_send(v, mesh=m, shard=shard)
        for name in ("argmin", "argmax"):
            for kwargs in ({}, {"keepdims": True}):
                got, warned = told(lambda: getattr(np, name)(X, **kwargs))
                assert warned == []
                same(got, getattr(np, name)(v, **kwargs))


def test_matmul_outside_its_rules_keeps_the_left_placement(m):
    a, b = data(6, 5), data(5, 3, seed=1)
    A0, B1 = mwrt.dist_send(a, mesh=m, shard=0), mwrt.dist_send(b, mesh=m, shard=1)
    got, _ = told(lambda: A0 @ B1)  # B replicated: Shard(0) @ Replicate
    assert got.placement == Shard(0)
    same(got, a @ b, exact=False)


def test_a_function_that_writes_its_argument_stays_an_error(m):
    X0 = mwrt.dist_send(data(6, 4), mesh=m, shard=0)
    with pytest.raises(mwrt.PlacementError, match="replicate"):
        np.fill_diagonal(X0, 0.0)


def test_sort_of_a_0d_mesh_tensor(m):
    """argsort(axis=-1) of a 0-d tensor (a full reduction's result) divided by its ndim."""
    X = mwrt.dist_send(data(5, 2), mesh=m, shard=0)
    v = X.var()
    same(np.argsort(v, axis=-1), np.argsort(X.numpy().var(), axis=-1))
    same(np.sort(X, axis=None), np.sort(X.numpy(), axis=None))


def test_a_reduction_of_a_0d_mesh_tensor_takes_axis_minus_1(m):
    """NumPy reduces a 0-d array over axis 0 or -1; the mesh rule normalized it against
    ndim 0 (AxisError)."""
    X = mwrt.dist_send(data(5, 2), mesh=m, shard=0)
    v, x = X.sum(), X.numpy().sum()
    for name in ("any", "sum", "max"):  # NumPy refuses mean(axis=-1) of a 0-d array
        same(getattr(v, name)(axis=-1), getattr(x, name)(axis=-1), exact=False)
