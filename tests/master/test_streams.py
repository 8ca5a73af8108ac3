"""Streams and events: overlap, ordering within and across nodes, sticky errors, timelines."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

import mwrt
from tests.support import machine


def _rendezvous_wait(a):
    """Stream A: wait (10 s at most) for stream B's op to signal; True only if they overlap."""
    import builtins
    import threading

    event = builtins.__dict__.setdefault("_mwrt_test_event", threading.Event())
    seen = event.wait(10)
    event.clear()
    return np.array(seen)


def _rendezvous_signal(a):
    import builtins
    import threading

    builtins.__dict__.setdefault("_mwrt_test_event", threading.Event()).set()
    return a


def test_two_streams_of_one_worker_overlap(cluster):
    x = mwrt.ones(3)
    with mwrt.stream(mwrt.Stream()):
        waiting = mwrt.remote(_rendezvous_wait)(x)
    with mwrt.stream(mwrt.Stream()):
        mwrt.remote(_rendezvous_signal)(x)
    assert bool(waiting.numpy()), "stream B's op did not run while stream A's was running"


def test_ops_on_one_stream_run_in_issue_order(cluster):
    s = mwrt.Stream()
    with mwrt.stream(s):
        x = mwrt.zeros(1)
        for i in range(200):
            x *= 0.5
            x += i
    expected = np.zeros(1, np.float32)
    for i in range(200):
        expected *= 0.5
        expected += i
    assert x.numpy()[0] == expected[0]


def test_wait_event_orders_streams_within_a_node(cluster):
    a, b = mwrt.Stream(), mwrt.Stream()
    with mwrt.stream(a):
        x = mwrt.zeros(4)
        mwrt.remote(lambda t: (time.sleep(1.0), t.fill(5)), outputs=0)(x)
        done = a.record_event()
    b.wait_event(done)
    with mwrt.stream(b):
        y = x + 1  # runs only after stream a filled x
    assert done.query() is False  # answers at once, while stream a still sleeps
    np.testing.assert_array_equal(y.numpy(), np.full(4, 6.0, np.float32))
    assert done.query()


def test_wait_event_across_nodes_is_relayed(cluster):
    with mwrt.node(1):
        s1 = mwrt.Stream()
        start = mwrt.Event(enable_timing=True)
        start.record(s1)
        with mwrt.stream(s1):
            mwrt.remote(lambda t: time.sleep(0.3), outputs=0)(mwrt.ones(1))
        end = mwrt.Event(enable_timing=True)
        end.record(s1)
    s0 = mwrt.Stream(node=0)
    issued = time.monotonic()
    s0.wait_event(end)  # does not block the master
    with mwrt.stream(s0):
        stamp = mwrt.remote(lambda t: np.array(time.time()))(mwrt.ones(1))
    assert time.monotonic() - issued < 0.25
    assert not end.query()
    ran_at = float(stamp)
    end.synchronize()
    assert end.query()
    assert ran_at >= start._ask(True)["time"] + 0.29  # ran after node 1's sleep
    assert 250 <= start.elapsed_time(end) < 5000


def test_streams_events_and_meshes_refuse_pickling_by_name_and_copy_as_themselves(cluster):
    # They pickled as their node's sockets ('self.handle cannot be converted to a Python
    # object'), or an unrecorded event as bytes that meant nothing in another process.
    import copy
    import pickle
    import re

    stream = mwrt.Stream(node=1)
    event, mesh = stream.record_event(), mwrt.mesh()
    for thing, fix in ((stream, "mwrt.Stream()"), (mwrt.Event(), "mwrt.Event()"),
                       (event, "mwrt.Event()"), (mesh, "mwrt.mesh()")):
        with pytest.raises(TypeError, match="cannot be pickled: .*" + re.escape(f"({fix})")):
            pickle.dumps(thing)
        assert copy.copy(thing) is thing and copy.deepcopy([thing])[0] is thing
    with mwrt.stream(copy.deepcopy(stream)):
        assert float(mwrt.ones(3, node=1).sum()) == 3.0


