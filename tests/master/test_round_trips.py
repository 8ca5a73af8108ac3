"""Round trips: how many a program makes, where each came from, and the hops of each.

A small op and the read after it run on the worker's socket thread when their stream is
idle (no hand-off to the stream's thread); larger ops and busy streams keep theirs, and
values and ordering stay NumPy's either way. Every wait of the master is counted at the
user's line that caused it (mwrt.stats(), mwrt.profile()).

The worker counts both (`mwrt.status()`: a session's `handoffs`, batches its stream threads
took, and `inline`, commands its socket thread ran itself), so a change that adds a hop to
the round trip fails here, without timing anything.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import pytest

import mwrt
from mwrt.master import heartbeat
from mwrt.protocol import wire
from tests.support.daemons import waits_from_here


def _hops(node: int = 0) -> tuple[int, int]:
    session = mwrt.status()[node]["session"]
    return session["handoffs"], session["inline"]


def test_only_calls_and_frees_may_run_on_the_socket_thread():
    quick = {cls.__name__ for cls in wire.MESSAGES if cls.quick}
    # never Remote (user code), a collective or a transfer
    assert quick == {"Call", "CallGet", "Free"}


def _settle() -> None:
    """Let a stream thread that sent the last answer finish its batch: it counts itself idle
    just after it replies, and a command that comes in between is handed to it."""
    time.sleep(0.2)


def test_a_small_op_and_its_read_take_no_hand_off(cluster):
    x = mwrt.dist_send(np.array([1.5, 2.0, -3.25, 4.0]))
    float(x.sum())  # the default stream exists from here on
    _settle()
    before = _hops()
    got = [float(x.sum()) for _ in range(50)] + [float((x * 2).max()) for _ in range(50)]
    after = _hops()
    assert got == [4.25] * 50 + [8.0] * 50
    assert after[0] == before[0], "a small op or its read went through the stream's thread"
    assert after[1] - before[1] >= 200  # each op and each read, at least


def test_a_large_op_runs_on_its_stream_thread(cluster):
    n = 100_000  # far over MWRT_INLINE_OP_ELEMENTS
    x = mwrt.arange(n, dtype=np.float64)
    x.numpy()
    before = _hops()
    assert float(x.sum()) == np.arange(n, dtype=np.float64).sum()
    assert _hops()[0] > before[0]


def test_a_small_op_waits_behind_a_busy_stream(cluster):
    big = mwrt.arange(3_000_000, dtype=np.float64)
    a = mwrt.zeros(4)
    a.numpy()
    b = big.sum() + a  # queued behind the large sum: reads a as it is now (zeros)
    a += 1  # small, but its stream is busy: it must not run before b
    want = np.arange(3_000_000, dtype=np.float64).sum()
    np.testing.assert_array_equal(b.numpy(), np.full(4, want))
    np.testing.assert_array_equal(a.numpy(), np.ones(4))


def test_a_small_op_on_an_idle_stream_waits_for_another_streams_write(cluster):
    s1, s2 = mwrt.Stream(), mwrt.Stream()
    big = mwrt.arange(3_000_000, dtype=np.float64)
    big.numpy()
    with mwrt.stream(s1):
        total = big.sum()
    with mwrt.stream(s2):
        later = total + 1.0  # s2 is idle, but must wait for s1's sum (an event, queued)
    assert float(later) == np.arange(3_000_000, dtype=np.float64).sum() + 1.0


def test_a_masters_spin_that_found_nothing_is_skipped_at_the_next_waits(cluster):
    node = mwrt.master.cluster.current().nodes[0]
    missing = -7  # a reply token no command has: every spin for it misses
    with node.rx_lock:  # as a wait holds it
        node.spin_misses = node.spin_skips = 0
        turns = []
        for _ in range(5):
            node._spin(missing)
            turns.append((node.spin_misses, node.spin_skips))
    assert turns == [(1, 1), (1, 0), (2, 3), (2, 2), (2, 1)]  # skipped after each miss
    x = mwrt.dist_send(np.array([1.5, 2.5]))
    assert [float(x.sum()) for _ in range(5)] == [4.0] * 5  # skipping or spinning, the same


def _waits() -> int:
    return mwrt.stats()["waits"]


def test_a_scalar_read_after_its_op_after_a_quiet_spell_is_one_message(cluster, monkeypatch):
    monkeypatch.setattr(heartbeat, "_STRAGGLER_AGE", 60.0)  # no straggler sent in between
    node = mwrt.master.cluster.current().nodes[0]
    x = mwrt.dist_send(np.array([1.0, 2.0, 4.0]))
    got, sent = [], []
    for _ in range(5):
        time.sleep(0.005)  # quiet: an op alone would go out at once
        before = node.seq
        got.append(float(x.sum()))
        sent.append(node.seq - before)
    assert got == [7.0] * 5
    assert sent == [1] * 5  # the op rides with its read


def test_a_held_op_that_nothing_follows_is_sent_by_the_heartbeat(cluster):
    node = mwrt.master.cluster.current().nodes[0]
    x = mwrt.dist_send(np.array([1.0, 2.0]))
    float(x.sum())
    time.sleep(0.005)
    before = node.seq
    y = x * 3
    deadline = time.monotonic() + 10
    while node.batch and time.monotonic() < deadline:
        time.sleep(0.01)
    # > not ==: under load a heartbeat may send the sum's Free in a batch of its own first
    assert not node.batch and node.seq > before
    np.testing.assert_array_equal(y.numpy(), [3.0, 6.0])


def _sent_commands(node, monkeypatch) -> list:
    """The classes of the commands `node` sends from here on (its batches, as they go out);
    no straggler is sent by the heartbeat meanwhile, so an op waits in its batch for a read."""
    monkeypatch.setattr(heartbeat, "_STRAGGLER_AGE", 60.0)
    sent: list = []
    flush = type(node)._flush_locked

    def noting(self, now):
        if self is node:
            sent.extend(type(command).__name__ for command in self.batch)
        flush(self, now)
    monkeypatch.setattr(type(node), "_flush_locked", noting)
    return sent


def _failing_read_raises_the_ops_error(node, monkeypatch) -> None:
    """A read right after an op that fails raises the op's RemoteError, in one command; its
    result, read again, raises it again, and the stream goes on."""
    x = mwrt.dist_send(np.ones(3))
    x.numpy()
    sent = _sent_commands(node, monkeypatch)
    time.sleep(0.005)  # quiet: the node's batch holds a small op for the read that follows
    with np.errstate(divide="raise"):
        y = x / 0; line = sys._getframe().f_lineno  # noqa: E702 (the op's line)
    with pytest.raises(mwrt.RemoteError, match="FloatingPointError: divide by zero") as raised:
        y.numpy()
    assert sent[-1] == "CallGet" and "Get" not in sent, sent  # the read rode with its op
    assert raised.value.op in ("truediv", "true_divide", "divide"), raised.value.op
    assert raised.value.node == 0 and f"{__file__}:{line}" in str(raised.value)
    with pytest.raises(mwrt.RemoteError, match="FloatingPointError") as again:
        y.numpy()  # its result is poisoned: read again, the same error
    assert again.value.op == raised.value.op
    assert float((x + 2.0).sum()) == 9.0  # the stream goes on


def test_a_failing_op_read_right_after_it_raises_its_error_in_one_command(cluster, monkeypatch):
    _failing_read_raises_the_ops_error(mwrt.master.cluster.current().nodes[0], monkeypatch)


def test_a_read_right_after_an_op_reports_an_earlier_failure_of_its_stream(cluster, monkeypatch):
    node = mwrt.master.cluster.current().nodes[0]
    x = mwrt.dist_send(np.ones(3))
    x.numpy()
    sent = _sent_commands(node, monkeypatch)
    with np.errstate(divide="raise"):
        bad = x / 0; line = sys._getframe().f_lineno  # noqa: E702 (the failing op's line)
    node.flush()  # on its own: the next op's read rides with that op alone
    time.sleep(0.005)
    later = x + 1.0  # skipped: its stream failed before it
    with pytest.raises(mwrt.RemoteError, match="FloatingPointError") as raised:
        later.numpy()
    assert sent[-1] == "CallGet" and "Get" not in sent, sent
    assert f"{__file__}:{line}" in str(raised.value)  # the failure is the division's
    with pytest.raises(mwrt.RemoteError, match="FloatingPointError"):
        later.numpy()  # skipped, so poisoned with that error
    del bad
    np.testing.assert_array_equal((x + 1.0).numpy(), [2.0, 2.0, 2.0])


def test_a_read_right_after_an_op_warns_at_the_ops_line(cluster, monkeypatch):
    node = mwrt.master.cluster.current().nodes[0]
    x = mwrt.dist_send(np.array([0.0, 1.0]))
    x.numpy()
    sent = _sent_commands(node, monkeypatch)
    time.sleep(0.005)
    with pytest.warns(RuntimeWarning, match="divide by zero") as record:
        y = 1.0 / x; line = sys._getframe().f_lineno  # noqa: E702 (the op's line)
        got = y.numpy()
    assert sent[-1] == "CallGet", sent
    assert {(w.filename, w.lineno) for w in record} == {(__file__, line)}
    np.testing.assert_array_equal(got, [np.inf, 1.0])


def test_a_read_of_an_op_held_before_a_capture_is_still_refused_in_it(cluster):
    x = mwrt.ones(2)
    x.numpy()
    time.sleep(0.005)  # quiet: the op's Call is held in the batch for a read that may follow
    total = x.sum()
    with pytest.raises(mwrt.MwrtError, match="graph: Get waits for the worker"):
        with mwrt.graph():
            float(total)
    assert float(total) == 2.0


def test_a_read_right_after_an_op_that_mwrt_cancel_drops_says_so(cluster, tmp_path, monkeypatch):
    node = mwrt.master.cluster.current().nodes[0]
    go = str(tmp_path / "go")

    def slow(a):  # runs until the master saw the worker take the cancel
        import os
        import time
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        return a + 1

    def cancel_then_go():
        deadline = time.monotonic() + 60
        while not node.rx_lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)  # the read below is out, with its op
        before = set(node.replies)
        canceller = threading.Thread(target=mwrt.cancel, daemon=True)
        canceller.start()
        while time.monotonic() < deadline and not [  # its answer, which the read's wait routes
                t for t, r in list(node.replies.items()) if t not in before and
                type(r[0]) is wire.Done]:
            time.sleep(0.01)
        open(go, "w").close()
        canceller.join(60)  # its waits (one per node) are counted before the next test's

    x = mwrt.ones(3)
    y = mwrt.remote(slow, spec=((3,), np.float32))(x)
    node.flush()
    sent = _sent_commands(node, monkeypatch)
    time.sleep(0.005)  # quiet: the node's batch holds a small op for the read that follows
    z = y * 2.0  # queued behind slow
    helper = threading.Thread(target=cancel_then_go, daemon=True)
    helper.start()
    with pytest.raises(mwrt.RemoteError, match=r"Cancelled: dropped by mwrt.cancel\(\)") as raised:
        z.numpy()
    helper.join(60)
    assert sent[0] == "CallGet", sent  # z's op, with its read
    assert raised.value.op == "multiply"
    np.testing.assert_array_equal(y.numpy(), [2.0, 2.0, 2.0])  # slow ran to its end


def test_a_scalar_read_after_its_op_is_one_round_trip(cluster):
    x = mwrt.dist_send(np.array([1.0, 2.0, 4.0]))
    before = waits_from_here()
    assert float(x.sum()) == 7.0
    assert bool(x.max() > 3) is True
    assert _waits() - before == 2


@pytest.mark.parametrize("make", [lambda x: x[x > 1], lambda x: np.unique(x),
                                  lambda x: np.nonzero(x)[0]])
def test_a_data_dependent_shape_and_its_read_cost_one_round_trip(cluster, make):
    data = np.array([3.0, 0.0, 2.0, 3.0, 1.0])
    got = make(mwrt.dist_send(data))
    want = make(data)
    before = waits_from_here()
    assert got.shape == want.shape
    value = got.numpy()
    assert _waits() - before == 1
    np.testing.assert_array_equal(value, want)
    assert value.dtype == want.dtype


def test_a_masked_assignment_of_a_masked_value_waits_for_nothing(cluster):
    a, b = np.array([1.0, 0.0, 3.0, 0.0]), np.array([5.0, 6.0, 7.0, 8.0])
    ta, tb = mwrt.dist_send(a), mwrt.dist_send(b)
    zeros = ta == 0
    before = waits_from_here()
    ta[zeros] = tb[zeros]  # scikit-learn's variance update writes so
    assert _waits() == before
    a[a == 0] = b[a == 0]
    np.testing.assert_array_equal(ta.numpy(), a)


def test_a_masked_assignment_of_the_wrong_length_fails_at_the_next_wait(cluster):
    ta, tb = mwrt.dist_send(np.array([1.0, 0.0, 3.0])), mwrt.dist_send(np.arange(3.0))
    ta[ta > 0] = tb[tb >= 0]  # 2 places, 3 values: NumPy's ValueError, raised on the worker
    with pytest.raises(mwrt.RemoteError, match="setitem"):
        ta.numpy()
    np.testing.assert_array_equal(ta.numpy(), [1.0, 0.0, 3.0])  # the stream goes on


def test_a_write_between_the_shape_and_the_read_is_seen(cluster):
    data = np.array([3.0, 0.0, 2.0])
    got = mwrt.dist_send(data)
    picked = got[got > 1]
    assert picked.shape == (2,)
    picked += 1.0
    np.testing.assert_array_equal(picked.numpy(), [4.0, 3.0])
    again = got[got > 1]
    assert len(again) == 2
    got[0] = 7.0  # another tensor written: the value read with the shape still holds
    np.testing.assert_array_equal(again.numpy(), [3.0, 2.0])


def test_a_profile_lists_each_wait_at_its_line(cluster, tmp_path):
    x = mwrt.dist_send(np.array([1.0, 5.0]))
    here = sys._getframe().f_code.co_filename
    with mwrt.profile() as prof:
        for _ in range(3):
            bool(x.max() > 2)  # three waits on this line
        x.numpy()
    calls = {(row["call"], row["count"]) for row in prof.waits if here in row["line"]}
    assert calls == {("bool()", 3), (".numpy()", 1)}
    assert all(row["seconds"] > 0 for row in prof.waits)
    assert len([w for w in prof.wait_slices if here in w["line"]]) == 4
    assert "bool() at " in prof.waits_table()
    printed = str(prof)  # print(prof): both tables
    assert prof.table() in printed and prof.waits_table() in printed
    assert "4 waits of the master" in repr(prof) and "ops on 1 node" in repr(prof)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert sum(e.get("name") == "wait: bool()" for e in events) == 3


def test_stats_count_waits_per_line(cluster):
    x = mwrt.dist_send(np.array(2.0))
    before = mwrt.stats()
    for _ in range(4):
        int(x)
    after = mwrt.stats()
    assert after["waits"] - before["waits"] == 4
    assert after["wait_seconds"] > before["wait_seconds"]
    # The counts are the process's: other modules' lines may come first.
    row = next(r for r in after["lines"]
               if r["call"] == "int()" and "test_round_trips.py" in r["line"])
    assert row["count"] >= 4


def test_a_with_blocks_own_waits_are_named_as_such(cluster):
    x = mwrt.dist_send(np.array([2.0]))
    x += 1.0
    before = mwrt.stats()
    with mwrt.profile():  # its start and its end wait for the workers
        pass
    calls = {r["call"] for r in mwrt.stats()["lines"] if "test_round_trips.py" in r["line"]}
    assert {"a with block's start", "a with block's end"} <= calls, calls
    assert mwrt.stats()["waits"] > before["waits"]


def test_an_operators_wait_is_named_by_its_operator(cluster):
    """It was named 'forward()', the name of the code every operator method shares."""
    y = mwrt.remote(lambda a: a + 1)(mwrt.dist_send(np.ones(2)))  # its shape: pending
    y * 2  # the product's shape needs y's: one wait
    calls = {r["call"] for r in mwrt.stats()["lines"] if "test_round_trips.py" in r["line"]}
    assert "__mul__()" in calls and "forward()" not in calls, calls


def test_a_function_given_a_pending_functions_result_waits_for_nothing(cluster, tmp_path):
    """remote(f)(remote(g)(x)) waited for g's result's shape at the call, which it does
    not use: a pipeline of functions ran one at a time, and mwrt.cancel() found nothing
    queued behind the first."""
    started = tmp_path / "started"

    def slow(a):
        started.touch()  # (the worker shares this host's files)
        time.sleep(0.3)
        return a + 1
    x = mwrt.dist_send(np.ones(3))
    before = mwrt.stats()["waits"]
    first = mwrt.remote(slow)(x)
    second = mwrt.remote(slow)(first)
    third = mwrt.remote(slow)(second)
    assert mwrt.stats()["waits"] == before  # all three queued at once
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    mwrt.cancel()  # the first runs on; the two behind it are dropped
    with pytest.raises(mwrt.RemoteError, match="dropped by mwrt.cancel"):
        third.numpy()
    assert first.numpy().tolist() == [2.0, 2.0, 2.0]


def test_the_waits_of_a_helper_thread_count_at_the_line_that_started_it(cluster):
    big = np.arange(1 << 15, dtype=np.float64)  # over MWRT_INLINE_BYTES: sent by a helper thread
    before = {r["line"]: r["count"] for r in mwrt.stats()["lines"]}
    here = f"{__file__}:{sys._getframe().f_lineno + 1} in "
    t = mwrt.dist_send(big)
    grew = {r["line"]: r["count"] - before.get(r["line"], 0) for r in mwrt.stats()["lines"]}
    assert [line for line, count in grew.items() if count and line.startswith(here)], grew
    np.testing.assert_array_equal(t.numpy(), big)


def _bench_hops():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import bench_hops
    finally:
        sys.path.pop(0)
    mwrt.shutdown()  # the trace starts daemons of its own
    return bench_hops


def _path(kind: str) -> tuple:
    """The most common path of `kind`'s round trip, by its notes (benchmarks/bench_hops.py)."""
    return _bench_hops().trace(kind, 100)["path"]


