"""Local plans for ops that move runs of a sharded axis between the workers or scan along it:
reshapes and squeezes that regroup the sharded axis, concatenate along it, cumsum and
cumprod along it (two phases), setitem of a mesh value. Each runs with no PlacementWarning
(MWRT_STRICT_PLACEMENT=1 would raise otherwise), with no wait of the master on a worker
(nothing comes to the master), and with NumPy's value, dtype and shape."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mwrt
from mwrt import Replicate, Shard
from tests.mesh.test_mesh import data, four, same, strict  # noqa: F401 - four: the module's fixture
from tests.support.daemons import waits_from_here

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=[2, 3])
def m(four, request):
    """A 1-D mesh of 2 or 3 nodes."""
    return mwrt.mesh(nodes=list(range(request.param)))


@pytest.fixture
def square(four):
    """A 2x2 mesh."""
    return mwrt.mesh({"a": 2, "b": 2})


def planned(fn):
    """fn()'s result, checked to run by a local plan: strict placement raises nothing, no
    PlacementWarning, and the master waited on no worker."""
    with strict(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        waits = waits_from_here()
        result = fn()
        assert mwrt.stats()["waits"] == waits, "the master waited on a worker"
    assert [w for w in caught if issubclass(w.category, mwrt.PlacementWarning)] == []
    return result


def arange(*shape, dtype=np.float64):
    return np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)


# -- reshapes and squeezes that regroup the sharded axis -----------------------------------

RESHAPES = [  # (shape, sharded axis, new shape, the result's sharded axis)
    ((4, 3, 2), 0, (-1,), 0), ((4, 3, 2), 0, (2, 2, 6), 0), ((4, 3, 2), 1, (2, 2, 6), 2),
    ((4, 3, 2), 1, (4, 6), 1), ((7, 3), 0, (21,), 0), ((7, 3), 0, (3, 7), 0),
    ((5,), 0, (5, 1), 0), ((6,), 0, (1, 2, 3), 1), ((1, 5), 0, (5,), 0), ((0, 3), 0, (3, 0), 0),
    ((4, 0), 0, (2, 2, 0), 0), ((3, 1), 0, (1, 3), 1),
    # no axis of the result lines up with the sharded one: another axis sharded first
    ((2, 2), 1, (4,), 0), ((4, 3), 1, (12,), 0), ((4, 3, 2), 2, (3, 8), 0),
    ((5, 3), 1, (3, 5), 0), ((2, 3, 4), 1, (4, 6), 0), ((1, 6), 1, (2, 3), 0),
    ((3, 0), 1, (0,), 0),
]


@pytest.mark.parametrize("case", RESHAPES, ids=str)
def test_a_reshape_that_regroups_the_sharded_axis_stays_sharded(m, case):
    shape, shard, new, axis = case
    x = arange(*shape)
    X = mwrt.dist_send(x, mesh=m, shard=shard)
    if axis is None:  # no axis of the result has 2 elements before it: redistributed
        with strict(), pytest.raises(mwrt.PlacementError, match="reshape"):
            X.reshape(new)
        return
    got = planned(lambda: X.reshape(new))
    assert got.placement == Shard(axis)
    same(got, x.reshape(new))
    same(X, x)
    if len(new) == 1 or new == (-1,):
        same(planned(lambda: X.flatten()), x.flatten())
        same(planned(lambda: np.ravel(X)), np.ravel(x))


def test_a_regrouped_reshape_is_a_copy_with_the_blocks_array_split_cuts(m):
    x = arange(5, 4, dtype=np.int32)
    X = mwrt.dist_send(x, mesh=m, shard=0)
    got = planned(lambda: X.reshape(-1))
    assert [b.shape for b in got.shards()] == [p.shape for p in np.array_split(x.ravel(),
                                                                              m.size)]
    X += 1  # a copy: NumPy's reshape would view it
    same(got, x.reshape(-1))


def test_squeezing_a_sharded_axis_of_length_one(m):
    for shape, shard, axis in [((4, 1, 2), 1, None), ((1, 5), 0, 0), ((1, 1), 1, None),
                               ((3, 1, 0), 1, 1)]:
        x = arange(*shape)
        X = mwrt.dist_send(x, mesh=m, shard=shard)
        got = planned(lambda: np.squeeze(X, axis=axis))
        same(got, np.squeeze(x, axis=axis))
    X = mwrt.dist_send(arange(2, 1, 3), mesh=m, shard=0)
    same(planned(lambda: X[:, :1, :2].squeeze()), arange(2, 1, 3)[:, :1, :2].squeeze())


def test_squeeze_of_a_0d_mesh_tensor_along_axis_0(m):
    """NumPy squeezes a 0-d array along axis 0 or -1; the mesh rule normalized the axis
    against ndim 0 (AxisError; 2,000 random mesh programs at seed 9 found it)."""
    v = mwrt.dist_send(arange(3), mesh=m, shard=0).std()
    for axis in (0, -1):
        same(planned(lambda: np.squeeze(v, axis)), np.squeeze(np.array(arange(3).std()), axis),
             exact=False)


def test_expand_dims_keeps_the_shard(m):
    x = arange(5, 2)
    for shard in (0, 1):
        X = mwrt.dist_send(x, mesh=m, shard=shard)
        for axis in (0, 1, -1, (0, 2)):
            same(planned(lambda: np.expand_dims(X, axis)), np.expand_dims(x, axis))


def test_a_reshape_in_order_f_keeps_its_order(m):
    """The block-by-block reshape passed its order on: each place read its block in C."""
    x = arange(4, 3, 2)
    X = mwrt.dist_send(x, mesh=m, shard=0)
    same(planned(lambda: X.reshape(4, 6, order="F")), x.reshape(4, 6, order="F"))


def test_reshapes_on_a_2d_mesh(square):
    x = arange(6, 4, 2)
    for shard, new in [((0, None), (-1,)), ((None, 1), (6, 8)), ((1, None), (3, 2, 8)),
                       ((0, None), (3, 2, 8))]:
        X = mwrt.dist_send(x, mesh=square, shard=shard)
        same(planned(lambda: X.reshape(new)), x.reshape(new))


# -- concatenate and stack -----------------------------------------------------------------

def test_concatenate_along_the_sharded_axis(m):
    a, b, c = arange(5, 2), arange(1, 2, dtype=np.int32) + 50, arange(0, 2, dtype=np.float32)
    A, B, C = (mwrt.dist_send(v, mesh=m, shard=0) for v in (a, b, c))
    R = mwrt.dist_send(b, mesh=m)  # replicated: each place cuts its own part
    for operands, values in [((A, A), (a, a)), ((A, B, C), (a, b, c)), ((B, A), (b, a)),
                             ((A, R, A), (a, b, a)), ((C, C), (c, c)), ((R, A), (b, a))]:
        got = planned(lambda: np.concatenate(operands))
        assert got.placement == Shard(0)
        assert [s.shape[0] for s in got.shards()] == [
            len(p) for p in np.array_split(np.concatenate(values), m.size)]
        same(got, np.concatenate(values))
    x = arange(3, 5)
    X1 = mwrt.dist_send(x, mesh=m, shard=1)
    same(planned(lambda: np.concatenate([X1, X1[:, :2]], axis=-1)),
         np.concatenate([x, x[:, :2]], axis=-1))


def test_concatenate_and_stack_along_another_axis_cut_a_replicated_operand(m):
    x, y = arange(5, 3), arange(5, 2, dtype=np.int64)
    X, Y = mwrt.dist_send(x, mesh=m, shard=0), mwrt.dist_send(y, mesh=m)
    got = planned(lambda: np.concatenate([X, Y, X], axis=1))
    assert got.placement == Shard(0)
    same(got, np.concatenate([x, y, x], axis=1))
    Z = mwrt.dist_send(x * 2, mesh=m)
    for axis in (0, 1, 2, -1):
        got = planned(lambda: np.stack([Z, X], axis=axis))
        same(got, np.stack([x * 2, x], axis=axis))


def test_concatenate_on_a_2d_mesh(square):
    x, y = arange(5, 4), arange(3, 4) + 100
    for shard in [(0, None), (None, 0), (0, 1), (1, 0)]:
        X, Y = (mwrt.dist_send(v, mesh=square, shard=shard) for v in (x, y))
        same(planned(lambda: np.concatenate([X, Y])), np.concatenate([x, y]))
        same(planned(lambda: np.stack([X, X], axis=1)), np.stack([x, x], axis=1))


def test_concatenate_along_an_axis_sharded_by_both_dimensions_of_a_2d_mesh(square):
    """(Shard(0), Shard(0)) operands, a replicated one among them: runs move along the line
    of four places to the result's nested blocks (it ran on replicated copies, with a
    PlacementWarning: 12 of 83 such steps in 2,000 random mesh programs at seed 1)."""
    for rows, more in [(5, 4), (1, 2), (0, 3), (6, 6)]:
        x, y = arange(rows, 2), arange(more, 2, dtype=np.int32) + 100
        X, Y = (mwrt.dist_send(v, mesh=square, shard=(0, 0)) for v in (x, y))
        R = mwrt.dist_send(y, mesh=square)
        for operands, values in [((X, Y), (x, y)), ((Y, X, R), (y, x, y)), ((R, X), (y, x))]:
            got = planned(lambda: np.concatenate(operands))
            assert got.placements == X.placements
            same(got, np.concatenate(values))


def test_concatenate_of_operands_sharded_on_different_axes_exchanges_them_first(m):
    """X1 is exchanged to X0's placements (an all-to-all), then the rows' plan runs."""
    x = arange(4, 4)
    X0, X1 = mwrt.dist_send(x, mesh=m, shard=0), mwrt.dist_send(x, mesh=m, shard=1)
    got = planned(lambda: np.concatenate([X0, X1]))
    assert got.placements == X0.placements
    same(got, np.concatenate([x, x]))


# -- cumsum and cumprod along the sharded axis ---------------------------------------------

@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int64, np.float32,
                                   np.complex128])
def test_cumsum_and_cumprod_along_the_sharded_axis_take_two_phases(m, dtype):
    x = (np.random.default_rng(1).integers(-3, 4, (7, 3)) % 3 + 1).astype(dtype)
    for shape in [(7, 3), (1, 3), (0, 3), (2, 0)]:
        v = x[:shape[0], :shape[1]]
        X = mwrt.dist_send(v, mesh=m, shard=0)
        for name in ("cumsum", "cumprod"):
            got = planned(lambda: getattr(X, name)(axis=0))
            assert got.placement == Shard(0)
            same(got, getattr(v, name)(axis=0), exact=v.dtype.kind != "f")
    V = mwrt.dist_send(x[:, 0], mesh=m, shard=0)
    same(planned(lambda: np.cumsum(V)), np.cumsum(x[:, 0]), exact=False)
    if x.dtype.kind != "c":
        same(planned(lambda: np.cumprod(V, dtype=np.float64)),
             np.cumprod(x[:, 0], dtype=np.float64), exact=False)


def test_cumsum_of_ints_wraps_as_numpys():
    x = np.array([120, 100, 90, 7, -128], np.int8)
    X = mwrt.dist_send(x, mesh=mwrt.mesh(nodes=[0, 1, 2]), shard=0)
    same(planned(lambda: X.cumsum(dtype=np.int8)), x.cumsum(dtype=np.int8))
    same(planned(lambda: X.cumprod(axis=0)), x.cumprod(axis=0))


def test_scans_on_a_2d_mesh(square):
    x = arange(5, 3) - 4
    for shard in [(0, None), (None, 0), (0, 1), (1, 0), (1, 1)]:
        X = mwrt.dist_send(x, mesh=square, shard=shard)
        for axis in (0, 1):
            same(planned(lambda: np.cumsum(X, axis=axis)), np.cumsum(x, axis=axis))
            same(planned(lambda: np.cumprod(X, axis=axis)), np.cumprod(x, axis=axis))


# -- setitem of a mesh value ---------------------------------------------------------------

def test_setitem_of_a_mesh_value_placed_as_the_target(m):
    y = arange(7, 3)
    for index, value, shard in [(np.s_[...], arange(7, 3) + 100, 0), (np.s_[:, 1], arange(7),
                                                                        0),
                                (np.s_[1:5], arange(4, 3) - 9, 0), (np.s_[::3], arange(3, 3), 0),
                                (np.s_[2:6, 0], arange(4, dtype=np.int32), 0),
                                (np.s_[5:], arange(2, 3), 0), (np.s_[3:3], arange(0, 3), 0),
                                (np.s_[1:4], arange(1, 3), 0), (np.s_[:, 1:], arange(7, 2), 0),
                                (np.s_[1:6], arange(3), None), (np.s_[2], arange(3), None)]:
        Y = mwrt.dist_send(y, mesh=m, shard=0)
        V = mwrt.dist_send(value, mesh=m, shard=shard)
        expected = y.copy()
        expected[index] = value

        def write():
            Y[index] = V
        planned(write)
        assert Y.placement == Shard(0)
        same(Y, expected)


def test_setitem_of_a_mesh_value_on_the_columns_and_on_a_2d_mesh(m, square):
    y = arange(4, 6)
    Y = mwrt.dist_send(y, mesh=m, shard=1)
    V = mwrt.dist_send(arange(4, 3) + 50, mesh=m, shard=1)
    planned(lambda: Y.__setitem__(np.s_[:, 2:5], V))
    y[:, 2:5] = arange(4, 3) + 50
    same(Y, y)
    for shard in [(0, None), (None, 1), (0, 1)]:
        y = arange(5, 4)
        Y = mwrt.dist_send(y, mesh=square, shard=shard)
        V = mwrt.dist_send(y[::-1] * 2, mesh=square, shard=shard)
        planned(lambda: Y.__setitem__(Ellipsis, V))
        same(Y, y[::-1] * 2)
    Y = mwrt.dist_send(arange(6, 4), mesh=square, shard=(0, None))
    V = mwrt.dist_send(arange(3, 4), mesh=square, shard=(0, None))
    planned(lambda: Y.__setitem__(np.s_[2:5], V))
    expected = arange(6, 4)
    expected[2:5] = arange(3, 4)
    same(Y, expected)


def test_setitem_of_a_value_sharded_otherwise_moves_only_the_value(m, square):
    """The target sharded on another axis than V: V's blocks are exchanged to the target's
    (all-to-all), each place receiving the part it writes; the target replicated: every
    place writes the whole of V, gathered there. Neither replicates the target, nor warns
    (both ran on replicated copies, with a PlacementWarning)."""
    y, v = arange(4, 6), arange(4, 6) + 100
    for shard, vshard, index, value in [
            (1, 0, np.s_[...], v), (0, 1, np.s_[...], v), (1, 0, np.s_[1:3, 2:], v[1:3, 2:]),
            (0, 1, np.s_[1:], v[1:]), (0, None, np.s_[2:], v[2:]), (None, 0, np.s_[...], v),
            (None, 0, np.s_[1:, 3], v[1:, 0]), (1, 0, np.s_[:, 1:5], v[:, :4])]:
        Y = mwrt.dist_send(y, mesh=m, shard=shard)
        V = mwrt.dist_send(value, mesh=m, shard=vshard)
        planned(lambda: Y.__setitem__(index, V))
        expected = y.copy()
        expected[index] = value
        assert Y.placement == (Replicate() if shard is None else Shard(shard))
        same(Y, expected)
        same(V, value)
    P = mwrt.dist_send(np.stack([v, v]), mesh=mwrt.mesh(nodes=[0, 1]), shard=0).sum(axis=0)
    Y = mwrt.dist_send(y, mesh=P.mesh, shard=1)  # a Partial value: summed, then exchanged
    planned(lambda: Y.__setitem__(Ellipsis, P))
    same(Y, 2 * v)
    Y = mwrt.dist_send(y, mesh=square, shard=(None, 1))
    V = mwrt.dist_send(v, mesh=square, shard=(0, 0))
    planned(lambda: Y.__setitem__(Ellipsis, V))
    same(Y, v)


def test_the_scans_and_concatenate_of_the_flattened_tensor(m):
    x, y = arange(5, 3) - 7, arange(2, 2, dtype=np.int32)
    X, Y = mwrt.dist_send(x, mesh=m, shard=0), mwrt.dist_send(y, mesh=m, shard=0)
    got = planned(lambda: np.cumsum(X))
    assert got.placement == Shard(0)
    same(got, np.cumsum(x))
    same(planned(lambda: X.cumprod(dtype=np.float32)), x.cumprod(dtype=np.float32))
    R = mwrt.dist_send(y, mesh=m)
    got = planned(lambda: np.concatenate([X, Y, R], axis=None))
    assert got.placement == Shard(0)
    same(got, np.concatenate([x, y, y], axis=None))
    X1 = mwrt.dist_send(x, mesh=m, shard=1)  # no axis of (15,) lines up: axis 0 sharded first
    got = planned(lambda: np.cumsum(X1))
    assert got.placement == Shard(0)
    same(got, np.cumsum(x))
    same(planned(lambda: np.concatenate([X1, X], axis=None)), np.concatenate([x, x], axis=None))


def test_setitem_of_a_mesh_value_with_more_axes_than_the_part_it_writes(m, square):
    """v[0] = v with v of shape (1, 3): the value's leading length-1 axis goes, as NumPy's
    (a reshape of the value, then the setitem's plan); with v sharded it ran on replicated
    copies (a PlacementWarning). Run so, the replicated target refused the mesh value."""
    x = arange(1, 3)
    for mesh, shard in [(m, 0), (m, 1), (square, (0, 0)), (square, (0, 1))]:
        V = mwrt.dist_send(x, mesh=mesh, shard=shard)
        planned(lambda: V.__setitem__(0, V))
        same(V, x)
        planned(lambda: V.__setitem__((0, slice(1, None)), V[:, :2] * 2))
        same(V, np.concatenate([x[:, :1], x[:, :2] * 2], axis=1))
    R = mwrt.dist_send(x, mesh=m)
    planned(lambda: R.__setitem__(0, R * 2))
    same(R, x * 2)


# -- sort along the sharded axis -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.float32, np.complex128])
def test_sort_along_the_sharded_axis_merges_blocks_between_neighbours(m, dtype):
    rng = np.random.default_rng(2)
    x = (rng.integers(-4, 5, (11, 3)) + 1j * rng.integers(0, 2, (11, 3))).astype(dtype) \
        if dtype == np.complex128 else rng.integers(-4, 5, (11, 3)).astype(dtype)
    if dtype == np.float32:
        x[3, 0] = x[7, 2] = np.nan  # last, as NumPy sorts them
    for rows in (11, 2, 1, 0):
        v = x[:rows]
        X = mwrt.dist_send(v, mesh=m, shard=0)
        got = planned(lambda: np.sort(X, axis=0))
        assert got.placement == Shard(0)
        assert [b.shape for b in got.shards()] == [p.shape for p in np.array_split(v, m.size)]
        same(got, np.sort(v, axis=0))
    X1 = mwrt.dist_send(x.T.copy(), mesh=m, shard=1)
    same(planned(lambda: np.sort(X1)), np.sort(x.T))
    same(planned(lambda: np.sort(X1[0], axis=None)), np.sort(x.T[0], axis=None))
    planned(lambda: X1.sort(axis=-1))  # in place
    same(X1, np.sort(x.T, axis=-1))


def test_sort_on_a_2d_mesh(square):
    x = np.random.default_rng(5).standard_normal((9, 4))
    for shard, axis in [((0, None), 0), ((None, 0), 0), ((0, 1), 0), ((1, 0), 1)]:
        X = mwrt.dist_send(x, mesh=square, shard=shard)
        same(planned(lambda: np.sort(X, axis=axis)), np.sort(x, axis=axis))



def test_a_slice_along_an_axis_sharded_by_both_dimensions_of_a_2d_mesh(square):
    """(Shard(0), Shard(0)): the slice's runs move along the line of four places to the
    result's nested blocks (it ran on replicated copies, with a PlacementWarning)."""
    for rows in (9, 6, 5, 1, 0):
        x = arange(rows, 2)
        X = mwrt.dist_send(x, mesh=square, shard=(0, 0))
        for index in (np.s_[1:], np.s_[::2], np.s_[1:4], np.s_[-3:], np.s_[2:2], np.s_[1::3, 1:]):
            got = planned(lambda: X[index])
            assert got.placements == X.placements
            same(got, x[index])


def test_sort_and_scans_of_an_axis_sharded_by_both_dimensions_of_a_2d_mesh(square):
    """(Shard(0), Shard(0)): the four blocks lie along the axis in the places' row-major
    order, one line of four; sort, stable argsort, median, cumsum and cumprod run along it
    (they ran on replicated copies, with a PlacementWarning)."""
    rng = np.random.default_rng(8)
    for rows in (9, 6, 4, 3, 1):
        x = rng.integers(-4, 5, (rows, 3)).astype(np.float64)
        for shard, axis in [((0, 0), 0), ((1, 1), 1), ((0, 0), -1)]:
            v = x if axis != 1 else x.T.copy()
            X = mwrt.dist_send(v, mesh=square, shard=shard)
            got = planned(lambda: np.sort(X, axis=axis))
            assert got.placements == X.placements
            same(got, np.sort(v, axis=axis))
            same(planned(lambda: np.argsort(X, axis=axis, kind="stable")),
                 np.argsort(v, axis=axis, kind="stable"))
            same(planned(lambda: np.median(X, axis=axis)), np.median(v, axis=axis))
            same(planned(lambda: np.cumsum(X, axis=axis)), np.cumsum(v, axis=axis))
            same(planned(lambda: X.cumprod(axis=axis)), v.cumprod(axis=axis))


def test_replicating_a_tall_unevenly_sharded_tensor(m):
    """The gather dropped its padding by an index of every row, sent inline with the op: a
    (150001,) float32 tensor's 1.2 MB index passed the workers' 1 MiB frame limit and the
    replicate was refused (WireError); now two slices."""
    x = np.arange(150_001, dtype=np.float32)
    X = mwrt.dist_send(x, mesh=m, shard=0)
    same(X.replicate(), x)
    Y = mwrt.dist_send(x.reshape(-1, 1)[:100_003], mesh=m, shard=0)
    same(Y.replicate(), x.reshape(-1, 1)[:100_003])
