"""Sorting along a sharded axis by local plans: np.argsort of any kind and np.median
keep to sorting.py's merge-split between neighbours (median then takes the middle elements
where they lie), with no PlacementWarning, no wait of the master on a worker, and NumPy's
value, dtype and shape. Both ran on replicated copies before."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tests.mesh.test_mesh import four, same, strict  # noqa: F401 - four: the module's fixture
from tests.mesh.test_mesh_plans_moves import m, planned, square  # noqa: F401 - fixtures

import mwrt
from mwrt import Replicate, Shard

pytestmark = pytest.mark.timeout(120)

DTYPES = [np.bool_, np.int8, np.uint8, np.int64, np.float32, np.float64, np.complex128]


def ties(shape, dtype, seed=3):
    """Values with many ties (and NaNs among floats): where a stable order shows."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(dtype)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.integers(0, 2, shape)
    if np.dtype(dtype).kind == "f" and x.size > 4:
        x.flat[[1, x.size - 2]] = np.nan
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_stable_argsort_along_the_sharded_axis_stays_sharded(m, dtype):
    x = ties((11, 3), dtype)
    for rows in (11, 4, 1, 0):
        v = x[:rows]
        X = mwrt.dist_send(v, mesh=m, shard=0)
        for kind in ("stable", "mergesort"):
            got = planned(lambda: np.argsort(X, axis=0, kind=kind))
            assert got.placement == Shard(0)
            same(got, np.argsort(v, axis=0, kind=kind))
    X1 = mwrt.dist_send(x.T.copy(), mesh=m, shard=1)
    same(planned(lambda: X1.argsort(kind="stable")), x.T.argsort(kind="stable"))
    same(planned(lambda: np.argsort(X1, axis=None, kind="stable")),
         np.argsort(x.T, axis=None, kind="stable"))


def sorts(indices, x, axis):
    """True if `indices` along `axis` are a permutation of each fibre that sorts x's values
    (NaN last, equal to NaN): what NumPy promises of its default kind, whose order of ties
    is its vectorized sort's."""
    got = np.asarray(indices)
    if got.shape != x.shape or got.dtype != np.intp:
        return False
    order = np.sort(got, axis=axis)
    spans = np.arange(x.shape[axis]).reshape((-1,) + (1,) * (x.ndim - 1 - axis % x.ndim))
    return np.array_equal(order, np.broadcast_to(spans, x.shape)) and np.array_equal(
        np.take_along_axis(x, got, axis), np.sort(x, axis=axis), equal_nan=x.dtype.kind in "fc")


@pytest.mark.parametrize("dtype", DTYPES)
def test_argsort_of_the_default_kind_along_the_sharded_axis_stays_sharded(m, dtype):
    """np.argsort(X, axis) of NumPy's default kind (quicksort, heapsort: not stable) takes the
    stable plan, where it ran on replicated copies with a PlacementWarning (9 of 12 such
    steps at seeds 1 and 2 of the mesh differential): NumPy's indices without ties, and
    with them indices that sort, ties in the order of their positions (NumPy's own order of
    ties is its vectorized sort's, which differs by CPU)."""
    x = ties((11, 3), dtype)
    distinct = np.random.default_rng(5).permutation(33).astype(dtype).reshape(11, 3) \
        if dtype != np.bool_ else x[:1]
    for v in (x, x[:4], x[:1], x[:0], distinct):
        X = mwrt.dist_send(v, mesh=m, shard=0)
        for kind in (None, "quicksort", "heapsort"):
            got = planned(lambda: np.argsort(X, axis=0, kind=kind))
            assert got.placement == Shard(0) and got.shape == v.shape and got.dtype == np.intp
            assert sorts(got.numpy(), v, 0)
            same(got, np.argsort(v, axis=0, kind="stable"))  # ties by position
            if v is distinct:
                same(got, np.argsort(v, axis=0, kind=kind))  # no ties: NumPy's own
    X1 = mwrt.dist_send(x.T.copy(), mesh=m, shard=1)
    same(planned(lambda: X1.argsort()), x.T.argsort(kind="stable"))
    same(planned(lambda: np.argsort(X1, axis=None)), np.argsort(x.T, axis=None, kind="stable"))


def test_a_stable_argsort_on_a_2d_mesh_and_of_three_dimensions(m, square):
    x = ties((4, 9, 2), np.float64)
    for mesh, shard, axis in [(m, 1, 1), (square, (1, None), 1), (square, (0, 1), 1),
                              (square, (None, 2), -1)]:
        X = mwrt.dist_send(x, mesh=mesh, shard=shard)
        same(planned(lambda: np.argsort(X, axis=axis, kind="stable")),
             np.argsort(x, axis=axis, kind="stable"))
        same(planned(lambda: np.sort(X, axis=axis)), np.sort(x, axis=axis))


