"""Bulk transfers over the session's data channel, and collectives issued by the master."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from tests.support.daemons import start_worker, stop_worker

import mwrt
from mwrt.master import inplace

BIG = 1 << 18  # elements: above the inline size, so bytes take the data channel


@pytest.fixture(scope="module")
def three():
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=3, timeout=30)
    yield mwrt
    mwrt.shutdown()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.uint8, np.complex64])
def test_large_round_trip_over_the_channel(three, dtype):
    array = (np.random.rand(BIG) * 100).astype(dtype)
    t = mwrt.dist_send(array, node=2)
    array[:] = 0  # the caller may reuse its array once dist_send returns
    back = t.numpy()
    assert back.dtype == dtype and back.flags.writeable
    assert back.any()
    np.testing.assert_array_equal((t * 1).numpy(), back)


def test_worker_to_worker_move(three):
    src = mwrt.arange(BIG, dtype=np.float64, node=0)
    moved = src.to(node=2)
    assert (moved.get_node(), moved.shape, moved.dtype) == (2, (BIG,), np.float64)
    np.testing.assert_array_equal((moved + 1).numpy(), np.arange(BIG) + 1.0)
    small = mwrt.arange(5, node=1).dist_send(node=0)
    np.testing.assert_array_equal(small.numpy(), np.arange(5))


def test_a_failed_source_is_reported_on_both_sides_without_waiting_out_a_timeout(three):
    bad = mwrt.remote(lambda a: 1 / 0, spec=((BIG,), np.float64))(mwrt.ones(BIG, node=0))
    moved = bad.to(node=1)
    with pytest.raises(mwrt.RemoteError, match="sent nothing"):
        moved.numpy()
    with pytest.raises(mwrt.RemoteError, match="ZeroDivisionError"):
        bad.numpy()


def test_a_small_move_from_a_failed_source_fails_when_its_empty_message_came_first(three):
    """The source's empty message (its op failed) reaches the destination before the move's
    receive is posted there: the receive takes it and says so, where it waited out the
    channel's timeout (its posting had consumed the message, and the error was dropped)."""
    bad = mwrt.remote(lambda a: 1 / 0, spec=((4,), np.float64))(mwrt.ones(4, node=1))
    for _ in range(3):
        mwrt.ones(1, node=0)  # node 0 was not quiet: the receive waits in its batch, while
        moved = bad.to(node=0)  # the send goes out with node 1's sync just below
        with pytest.raises(mwrt.RemoteError, match="ZeroDivisionError"):
            bad.numpy()
        with pytest.raises(mwrt.RemoteError, match="rank 1 sent nothing"):
            moved.numpy()


@pytest.mark.parametrize("size", [4, BIG])
def test_all_reduce_sum_and_ops(three, size):
    ts = [mwrt.dist_send(np.full(size, i + 1.0, np.float32), node=i) for i in range(3)]
    assert mwrt.all_reduce(ts) is not None
    for t in ts:
        np.testing.assert_array_equal(t.numpy(), np.full(size, 6.0, np.float32))
    ints = [mwrt.dist_send(np.array([1, 2, 4], np.int32) << i, node=i) for i in range(3)]
    mwrt.all_reduce(ints, op=mwrt.ReduceOp.BOR)
    np.testing.assert_array_equal(ints[1].numpy(), [7, 14, 28])
    mwrt.all_reduce(ints, op="max")
    np.testing.assert_array_equal(ints[2].numpy(), [7, 14, 28])


def test_broadcast_reduce_gather_scatter(three):
    ts = [mwrt.dist_send(np.arange(6.0) * (i + 1), node=i) for i in range(3)]
    total = mwrt.reduce(ts, dst=1)
    assert total.get_node() == 1
    np.testing.assert_array_equal(total.numpy(), np.arange(6.0) * 6)
    mwrt.broadcast(ts, src=1)
    np.testing.assert_array_equal(ts[2].numpy(), np.arange(6.0) * 6)
    fresh = [mwrt.dist_send(np.full(2, i, np.int64), node=i) for i in range(3)]
    gathered = mwrt.all_gather(fresh)
    assert [g.get_node() for g in gathered] == [0, 1, 2]
    for g in gathered:
        np.testing.assert_array_equal(g.numpy(), [[0, 0], [1, 1], [2, 2]])
    at_two = mwrt.gather(fresh, dst=2)
    assert at_two.get_node() == 2 and at_two.shape == (3, 2)
    np.testing.assert_array_equal(at_two.numpy(), [[0, 0], [1, 1], [2, 2]])
    parts = mwrt.scatter(mwrt.dist_send(np.arange(6).reshape(3, 2), node=1), [0, 1, 2])
    assert [p.get_node() for p in parts] == [0, 1, 2]
    np.testing.assert_array_equal(parts[2].numpy(), [4, 5])


def test_collectives_on_a_subset_of_nodes(three):
    ts = [mwrt.dist_send(np.ones(3), node=n) for n in (0, 2)]
    mwrt.all_reduce(ts)
    np.testing.assert_array_equal(ts[1].numpy(), [2.0, 2.0, 2.0])