def test_stream_query_and_synchronize(cluster):
    s = mwrt.Stream()
    with mwrt.stream(s):
        mwrt.remote(lambda t: time.sleep(0.3), outputs=0)(mwrt.ones(1))
    assert not s.query()
    s.synchronize()
    assert s.query()
    assert mwrt.Event().query()  # never recorded: done


def test_synchronize_of_several_nodes_waits_for_each(cluster):
    """mwrt.synchronize([0, 1]) waits for every stream of both nodes, as synchronize() of
    all and synchronize(i) of one do; a bad index is named."""
    streams = [mwrt.Stream(node=i) for i in (0, 1)]
    for i, s in enumerate(streams):
        with mwrt.stream(s):
            mwrt.remote(lambda t: time.sleep(0.3), outputs=0)(mwrt.ones(1, node=i))
    assert not any(s.query() for s in streams)
    mwrt.synchronize([0, 1])
    assert all(s.query() for s in streams)
    mwrt.synchronize([])  # none: nothing to wait for
    with pytest.raises((ValueError, IndexError), match="7"):
        mwrt.synchronize([0, 7])


def test_wait_stream_and_current_stream(cluster):
    a, b = mwrt.Stream(), mwrt.Stream()
    assert mwrt.current_stream() == mwrt.Stream.default(0, -1)
    with mwrt.stream(a):
        assert mwrt.current_stream() == a
        x = mwrt.zeros(2)
        mwrt.remote(lambda t: (time.sleep(0.2), t.fill(3)), outputs=0)(x)
    b.wait_stream(a)
    with mwrt.stream(b):
        y = x * 2
    np.testing.assert_array_equal(y.numpy(), [6, 6])


def test_sticky_error_on_one_stream_leaves_another_working(cluster):
    bad, good = mwrt.Stream(), mwrt.Stream()
    x = mwrt.ones(3)
    mwrt.synchronize()
    with mwrt.stream(bad):
        mwrt.remote(lambda t: 1 / 0, outputs=0)(x)
    with mwrt.stream(good):
        y = x + 1
    np.testing.assert_array_equal(y.numpy(), [2, 2, 2])
    good.synchronize()
    with pytest.raises(mwrt.RemoteError, match="ZeroDivisionError") as info:
        bad.synchronize()
    assert info.value.stream == bad.id
    bad.synchronize()  # reported once, then the stream runs again


def test_remote_with_declared_spec_never_waits(cluster):
    fn = mwrt.remote(lambda t: t[:2] * 2, spec=((2,), np.float64))
    r = fn(mwrt.dist_send(np.arange(4.0)))
    assert r._spec is not None and r.shape == (2,)
    np.testing.assert_array_equal(r.numpy(), [0.0, 2.0])


def _after_file(path: str, bound: float) -> None:
    """In a shipped function: wait until file `path` exists (`bound` seconds at most)."""
    deadline = time.monotonic() + bound
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("asked", ["before", "after"])
def test_a_shape_is_answered_once_its_tensor_is_made_not_after_later_calls(cluster, tmp_path,
                                                                          asked):
    # `a * 2` needs a's shape, known once `first` ran; it waited for `second` too. (An array
    # past MWRT_INLINE_BYTES: a smaller one's bytes ride with its shape, in stream order, so
    # that reading it next costs no second round trip: test_round_trips.py.)
    made, go, done = (str(tmp_path / name) for name in ("made", "go", "second-done"))
    bound = machine.seconds(10, 60)

    def first(x):
        if asked == "before":  # the shape is asked while this runs
            _after_file(go + "-first", bound)
        open(made, "w").close()
        return np.arange(10_000.0)

    def second(a):
        _after_file(go, bound)
        open(done, "w").close()
        return a * 3

    a = mwrt.remote(first)(mwrt.ones(1))
    b = mwrt.remote(second)(a)
    if asked == "before":  # most likely once the question is there; right in either order
        threading.Timer(0.2, lambda: open(go + "-first", "w").close()).start()
    else:
        _after_file(made, bound)
    c = a * 2
    assert c.shape == (10_000,)
    assert not os.path.exists(done), "the shape waited for the call after the one that made it"
    open(go, "w").close()
    np.testing.assert_array_equal(b.numpy(), np.arange(10_000.0) * 3)
    assert os.path.exists(done)
    np.testing.assert_array_equal(c.numpy(), np.arange(10_000.0) * 2)