@pytest.mark.parametrize("kind", ["read", "sum"])
def test_a_round_trip_costs_the_workers_socket_thread_few_system_calls(kind):
    """The socket thread sleeps in one poll() of its descriptors and reads and answers a
    local master on its lane: a poll, a read and a write a round trip (3), where ZeroMQ's
    sockets took 12-13 (asking one costs two calls) and zmq.Poller over them 24; the pyzmq
    echo server's thread makes 9."""
    calls = _bench_hops().syscalls(kind)
    if calls is None:
        pytest.skip("strace is missing, or cannot attach to a process here")
    assert sum(calls.values()) <= 6, calls


_WAKES = {"worker: wakes from poll", "worker: sees it while spinning"}  # either, by load


def test_a_read_takes_one_message_of_one_frame_each_way_and_no_hand_off():
    path = _path("read")  # each side's notes in its order (the two sides' may interleave)
    assert [label for label in path if label.startswith("master")] == [
        "master: op called", "master: batch encoded, send (1 frame)", "master: send returned",
        "master: reply read (1 frame)", "master: value returned"]
    assert [label for label in path if label.startswith("worker") and label not in _WAKES] == [
        "worker: message read (1 frame)", "worker: batch decoded and admitted",
        "worker: Get starts (socket thread)", "worker: reply encoded and sent",
        "worker: reply send returned", "worker: Get done"]