@pytest.mark.parametrize("dtype", DTYPES)
def test_median_along_the_sharded_axis_takes_the_middle_of_the_sorted_axis(m, dtype):
    x = ties((7, 4), dtype)
    for rows in (7, 6, 2, 1):
        v = x[:rows]
        X = mwrt.dist_send(v, mesh=m, shard=0)
        for kwargs in ({"axis": 0}, {"axis": 0, "keepdims": True}, {}, {"keepdims": True},
                       {"axis": (0, 1)}):
            got = planned(lambda: np.median(X, **kwargs))
            same(got, np.median(v, **kwargs))
        assert planned(lambda: np.median(X, axis=0)).placement == Replicate()
    X1 = mwrt.dist_send(x, mesh=m, shard=1)
    same(planned(lambda: np.median(X1, axis=-1)), np.median(x, axis=-1))
    same(planned(lambda: X1.median(axis=1)), np.median(x, axis=1))


def test_median_of_a_tensor_sharded_on_two_axes_flattens_it_first(square):
    """np.median with no axis of a tensor whose blocks are not runs of its C order (two axes
    sharded, or one by both mesh dimensions out of order): the reshape's plan moves them
    first (an all-to-all), then the sort's; it ran on replicated copies (a warning)."""
    x = ties((4, 3, 2), np.float64)
    for shard in [(1, 2), (0, 1), (2, 0), (1, 1), (None, 2)]:
        X = mwrt.dist_send(x, mesh=square, shard=shard)
        for kwargs in ({}, {"keepdims": True}, {"axis": (0, 1, 2)}):
            same(planned(lambda: np.median(X, **kwargs)), np.median(x, **kwargs))


def test_sort_and_argsort_of_the_whole_of_a_tensor_sharded_on_two_axes(square):
    """np.sort and np.argsort with axis=None of a tensor whose blocks are not runs of its C
    order: flattened by the reshape's plan, then sorted by the merges; they ran on
    replicated copies with a PlacementWarning (the mesh differential, seed 1: argsort of a
    (2, 0) tensor placed (Shard(1), Shard(0)))."""
    for x in (ties((4, 3), np.int32), np.zeros((2, 0), np.int32), ties((3, 2, 4), np.float64)):
        for shard in [(1, 0), (0, 1), (1, None), (1, 1)]:
            X = mwrt.dist_send(x, mesh=square, shard=shard)
            same(planned(lambda: np.argsort(X, axis=None)), np.argsort(x, axis=None,
                                                                         kind="stable"))
            same(planned(lambda: np.sort(X, axis=None)), np.sort(x, axis=None))


def test_median_over_several_axes_not_all_merges_them(m, square):
    """np.median over several axes, not all, one of them sharded: the axes moved last and
    merged (the reshape's plan), then the sort's plan along the merged axis; it ran on
    replicated copies with a PlacementWarning."""
    x = ties((4, 3, 5), np.float64)
    for mesh, shard in [(m, 0), (m, 1), (m, 2), (square, (0, 1)), (square, (2, 0)),
                        (square, (None, 1))]:
        X = mwrt.dist_send(x, mesh=mesh, shard=shard)
        for kwargs in ({"axis": (0, 1)}, {"axis": (1, 2), "keepdims": True},
                       {"axis": (0, 2)}, {"axis": (-1, 0), "keepdims": True}):
            same(planned(lambda: np.median(X, **kwargs)), np.median(x, **kwargs))
    I = mwrt.dist_send(ties((5, 2, 2), np.int64), mesh=m, shard=0)
    same(planned(lambda: np.median(I, axis=(0, 2))), np.median(I.numpy(), axis=(0, 2)))


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.float32, np.complex128])
def test_median_over_an_empty_sharded_axis_is_numpys_nan_at_every_place(m, square, dtype):
    """No middle to take: each place's block holds all of the empty axis, so its own median
    is NumPy's nan (the kept axes stay sharded), with no redistribution."""
    cases = [(m, (0, 3), 0, {"axis": 0}), (m, (0, 3), 0, {}), (m, (2, 0), 1, {"axis": 1}),
             (m, (0, 3), 0, {"axis": 0, "keepdims": True}), (m, (2, 0), 1, {}),
             (square, (0, 3), (1, 0), {"axis": 0}), (square, (2, 0), (1, 1), {}),
             (square, (4, 0, 3), (0, 1), {"axis": 1})]
    for mesh, shape, shard, kwargs in cases:
        x = np.zeros(shape, dtype)
        X = mwrt.dist_send(x, mesh=mesh, shard=shard)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            got = planned(lambda: np.median(X, **kwargs))
            same(got, np.median(x, **kwargs))
    X = mwrt.dist_send(np.zeros((3, 0)), mesh=m, shard=0)
    assert planned(lambda: np.median(X, axis=1)).placement == Shard(0)  # the rows' blocks
