"""A worker killed during a master-worker collective: every survivor names it, nothing hangs."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from conftest import quick_to_notice_losses

import mwrt


@pytest.fixture
def three(monkeypatch):
    yield from quick_to_notice_losses(monkeypatch, 3)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_worker_killed_during_a_collective(three, sig):
    big = [mwrt.ones(1 << 20, node=n) for n in range(3)]
    late = mwrt.remote(lambda a: (time.sleep(1.0), a)[1], spec=((1 << 20,), np.float32))
    slow = late(big[2])  # node 2 joins late; spec= keeps the master from waiting for it
    mwrt.all_reduce([big[0], big[1], slow])
    time.sleep(0.3)  # nodes 0 and 1 are waiting inside the collective
    three.local[2].process.send_signal(sig)
    start = time.monotonic()
    for node in (0, 1):
        with pytest.raises(mwrt.MwrtError, match="rank 2|node 2"):
            big[node].numpy()
    with pytest.raises(mwrt.WorkerLostError, match="node 2"):
        slow.numpy()
    assert time.monotonic() - start < 30
    fresh = [mwrt.ones(2, node=n) for n in (0, 1)]
    mwrt.all_reduce(fresh)  # the survivors still work together
    np.testing.assert_array_equal(fresh[0].numpy(), [2, 2])


def test_a_loop_with_no_sync_point_hears_of_a_killed_worker(three):
    x = mwrt.zeros(4, node=1)
    x.numpy()
    three.local[1].process.send_signal(signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        while time.monotonic() - start < 60:  # queues nothing forever for a dead worker
            x += 1
    assert time.monotonic() - start < 30
    np.testing.assert_array_equal((mwrt.ones(2, node=0) + 1).numpy(), [2, 2])