def test_collective_mistakes_are_raised_at_issue_time_naming_nodes(three):
    a, b = mwrt.ones(3, node=0), mwrt.ones(4, node=1)
    with pytest.raises(ValueError, match=r"node 0: float32\[3\], node 1: float32\[4\]"):
        mwrt.all_reduce([a, b])
    with pytest.raises(ValueError, match="own node"):
        mwrt.all_reduce([a, mwrt.ones(3, node=0)])
    with pytest.raises(TypeError, match="integer or bool"):
        mwrt.all_reduce([a, mwrt.ones(3, node=1)], op=mwrt.ReduceOp.BXOR)
    with pytest.raises(ValueError, match="src must index"):
        mwrt.broadcast([a, mwrt.ones(3, node=1)], src=5)
    with pytest.raises(ValueError, match="one part per node"):
        mwrt.scatter(mwrt.ones(2, 2, node=0), [0, 1, 2])


def test_collective_runs_on_each_nodes_current_stream_after_earlier_ops(three):
    s0, s1 = mwrt.Stream(node=0), mwrt.Stream(node=1)
    ts = []
    for i, s in enumerate((s0, s1)):
        with mwrt.stream(s):
            t = mwrt.zeros(4)
            t += i + 1  # queued before the collective, on the same stream
            ts.append(t)
    with mwrt.stream(s0), mwrt.stream(s1):  # nested: each node uses its own stream
        assert mwrt.current_stream(0) == s0 and mwrt.current_stream(1) == s1
        mwrt.all_reduce(ts)
    np.testing.assert_array_equal(ts[0].numpy(), [3, 3, 3, 3])
    np.testing.assert_array_equal(ts[1].numpy(), [3, 3, 3, 3])


def test_a_node_that_cannot_join_a_collective_fails_it_everywhere_at_once(three):
    import time

    good = [mwrt.ones(4, node=n) for n in (0, 2)]
    bad = mwrt.remote(lambda a: 1 / 0, spec=((4,), np.float32))(mwrt.ones(4, node=1))
    start = time.monotonic()
    mwrt.all_reduce([good[0], bad, good[1]])
    for t, node in ((good[0], 0), (good[1], 2)):
        with pytest.raises(mwrt.RemoteError, match="rank 1") as info:
            t.numpy()
        assert info.value.node == node
    with pytest.raises(mwrt.RemoteError, match="ZeroDivisionError"):
        bad.numpy()
    assert time.monotonic() - start < 30  # not the channel's 300 s timeout
    ok = [mwrt.ones(2, node=n) for n in range(3)]
    mwrt.all_reduce(ok)  # the nodes' group still works afterwards
    np.testing.assert_array_equal(ok[1].numpy(), [3, 3])


def test_collectives_on_two_streams_of_every_node_run_side_by_side(three):
    """Each stream pair is its own process group: their collectives interleave freely on
    the workers' threads and none takes another's sequence number."""
    pairs = [(mwrt.Stream(node=0), mwrt.Stream(node=1)) for _ in range(2)]
    sets = []
    for k, pair in enumerate(pairs):
        with mwrt.stream(pair[0]), mwrt.stream(pair[1]):  # made on the streams that use them
            sets.append([mwrt.full(50000, float(k + 1), dtype=np.float64, node=n)
                         for n in (0, 1)])
    for _ in range(20):
        for pair, tensors in zip(pairs, sets):
            with mwrt.stream(pair[0]), mwrt.stream(pair[1]):
                mwrt.all_reduce(tensors, op=mwrt.ReduceOp.MAX)
                mwrt.all_reduce(tensors)
                tensors[0] /= 2  # back to where it started, on that stream
                tensors[1] /= 2
    for k, (pair, tensors) in enumerate(zip(pairs, sets)):
        for t in tensors:
            np.testing.assert_array_equal(t.numpy(), np.full(50000, k + 1.0))


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--kill-child", "true"], timeout=30,
                              capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.timeout(180)
def test_a_worker_in_another_pid_namespace_takes_and_gives_large_tensors():
    # Same host name, network and /dev/shm: a container's worker. Its pid means another
    # process here, so the shm channel's peer checks fail: it gets the tcp path (the data
    # channel broke at the first dist_send, naming the live worker lost).
    if not _unshare_works():
        pytest.skip("cannot make a pid namespace here (unshare --pid)")
    mwrt.shutdown()
    worker, address = start_worker(prefix=("unshare", "--pid", "--kill-child"))
    try:
        mwrt.init_master_worker(address, timeout=30)
        want = np.arange(3 << 20, dtype=np.int32)
        t = mwrt.dist_send(want)
        for _ in range(2):
            np.testing.assert_array_equal(t.numpy(), want)
        np.testing.assert_array_equal((t + 1).numpy(), want + 1)
        # Read in place, its pid would name another process of this host: the channel's way.
        node = mwrt.master.cluster.current().nodes[0]
        assert "another host" in inplace._BY_CHANNEL[node]
    finally:
        mwrt.shutdown()
        worker.kill()  # unshare: its worker, pid 1 of the namespace, dies with it
        stop_worker(worker)
