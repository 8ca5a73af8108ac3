"""Captured graphs: a block's ops recorded once and replayed with one command per node."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest
from tests.support.daemons import quick_to_notice_losses

import mwrt


def _step(x, w):
    """Elementwise, matmul and reductions: the same code runs eagerly and captured."""
    h = np.tanh(x @ w) * 2 + 1
    return h.sum(axis=0), h.max(), (h - h.mean()).abs()


def _values(tensors):
    return [t.numpy() for t in tensors]


@pytest.mark.parametrize("node", [0, 1])
def test_replay_matches_eager_on_each_node(cluster, node):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3)]
    w = mwrt.dist_send(rng.standard_normal((3, 5)).astype(np.float32), node=node)
    x = mwrt.dist_send(xs[0], node=node)
    with mwrt.graph(x=x) as g:
        captured = _step(x, w)
    for value in xs:
        other = mwrt.dist_send(value, node=node)
        g.replay(x=other)
        for got, want in zip(_values(captured), _values(_step(other, w)), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6)
        assert captured[0].get_node() == node


def test_inputs_updated_in_place_between_replays(cluster):
    x = mwrt.zeros(3)
    with mwrt.graph() as g:
        y = x * 2 + 1
    for i in range(3):
        x.fill_(i)
        g.replay()
        np.testing.assert_array_equal(y.numpy(), np.full(3, 2 * i + 1))


def test_a_step_that_updates_its_state_accumulates(cluster):
    w = mwrt.ones(4)
    with mwrt.graph() as g:
        for _ in range(50):  # a 100-op step
            w *= 1.5
            w -= 0.25
    for _ in range(3):
        g.replay()
    expected = np.ones(4, np.float32)
    for _ in range(150):
        expected = expected * np.float32(1.5) - np.float32(0.25)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)


def test_remote_and_two_nodes_and_streams_in_one_graph(cluster):
    a, b = mwrt.ones(3, node=0), mwrt.ones(3, node=1)
    s = mwrt.Stream(node=1)
    double = mwrt.remote(lambda t: t * 2, spec=((3,), np.float32))
    with mwrt.graph() as g:
        a += 1
        c = double(a)
        with mwrt.stream(s):  # safe streams: the wait on b's writer is captured too
            d = b * 3
        e = d + 1  # back on node 1's default stream: waits for s
    for _ in range(2):
        g.replay()
    np.testing.assert_array_equal(c.numpy(), np.full(3, 6.0))  # a is 3 after two replays
    np.testing.assert_array_equal(e.numpy(), np.full(3, 4.0))


def test_collectives_replay_across_nodes(cluster):
    parts = [mwrt.ones(4, node=n) for n in (0, 1)]
    with mwrt.graph() as g:
        mwrt.all_reduce(parts)
        gathered = mwrt.all_gather(parts)
    for _ in range(3):
        g.replay()
    for part in parts:
        np.testing.assert_array_equal(part.numpy(), np.full(4, 8.0))  # 1 -> 2 -> 4 -> 8
    np.testing.assert_array_equal(gathered[1].numpy(), np.full((2, 4), 8.0))


def test_nothing_runs_until_a_replay(cluster):
    x = mwrt.ones(2)
    with mwrt.graph() as g:
        x += 1
    np.testing.assert_array_equal(x.numpy(), [1, 1])
    g.replay()
    np.testing.assert_array_equal(x.numpy(), [2, 2])


def test_a_tensor_made_in_a_capture_is_read_after_a_replay_and_says_so_before(cluster):
    """The block runs nothing: a read of what it made, before the first replay, is refused
    on the master by name (the worker could only say it has no such tensor)."""
    x = mwrt.dist_send(np.arange(4.0))
    with mwrt.graph() as g:
        y = x + 1
        v = x[1:]
    for read in (y.numpy, v.numpy, lambda: float(y.sum()), lambda: y.numpy(copy=False)):
        with pytest.raises(mwrt.MwrtError, match=r"(read|sum) of tensor \d+: made inside "
                           r"a mwrt.graph\(\) block.*before the graph's first replay"):
            read()
    g.replay()
    np.testing.assert_array_equal(y.numpy(), [1, 2, 3, 4])
    np.testing.assert_array_equal(v.numpy(), [1, 2, 3])


def test_a_shape_decided_by_values_follows_each_replay(cluster):
    """t[mask] in a capture: each replay may select another count, and the handle's shape
    is the last replay's, as NumPy's x[m] run again would be."""
    x = mwrt.dist_send(np.arange(4.0))
    m = mwrt.dist_send(np.array([True, False, True, True]))
    with mwrt.graph() as g:
        z = x[m]
        w = z * 2
    g.replay()
    assert z.shape == (3,) and w.shape == (3,)
    m[1] = True
    g.replay()
    assert z.shape == (4,) and w.shape == (4,)
    np.testing.assert_array_equal(w.numpy(), [0, 2, 4, 6])


def test_an_error_in_a_replay_names_the_captured_op_and_line(cluster):
    x = mwrt.ones(3)
    bad = mwrt.remote(lambda t: t.reshape(7), spec=((7,), np.float32))
    with mwrt.graph() as g:
        y = bad(x)  # the line the error must name
    line = test_an_error_in_a_replay_names_the_captured_op_and_line.__code__.co_firstlineno + 4
    g.replay()
    with pytest.raises(mwrt.RemoteError) as info:
        y.numpy()
    assert info.value.op == "remote"
    assert f"test_graphs.py:{line}" in info.value.issued_at
    assert "captured by mwrt.graph" in info.value.issued_at


def test_a_failure_mid_replay_poisons_the_rest_and_the_next_replay_runs(cluster):
    x, w = mwrt.ones(3), mwrt.ones(3)
    fail = {"now": False}
    flaky = mwrt.remote(lambda t, f=fail: t, spec=((3,), np.float32))
    with mwrt.graph() as g:
        w.add_(1.0)  # prepared steps (in-place ufuncs) before and after the failing op
        y = flaky(x)
        w.multiply_(2.0)
        z = y + w
    g.replay()
    np.testing.assert_array_equal(z.numpy(), [5, 5, 5])
    bad = mwrt.remote(lambda t: t.reshape(7), spec=((7,), np.float32))
    with mwrt.graph() as h:
        w.add_(1.0)
        y = bad(x)
        w.multiply_(2.0)
        z = y + 1
    h.replay()
    with pytest.raises(mwrt.RemoteError) as info:
        z.numpy()
    assert info.value.op == "remote"
    np.testing.assert_array_equal(w.numpy(), [5, 5, 5])  # ran up to the failure, not after
    g.replay()
    np.testing.assert_array_equal(w.numpy(), [12, 12, 12])


@pytest.mark.parametrize("what, match", [
    (lambda x: (x + 1).numpy(), "graph: Get waits for the worker"),
    (lambda x: x.to(node=1), r"graph: moves between nodes \(.to\(node=\)"),
    (lambda x: mwrt.dist_send(np.ones(2)), "graph: copying an array from the master"),
])
def test_what_cannot_be_captured_is_refused_by_name(cluster, what, match):
    x = mwrt.ones(2)
    with pytest.raises(mwrt.MwrtError, match=match):
        with mwrt.graph():
            what(x)
    np.testing.assert_array_equal((x + 1).numpy(), [2, 2])  # issuing is back to normal


def test_replay_of_a_graph_whose_captured_tensor_was_freed(cluster):
    x = mwrt.ones(2)
    with mwrt.graph() as g:
        y = x + 1
    del x
    gc.collect()
    with pytest.raises(mwrt.MwrtError, match=r"graph.replay: a tensor made before the graph "
                                             r"\(tensor \d+, captured on node 0\) was freed"):
        g.replay()
    assert y.get_node() == 0


def test_rebinding_is_checked(cluster):
    x = mwrt.ones(2)
    with mwrt.graph(x=x) as g:
        x + 1
    with pytest.raises(TypeError, match="no input named 'z'"):
        g.replay(z=x)
    with pytest.raises(ValueError, match="x must be like the captured input"):
        g.replay(x=mwrt.ones(3))


@pytest.fixture
def two(monkeypatch):
    yield from quick_to_notice_losses(monkeypatch, 2)


@pytest.mark.slow  # kills a node of its own daemons
def test_replay_after_a_worker_loss_raises_worker_lost(two):
    a, b = mwrt.ones(2, node=0), mwrt.ones(2, node=1)
    with mwrt.graph() as g:
        a += 1
        b += 1
    g.replay()
    two.local[1].process.kill()
    deadline = time.monotonic() + 30
    while two.node(1).lost is None and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        g.replay()
