"""Meshes beyond one healthy host: a node of a mesh killed mid-program, a mesh of fake GPUs
(two per node: groups that share a node combine by moves between devices), and a mesh
across simulated hosts."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest
from tests.support.daemons import quick_to_notice_losses
from tests.support.hosts import hosts3  # noqa: F401  (fixture)
from tests.hosts.test_hosts_mw import keyed_workers, master_env

import mwrt
from mwrt import Partial, Shard

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def three(monkeypatch):
    yield from quick_to_notice_losses(monkeypatch, 3)


@pytest.mark.slow  # kills a node of its own daemons
def test_a_node_of_a_mesh_killed_mid_program(three):
    mesh = mwrt.mesh()
    x = np.arange(30, dtype=np.float64).reshape(10, 3)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    w = mwrt.ones(3, dtype=np.float64, mesh=mesh)
    w -= 0.01 * (X.T @ (X @ w))  # a step with its all_reduce, finished before the kill
    expected = np.ones(3) - 0.01 * (x.T @ (x @ np.ones(3)))
    np.testing.assert_allclose(w.numpy(), expected)
    y = X @ w  # held across the kill: the loss may be heard at the first op after it
    three.local[1].process.send_signal(signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        while time.monotonic() - start < 60:  # the program goes on until it hears
            X += 1  # (no collective: the survivors are never left waiting in one)
            y = X @ w
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        X.numpy()
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        y.sum()
    survivors = mwrt.mesh(nodes=[0, 2])  # a mesh of the others still works
    Y = mwrt.dist_send(x, mesh=survivors, shard=0)
    np.testing.assert_array_equal(Y.sum(axis=0).numpy(), x.sum(axis=0))


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two local workers posing as hosts with two GPUs each (mwrt's fake GPU)."""
    mwrt.shutdown()
    monkeypatch.setenv("MWRT_FAKE_GPUS", "2")
    monkeypatch.setenv("MWRT_FAKE_GPU_BYTES", str(64 << 20))
    mwrt.init_master_worker(local_workers=2, timeout=30)
    yield mwrt
    mwrt.shutdown()


def test_a_mesh_of_every_gpu(fake_gpus):
    mesh = mwrt.mesh(devices="gpu")
    assert mesh.dim_names == ("node", "gpu") and mesh.shape == (2, 2)
    assert mesh.places == ((0, 0), (0, 1), (1, 0), (1, 1))
    assert mwrt.mesh({"node": 2, "gpu": 2}) == mesh  # a "gpu" dimension: the GPUs
    x = np.random.default_rng(0).standard_normal((9, 4)).astype(np.float32)
    X = mwrt.dist_send(x, mesh=mesh, shard=0)
    assert X.is_cuda and [s.get_device() for s in X.shards()] == [0, 1, 0, 1]
    np.testing.assert_array_equal(X.numpy(), x)
    total = X.sum(axis=0)
    assert total.placements == (Partial("sum"), Partial("sum"))
    np.testing.assert_allclose(total.numpy(), x.sum(axis=0), rtol=1e-5)
    w = mwrt.ones(4, mesh=mesh)
    w -= 0.01 * (X.T @ (X @ w))  # Partial over both dimensions, combined
    ones = np.ones(4, np.float32)
    np.testing.assert_allclose(w.numpy(), ones - 0.01 * (x.T @ (x @ ones)), rtol=1e-4)
    for s in w.shards():
        np.testing.assert_allclose(s.numpy(), w.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(X.redistribute(shard=1).numpy(), x)
    np.testing.assert_array_equal(X.replicate().shards()[3].numpy(), x)
    np.testing.assert_array_equal(X[7].numpy(), x[7])
    by_gpu = mwrt.dist_send(x, mesh=mesh, shard=(None, 1))
    assert by_gpu.placements[1] == Shard(1)
    np.testing.assert_allclose((by_gpu * 2).sum().numpy(), 2 * x.sum(), rtol=1e-5)


@pytest.mark.slow  # crosses simulated hosts
def test_a_mesh_across_simulated_hosts(hosts3, tmp_path):  # noqa: F811
    keyed_workers(hosts3, tmp_path)
    res = hosts3[0].run([sys.executable, os.path.join(ROOT, "tests", "programs",
                                                      "mesh_hosts.py")],
                        env=master_env(hosts3, tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ok mesh" in res.stdout, res.stdout[-2000:]


def test_large_gpu_shards_come_to_the_master_at_once(monkeypatch):
    """Shards past the inline limit, on GPUs, in several staging chunks each: every receive
    is posted before the first shard is read, and the blocks land whole and in place."""
    mwrt.shutdown()
    monkeypatch.setenv("MWRT_FAKE_GPUS", "2")
    monkeypatch.setenv("MWRT_FAKE_GPU_BYTES", str(64 << 20))
    monkeypatch.setenv("MWRT_INLINE_BYTES", "4096")
    monkeypatch.setenv("MWRT_STAGING_CHUNK_BYTES", str(1 << 14))
    mwrt.init_master_worker(local_workers=2, timeout=30)
    try:
        mesh = mwrt.mesh(devices="gpu")
        x = np.random.default_rng(1).standard_normal((1001, 37))  # uneven, 4 chunks a shard
        X = mwrt.dist_send(x, mesh=mesh, shard=0)
        np.testing.assert_array_equal(X.numpy(), x)
        np.testing.assert_array_equal((X * 2).redistribute(shard=1).numpy(), x * 2)
        assert X.numpy().dtype == x.dtype and X.numpy().shape == x.shape
    finally:
        mwrt.shutdown()
