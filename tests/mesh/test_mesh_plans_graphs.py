"""Plans that move pieces between workers, chosen inside a graph capture: a reshape, sort,
argsort, median (over one axis or two), kron, slice and concatenate along the sharded axis, a redistribute from
one axis to another and setitem of a value sharded otherwise keep to their plans (a
capture records each move as a broadcast over the two nodes, a collective), where they
ran on replicated copies with a PlacementWarning. Every replay gives NumPy's values, after
the inputs change too."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tests.mesh.test_mesh import four, same  # noqa: F401 - four: the module's fixture
from tests.mesh.test_mesh_plans_moves import m, planned, square  # noqa: F401 - fixtures

import mwrt

pytestmark = pytest.mark.timeout(120)

OPS = {
    "reshape (7, 3) -> (21,)": (lambda X: X.reshape(-1), lambda x: x.reshape(-1)),
    "reshape (7, 3) -> (3, 7)": (lambda X: X.reshape(3, 7), lambda x: x.reshape(3, 7)),
    "sort": (lambda X: np.sort(X, axis=0), lambda x: np.sort(x, axis=0)),
    "stable argsort": (lambda X: np.argsort(X, axis=0, kind="stable"),
                       lambda x: np.argsort(x, axis=0, kind="stable")),
    "median": (lambda X: np.median(X, axis=0), lambda x: np.median(x, axis=0)),
    "slice": (lambda X: X[2:6], lambda x: x[2:6]),
    "concatenate": (lambda X: np.concatenate([X, X[1:]]), lambda x: np.concatenate([x, x[1:]])),
    "redistribute": (lambda X: X.redistribute(shard=1), lambda x: x),
    "argsort": (lambda X: np.argsort(X, axis=0), lambda x: np.argsort(x, axis=0)),
    "kron": (lambda X: np.kron(X, np.ones((2, 1))), lambda x: np.kron(x, np.ones((2, 1)))),
    "median over two axes": (lambda X: np.median(X[None], axis=(0, 1)),
                             lambda x: np.median(x[None], axis=(0, 1))),
}


def test_plans_that_move_pieces_are_captured_and_replayed(m):
    x = np.arange(21.0).reshape(7, 3)[::-1].copy()
    v = np.arange(12.0).reshape(4, 3) + 100
    X = mwrt.dist_send(x, mesh=m, shard=0)
    V = mwrt.dist_send(v, mesh=m, shard=1)
    Y = mwrt.dist_send(np.zeros((7, 3)), mesh=m, shard=0)

    def capture():
        with mwrt.graph() as g:
            outs = {name: fn(X) for name, (fn, _) in OPS.items()}
            Y[1:5] = V
        return g, outs
    g, outs = planned(capture)
    y = np.zeros((7, 3))
    for _ in range(2):
        g.replay()
        for name, (_, fn) in OPS.items():
            same(outs[name], fn(x))
        y[1:5] = v
        same(Y, y)
        X += 5  # the inputs change between replays
        V *= 2
        x, v = x + 5, v * 2
        Y[...] = X
        y = x.copy()


def test_a_captured_sort_along_both_dimensions_of_a_2d_mesh(square):
    x = np.random.default_rng(9).integers(-5, 5, (9, 2)).astype(np.float64)
    X = mwrt.dist_send(x, mesh=square, shard=(0, 0))

    def capture():
        with mwrt.graph() as g:
            out = np.sort(X, axis=0)
        return g, out
    g, out = planned(capture)
    g.replay()
    same(out, np.sort(x, axis=0))


def test_a_mask_in_a_capture_runs_on_replicated_copies_told_once(four):
    """A mask inside a graph capture has no local plan (a capture cannot wait for the
    counts): it runs on replicated copies, NumPy's values at each replay, with one PlacementWarning for its line however often it runs."""
    x = np.arange(-5.0, 7.0).reshape(4, 3)
    X = mwrt.dist_send(x, mesh=mwrt.mesh(nodes=[0, 1, 2]), shard=0)  # once: its line is told
    told = []  # once in a session
    for _ in range(3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with mwrt.graph() as g:
                Y = X[X > 0]
        told += [w for w in caught if issubclass(w.category, mwrt.PlacementWarning)]
        for _ in range(2):
            g.replay()
            same(Y, x[x > 0])
    assert len(told) == 1 and "getitem" in str(told[0].message)
    assert told[0].filename == __file__


def test_a_masked_result_on_a_mesh_takes_each_replays_shape(four):
    """A mask's count may change between replays: the mesh handle's shape follows, and a
    read before the first replay is refused by name."""
    x = np.arange(6.0)
    mesh = mwrt.mesh(nodes=[0, 1])
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    mask = np.array([True, False, True, True, False, False])
    M = mwrt.dist_send(mask, mesh=mesh, shard=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mwrt.PlacementWarning)
        with mwrt.graph() as g:
            Z = X[M]
    with pytest.raises(mwrt.MwrtError, match="before the graph's first replay"):
        Z.numpy()
    g.replay()
    same(Z, x[mask])
    M[1] = True
    mask[1] = True
    g.replay()
    same(Z, x[mask])
