"""No /dev/shm segment outlives what made it: a worker's session, or the daemon itself.

Daemons started apart, and a master that runs an all_reduce over the shm or auto channel,
then shuts down (or stops the daemons) at once: the workers' sessions end while their
collective still sets up (each makes its control block and staging area, then publishes
its name in the master's store). The segments those daemons made must be gone once the
session has ended, and all of them once the daemons have stopped, even one that a stream
still running at the stop made. A segment is named mwrt-PID-HEX by its maker, so only
these daemons' are looked at (another run's may lie in /dev/shm beside them).
"""

from __future__ import annotations

import time

import pytest

import mwrt
from tests.support import machine
from tests.support.daemons import start_worker, stop_worker

ROUNDS = 4  # a round left a segment behind about every other time before the fix
ELEMENTS = 100_000  # within the staging size: the shortest collective, the tightest race


@pytest.fixture
def daemons(tmp_path):
    """Two keyed daemons started apart: ([(process, address)], the master's key file)."""
    from mwrt.protocol.auth import keygen

    worker_key, master_key = keygen(str(tmp_path / "keys"))
    mwrt.shutdown()
    started = [start_worker("--key-file", worker_key) for _ in range(2)]
    yield started, master_key
    mwrt.shutdown()
    for process, _ in started:
        stop_worker(process)


def _segments_within(pids, seconds: float) -> list[str]:
    """The segments `pids` made that are still there after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while machine.segments(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return machine.segments(pids)


@pytest.mark.parametrize("channel", ["auto", "shm"])
def test_a_collective_cut_short_by_shutdown_leaves_no_segment(daemons, monkeypatch, channel):
    """all_reduce, then shutdown at once: no segment of the daemons stays in /dev/shm once
    each session has ended (the daemons still run), nor once the daemons have stopped."""
    started, key = daemons
    monkeypatch.setenv("MWRT_CHANNEL", channel)
    monkeypatch.setenv("MWRT_KEY_FILE", key)
    pids = [process.pid for process, _ in started]
    workers = [address.removeprefix("tcp://") for _, address in started]
    for _ in range(ROUNDS):
        mwrt.init_master_worker(workers=workers, timeout=30)
        a, b = mwrt.ones(ELEMENTS, node=0), mwrt.ones(ELEMENTS, node=1)
        mwrt.all_reduce([a, b])
        mwrt.shutdown()
        # A stream thread of the ended session may still be unwinding its collective.
        assert _segments_within(pids, machine.seconds(5, 30)) == [], "after the session"
    for process, _ in started:
        stop_worker(process)
    assert machine.segments(pids) == [], "after the daemons stopped"


def test_daemons_stopped_during_a_collective_leave_no_segment(tmp_path, monkeypatch):
    """all_reduce, then the daemons stop at once, their sessions still open: no segment of
    theirs stays once they have stopped."""
    from mwrt.protocol.auth import keygen

    worker_key, master_key = keygen(str(tmp_path / "keys"))
    monkeypatch.setenv("MWRT_CHANNEL", "auto")
    monkeypatch.setenv("MWRT_KEY_FILE", master_key)
    for _ in range(ROUNDS):
        started = [start_worker("--key-file", worker_key) for _ in range(2)]
        try:
            mwrt.init_master_worker(workers=[a.removeprefix("tcp://") for _, a in started],
                                    timeout=30)
            a, b = mwrt.ones(ELEMENTS, node=0), mwrt.ones(ELEMENTS, node=1)
            mwrt.all_reduce([a, b])
            for process, _ in started:
                process.terminate()
        finally:
            for process, _ in started:
                stop_worker(process)
            mwrt.shutdown()  # its nodes are lost: it only forgets them
        assert machine.segments([process.pid for process, _ in started]) == []


def _hold_a_segment(a):
    """On a worker: make a segment, as a transfer or collective does, and keep running."""
    from mwrt.channels.segments import Segment, new_name

    Segment(new_name(), 1, 4096, create=True)
    time.sleep(120)
    return a


def test_a_daemon_stopped_past_its_grace_unlinks_what_its_streams_made(daemons, monkeypatch):
    """A stream still running at the stop, past the daemon's grace, never reaches the unlink
    of a segment it made: the daemon unlinks it as it exits."""
    started, key = daemons
    monkeypatch.setenv("MWRT_KEY_FILE", key)
    process, address = started[0]
    mwrt.init_master_worker(workers=[address.removeprefix("tcp://")], timeout=30)
    mwrt.remote(_hold_a_segment, spec=((1,), "float32"))(mwrt.ones(1, node=0))
    deadline = time.monotonic() + machine.seconds(10, 60)
    while not machine.segments([process.pid]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert machine.segments([process.pid]), "the remote function made no segment"
    stop_worker(process)
    assert machine.segments([process.pid]) == []
