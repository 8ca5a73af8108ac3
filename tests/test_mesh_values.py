"""Mesh programs that gave wrong values, failed where NumPy runs, or hung: each as NumPy
writes it, every result compared with NumPy (value, dtype, shape of handle and copy)."""

from __future__ import annotations

import numpy as np
import pytest
from test_mesh import four, same  # noqa: F401 - four: the module's fixture

import mwrt

pytestmark = pytest.mark.timeout(120)

x12 = np.arange(12.).reshape(4, 3)


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