def test_profile_writes_a_trace_with_one_track_per_stream(cluster, tmp_path):
    s = mwrt.Stream(node=1)
    with mwrt.profile() as prof:
        x = mwrt.ones(100)
        y = (x * 2).sum()
        with mwrt.stream(s):
            z = mwrt.ones(10) + 1
        float(y), z.numpy()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    tracks = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert (0, -1) in tracks and (1, s.id) in tracks
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"ones", "multiply", "sum", "add"} <= names
    assert "multiply" in prof.table()


# -- safe streams: uses on another stream are ordered by the master ---------------------------

def _slow(value):
    """A remote() that takes a while to produce `value`: later streams would overtake it."""
    return mwrt.remote(lambda: (time.sleep(0.3), np.asarray(value, np.float32))[1],
                       spec=(np.shape(value), np.float32))


def test_read_on_another_stream_waits_for_the_writer(cluster):
    x = _slow([1.0, 2.0, 3.0])()  # made on the default stream, slowly
    with mwrt.stream(mwrt.Stream()):
        y = x * 10  # used to fail: "tensor N: not on node 0 (freed, or never created...)"
    np.testing.assert_array_equal(y.numpy(), [10, 20, 30])


def test_write_waits_for_reads_on_other_streams(cluster):
    a = mwrt.ones(4)
    with mwrt.stream(mwrt.Stream()):
        seen = mwrt.remote(lambda t: (time.sleep(0.3), t.copy())[1], spec=((4,), np.float32))(a)
    a.fill_(7)  # default stream: must not overwrite a before the slow read took its copy
    a += 1
    np.testing.assert_array_equal(seen.numpy(), np.ones(4))
    np.testing.assert_array_equal(a.numpy(), np.full(4, 8.0))


def test_free_while_another_stream_reads(cluster):
    import gc

    a = _slow(np.arange(6))()
    with mwrt.stream(mwrt.Stream()):
        total = a.sum()
    del a
    gc.collect()
    assert float(total) == 15.0


def test_writes_on_two_streams_then_a_move_to_another_node(cluster):
    with mwrt.node(1):
        x = mwrt.zeros(3)
        s = mwrt.Stream()
        with mwrt.stream(s):
            x += _slow([1.0, 1.0, 1.0])(node=1)
            x *= 4
    moved = x.to(node=0)  # sent from the stream that last wrote x
    np.testing.assert_array_equal(moved.numpy(), [4, 4, 4])
    parts = [mwrt.ones(2, node=n) for n in (0, 1)]
    with mwrt.stream(mwrt.Stream(node=1)):
        parts[1] *= 3
    mwrt.all_reduce(parts)  # the collective waits for the write on node 1's other stream
    np.testing.assert_array_equal(parts[0].numpy(), [4, 4])


def test_an_explicit_wait_is_not_ordered_again(cluster):
    node = mwrt.master.cluster.current().node(0)
    x = mwrt.ones(2)
    s = mwrt.Stream()
    s.wait_stream(mwrt.current_stream())
    before = next(node.ids)
    with mwrt.stream(s):
        y = x + 1
    assert next(node.ids) - before == 3  # the result's id and the Call's: no implicit event
    np.testing.assert_array_equal(y.numpy(), [2, 2])


@pytest.mark.parametrize("how", ["env", "stream"])
def test_manual_order_names_a_tensor_used_before_it_is_made(cluster, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("MWRT_STREAM_ORDER", "manual")
    s = mwrt.Stream(order="manual" if how == "stream" else "safe")
    x = _slow([1.0, 2.0])()
    with mwrt.stream(s):
        y = x + 1
    with pytest.raises(mwrt.RemoteError, match=r"tensor \d+ was made on stream -1 and is not "
                                               r"finished; order the streams with an event"):
        s.synchronize()
    s.wait_stream(mwrt.current_stream())  # the manual fix works
    with mwrt.stream(s):
        y = x + 1
    np.testing.assert_array_equal(y.numpy(), [2, 3])


def test_stream_order_must_be_safe_or_manual(cluster):
    with pytest.raises(ValueError, match="order must be 'safe' or 'manual'"):
        mwrt.Stream(order="loose")
