"""The worker's pool of warm receive buffers (mwrt.worker.pool), alone and under dist_send."""

from __future__ import annotations

import gc
import glob
import os

import numpy as np
import pytest

import mwrt
from mwrt.worker.pool import ReceivePool
from mwrt.worker.quotas import TensorTable

MIB = 1 << 20


def _address(array) -> int:
    return array.__array_interface__["data"][0]


def test_a_freed_array_returns_its_buffer_and_the_next_receive_of_that_size_reuses_it():
    pool = ReceivePool(limit=8 * MIB, min_bytes=MIB)
    a = pool.empty((MIB // 4,), np.float32)
    where = _address(a)
    a[:] = 3
    del a
    assert pool.stats()["pool_bytes"] == MIB
    b = pool.empty((512, 512), np.int32)  # another shape and dtype, the same byte count
    assert _address(b) == where and b.shape == (512, 512) and b.dtype == np.int32
    assert b.flags.c_contiguous and b.flags.writeable
    assert pool.stats() == {"pool_bytes": 0, "pool_buffers": 0, "pool_reused": 1,
                            "pool_made": 1}


def test_a_buffer_comes_back_only_when_its_last_view_is_gone():
    pool = ReceivePool(limit=8 * MIB, min_bytes=MIB)
    a = pool.empty((MIB,), np.uint8)
    views = [a[10:].reshape(-1, 2)[::3], a.view(np.int16), np.asarray(a), a.T]
    del a
    gc.collect()
    assert pool.stats()["pool_bytes"] == 0  # still readable through the views
    views[0][0, 0] = 7
    fresh = pool.empty((MIB,), np.uint8)
    assert _address(fresh) != _address(views[1])  # never handed out twice
    del views
    assert pool.stats()["pool_buffers"] == 1


def test_the_pool_is_bounded_and_drops_the_oldest_sizes_first():
    pool = ReceivePool(limit=3 * MIB, min_bytes=MIB)
    arrays = [pool.empty((n * MIB,), np.uint8) for n in (1, 2, 1)]
    del arrays
    stats = pool.stats()
    assert stats["pool_bytes"] <= 3 * MIB
    too_big = pool.empty((4 * MIB,), np.uint8)  # larger than the whole bound: never kept
    del too_big
    assert pool.stats()["pool_bytes"] <= 3 * MIB


def test_small_receives_and_a_zero_bound_bypass_the_pool():
    pool = ReceivePool(limit=8 * MIB, min_bytes=MIB)
    small = pool.empty((MIB // 2 - 1,), np.uint8)  # odd size below the threshold
    assert small.base is None  # a plain array: no lease
    off = ReceivePool(limit=0, min_bytes=1)
    big = off.empty((MIB,), np.uint8)
    del small, big
    assert pool.stats()["pool_made"] == 0 and off.stats()["pool_bytes"] == 0


def test_pooled_buffers_count_in_the_session_quota():
    table = TensorTable(0)
    table.max_bytes = 3 * MIB  # the session's MWRT_SESSION_BYTES, small
    pool = ReceivePool(table, limit=64 * MIB, min_bytes=MIB)
    table[1] = np.zeros(2 * MIB, np.uint8)  # held tensors leave 1 MiB of room
    a, b = pool.empty((MIB,), np.uint8), pool.empty((MIB,), np.uint8)
    del a, b
    assert pool.stats()["pool_bytes"] == MIB  # the second would break the quota: let go
    table[2] = np.zeros(MIB // 2, np.uint8)
    pool.trim()
    assert pool.stats()["pool_bytes"] == 0


def test_a_receive_lets_go_of_buffers_the_grown_session_no_longer_leaves_room_for():
    table = TensorTable(0)
    table.max_bytes = 4 * MIB
    pool = ReceivePool(table, limit=64 * MIB, min_bytes=MIB)
    table[1] = np.zeros(MIB, np.uint8)
    a = pool.empty((MIB,), np.uint8)
    del a
    assert pool.stats()["pool_bytes"] == MIB
    table[2] = np.zeros(5 * MIB // 2, np.uint8)  # half a MiB of room left
    b = pool.empty((2 * MIB,), np.uint8)  # another size: the 1 MiB buffer goes, unused
    assert pool.stats()["pool_bytes"] == 0 and pool.stats()["pool_reused"] == 0
    del b


def test_a_closed_pool_keeps_nothing_and_live_arrays_stay_valid():
    pool = ReceivePool(limit=8 * MIB, min_bytes=MIB)
    a, b = pool.empty((MIB,), np.uint8), pool.empty((MIB,), np.uint8)
    del a
    pool.close()
    b[:] = 5
    assert b.sum() == 5 * MIB
    del b
    assert pool.stats()["pool_bytes"] == 0


@pytest.fixture(scope="module")
def shm_cluster():
    """Two local workers over the shm channel, with small slots to reach many chunks."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MWRT_CHANNEL", "shm")
    mp.setenv("MWRT_SHM_SLOT_BYTES", str(64 << 10))
    mp.setenv("MWRT_SHM_SLOTS", "3")
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=2, timeout=30)
    pids = [row["worker"]["pid"] for row in mwrt.status()] + [os.getpid()]
    yield mwrt
    mwrt.shutdown()
    mp.undo()
    for pid in pids:  # the workers stopped and left nothing (other users' files aside)
        assert glob.glob(f"/dev/shm/mwrt-{pid}-*") == []


CHUNK = 64 << 10


@pytest.mark.parametrize("nbytes", [CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 7,
                                    MIB - 1, MIB, MIB + 1, 5 * MIB + 3])
def test_sizes_around_chunk_boundaries_survive_a_round_trip(shm_cluster, nbytes):
    array = np.random.randint(0, 255, nbytes, dtype=np.uint8)
    t = mwrt.dist_send(array, node=1)
    np.testing.assert_array_equal(t.numpy(), array)
    np.testing.assert_array_equal((t + 1).numpy(), array + np.uint8(1))
    moved = t.to(node=0)
    np.testing.assert_array_equal(moved.numpy(), array)


def test_repeated_dist_sends_reuse_the_freed_buffers(shm_cluster):
    before = mwrt.memory_stats(0)
    for i in range(6):
        t = mwrt.dist_send(np.full(MIB // 4, i, np.float32), node=0)
        assert t.numpy()[-1] == i
        del t
        mwrt.synchronize()
    after = mwrt.memory_stats(0)
    assert after["pool_reused"] - before["pool_reused"] >= 3
    assert after["pool_made"] - before["pool_made"] <= 3
    assert after["pool_bytes"] <= before["pool_bytes"] + MIB


def test_a_view_tensor_of_a_freed_receive_keeps_its_values(shm_cluster):
    t = mwrt.dist_send(np.arange(MIB // 4, dtype=np.float32), node=0)
    view = mwrt.remote(lambda a: a.reshape(512, -1)[1:], spec=((511, 512), np.float32))(t)
    del t
    mwrt.synchronize()
    for i in range(3):  # receives of the same size: none may take the view's buffer
        mwrt.dist_send(np.full(MIB // 4, -1, np.float32), node=0).numpy()
    np.testing.assert_array_equal(view.numpy(), np.arange(512, MIB // 4).reshape(511, 512))