def test_a_small_op_and_its_read_run_on_the_socket_thread():
    path = _path("sum")
    assert "worker: CallGet starts (socket thread)" in path  # the op, answering with its value
    assert not [label for label in path if "Get starts" in label and "CallGet" not in label]
    assert not [label for label in path if "stream thread" in label or "forwards" in label]
    assert path.count("master: batch encoded, send (1 frame)") == 1  # the op, with the read
    assert path.count("master: reply read (1 frame)") == 1


@pytest.mark.parametrize("limit", ["0", "4096"])
def test_the_bound_is_a_setting(monkeypatch, limit):
    monkeypatch.setenv("MWRT_INLINE_OP_ELEMENTS", limit)
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=1, timeout=30)
    try:
        x = mwrt.ones(4)
        float(x.sum())
        _settle()
        before = _hops()
        assert [float(x.sum()) for _ in range(5)] == [4.0] * 5
        assert (_hops()[0] > before[0]) == (limit == "0")
        # limit 0: an op and the read riding with it run on the stream's thread (the master
        # still holds a small op for its read, as with the default)
        node = mwrt.master.cluster.current().nodes[0]
        node.quick_elements = 4096
        _failing_read_raises_the_ops_error(node, monkeypatch)
    finally:
        mwrt.shutdown()
