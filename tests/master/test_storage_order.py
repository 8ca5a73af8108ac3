"""Ordering per storage: a write through any view is ordered against every later use of the
base and of its other views, on any stream and node, in eager code and in graphs (issue 25).

Each test runs a slow remote() op first on stream s1, then the write on s1, then the read on
s2: without ordering the read overtakes the write and sees old values. NumPy runs the same
program and is the oracle.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mwrt


def _sleep(t):
    time.sleep(0.3)


def _stall(t):
    """Hold the current stream for 0.3 s behind a use of `t` (a remote() read)."""
    mwrt.remote(_sleep, outputs=0)(t)


def _slow_copy(t):
    time.sleep(0.3)
    return t.copy()


def _base():
    return np.arange(12.0).reshape(3, 4)


def _add_row(x):
    row = x[1]
    row += 5


def _scale_slice(x):
    part = x[:, 1:3]
    part *= 2


def _view_of_view(x):
    part = x[1:][:, ::2]
    part -= 1


def _transpose(x):
    t = x.T
    t += 10


def _reshape(x):
    flat = x.reshape(-1)
    flat += 1


def _item_through_view(x):
    part = x[1:]
    part[0, 1] = 42


def _copyto_view(x):
    np.copyto(x[2], np.arange(4.0) * 100)


def _ufunc_out_view(x):
    row = x[0]
    np.multiply(row, 3, out=row)


def _ufunc_out_other_view(x):
    np.add(x[1], 1, out=x[0])


def _augmented_slice(x):
    x[1:] += 1


def _real_part(x):
    part = x.astype(np.complex128).real  # a copy's real part: x itself is not written
    part += 1
    re = x.real  # of a real array: the array itself, a view
    re *= 3


WRITES = [_add_row, _scale_slice, _view_of_view, _transpose, _reshape, _item_through_view,
          _copyto_view, _ufunc_out_view, _ufunc_out_other_view, _augmented_slice, _real_part]


def _streams(node):
    return mwrt.Stream(node=node), mwrt.Stream(node=node)


def _placed(node):
    """The base array on `node`, and two streams of that node."""
    return mwrt.dist_send(_base(), node=node), *_streams(node)


@pytest.mark.parametrize("node", [0, 1])
@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__.lstrip("_"))
def test_write_through_a_view_then_read_on_another_stream(cluster, write, node):
    expected = _base()
    write(expected)
    x, s1, s2 = _placed(node)
    with mwrt.stream(s1):
        _stall(x)
        write(x)
    with mwrt.stream(s2):
        whole, part = x * 1, x[:, :2] * 1
    np.testing.assert_array_equal(whole.numpy(), expected)
    np.testing.assert_array_equal(part.numpy(), expected[:, :2])


@pytest.mark.parametrize("node", [0, 1])
def test_base_written_then_read_through_a_view(cluster, node):
    x = mwrt.dist_send(_base(), node=node)
    rows = x[1:]  # made before the write, on the default stream
    s1, s2 = _streams(node)
    with mwrt.stream(s1):
        _stall(x)
        x += 1
    with mwrt.stream(s2):
        seen = rows * 1
    np.testing.assert_array_equal(seen.numpy(), _base()[1:] + 1)


@pytest.mark.parametrize("node", [0, 1])
def test_augmented_slice_waits_for_an_earlier_copy(cluster, node):
    """x[1:] += 1 writes through a temporary view: a copy made before on s1 must not see it."""
    x, s1, s2 = _placed(node)
    with mwrt.stream(s1):
        _stall(x)
        y = x * 1
    with mwrt.stream(s2):
        x[1:] += 1
    expected = _base()
    np.testing.assert_array_equal(y.numpy(), expected)
    expected[1:] += 1
    np.testing.assert_array_equal(x.numpy(), expected)


@pytest.mark.parametrize("node", [0, 1])
def test_numpy_of_a_view_waits_for_a_write_through_the_base(cluster, node):
    x = mwrt.dist_send(_base(), node=node)
    rows = x[1:]
    with mwrt.stream(mwrt.Stream(node=node)):
        _stall(x)
        x += 1
    np.testing.assert_array_equal(rows.numpy(), _base()[1:] + 1)


@pytest.mark.parametrize("node", [0, 1])
def test_numpy_of_the_base_waits_for_a_write_through_a_view(cluster, node):
    x = mwrt.dist_send(_base(), node=node)
    with mwrt.stream(mwrt.Stream(node=node)):
        _stall(x)
        _add_row(x)
    expected = _base()
    _add_row(expected)
    np.testing.assert_array_equal(x.numpy(), expected)


def test_move_of_a_view_waits_for_a_write_through_the_base(cluster):
    x = mwrt.dist_send(_base(), node=1)
    rows = x[1:]
    with mwrt.stream(mwrt.Stream(node=1)):
        _stall(x)
        x += 1
    np.testing.assert_array_equal(rows.to(node=0).numpy(), _base()[1:] + 1)


def test_move_of_the_base_waits_for_a_write_through_a_view(cluster):
    x = mwrt.dist_send(_base(), node=1)
    with mwrt.stream(mwrt.Stream(node=1)):
        _stall(x)
        _scale_slice(x)
    expected = _base()
    _scale_slice(expected)
    np.testing.assert_array_equal(x.to(node=0).numpy(), expected)


@pytest.mark.parametrize("node", [0, 1])
def test_clip_out_is_a_write(cluster, node):
    x, s1, s2 = _placed(node)
    with mwrt.stream(s1):
        _stall(x)
        clipped = np.clip(x, 0, 5, out=x)
    with mwrt.stream(s2):
        seen = x * 1
    expected = np.clip(_base(), 0, 5)
    np.testing.assert_array_equal(seen.numpy(), expected)
    np.testing.assert_array_equal(np.asarray(clipped), expected)


@pytest.mark.parametrize("node", [0, 1])
def test_dot_out_is_a_write(cluster, node):
    a = mwrt.dist_send(_base()[:2, :3], node=node)
    b = mwrt.dist_send(np.ones((3, 2)), node=node)
    c = mwrt.dist_send(np.zeros((2, 2)), node=node)
    s1, s2 = _streams(node)
    with mwrt.stream(s1):
        _stall(c)
        np.dot(a, b, out=c)
    with mwrt.stream(s2):
        seen = c * 1
    np.testing.assert_array_equal(seen.numpy(), _base()[:2, :3] @ np.ones((3, 2)))


# -- graphs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("node", [0, 1])
def test_graph_writes_through_a_view_then_eager_read_on_another_stream(cluster, node):
    x, s1, s2 = _placed(node)
    with mwrt.graph(x=x) as g, mwrt.stream(s1):
        _stall(x)
        rows = x[1:]
        rows += 1
    g.replay()
    with mwrt.stream(s2):
        seen = x * 1
    np.testing.assert_array_equal(seen.numpy(), _base() + [[0], [1], [1]])


@pytest.mark.parametrize("node", [0, 1])
def test_eager_write_through_a_view_then_graph_read_on_another_stream(cluster, node):
    x, s1, s2 = _placed(node)
    with mwrt.graph(x=x) as g, mwrt.stream(s2):
        y = x[1:] * 2
    with mwrt.stream(s1):
        _stall(x)
        _add_row(x)
    g.replay()
    expected = _base()
    _add_row(expected)
    np.testing.assert_array_equal(y.numpy(), expected[1:] * 2)


@pytest.mark.parametrize("node", [0, 1])
def test_replay_writing_through_a_view_waits_for_reads_on_another_stream(cluster, node):
    x, s1, s2 = _placed(node)
    with mwrt.graph(x=x) as g, mwrt.stream(s1):
        rows = x[1:]
        rows += 1
    with mwrt.stream(s2):
        seen = mwrt.remote(_slow_copy, spec=((3, 4), np.float64))(x)
    g.replay()  # writes x in place on s1: after s2's slow read
    np.testing.assert_array_equal(seen.numpy(), _base())
    np.testing.assert_array_equal(x.numpy(), _base() + [[0], [1], [1]])


@pytest.mark.parametrize("node", [0, 1])
def test_read_after_replay_waits_for_what_the_graph_made(cluster, node):
    x, s1, s2 = _placed(node)
    with mwrt.graph(x=x) as g, mwrt.stream(s1):
        _stall(x)
        y = x * 2
    g.replay()
    with mwrt.stream(s2):
        y += 1  # the last writer of y is now s2
    np.testing.assert_array_equal(y.numpy(), _base() * 2 + 1)
    x += 1
    g.replay()  # makes y again on s1, slowly
    with mwrt.stream(s2):
        seen = y + 100  # after the replay's write, not before it
    np.testing.assert_array_equal(seen.numpy(), (_base() + 1) * 2 + 100)


# -- random programs of views and streams, against NumPy ---------------------------------------

VIEWS = {  # each a view in NumPy, and in mwrt a handle sharing the base's record
    "base": lambda x: x, "row": lambda x: x[1], "cols": lambda x: x[:, 1:3],
    "transpose": lambda x: x.T, "flat": lambda x: x.reshape(-1),
    "strided": lambda x: x[1:][:, ::2], "none": lambda x: x[None, 2],
}


def _fill(v, c):
    v[...] = c


def _copyto(v, c):
    np.copyto(v, c)


def _ufunc_out(v, c):
    np.multiply(v, c, out=v)


def _add(v, c):
    v += c


def _mul(v, c):
    v *= c


UPDATES = {"add": _add, "mul": _mul, "fill": _fill, "copyto": _copyto, "ufunc_out": _ufunc_out}

_step = st.one_of(
    st.tuples(st.just("stall"), st.integers(0, 2)),
    st.tuples(st.just("write"), st.integers(0, 2), st.sampled_from(sorted(VIEWS)),
              st.sampled_from(sorted(UPDATES)), st.integers(-3, 3), st.booleans()),
    st.tuples(st.just("read"), st.integers(0, 2), st.sampled_from(sorted(VIEWS)),
              st.sampled_from(["copy", "move", "numpy"]), st.booleans()),
)


def _run(program, x, streams, kept, other=None):
    """Run `program` on x (an ndarray or a tensor); returns the copies its reads made: with
    `other`, a node, reads may also move a view there or copy it to the master."""
    seen = []
    for step in program:
        where = mwrt.stream(streams[step[1]]) if streams else _nothing()
        with where:
            if step[0] == "stall":
                if streams:
                    _stall(x)
                continue
            view = kept[step[2]] if step[-1] else VIEWS[step[2]](x)  # made before, or now
            if step[0] == "write":
                UPDATES[step[3]](view, float(step[4]))
            elif other is None or step[3] == "copy":
                seen.append(view * 1)
            else:
                seen.append(view.to(node=other) if step[3] == "move" else view.numpy())
    return seen


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_STREAMS: dict = {}


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(_step, min_size=1, max_size=7), node=st.sampled_from([0, 1]),
       captured=st.booleans())
def test_random_programs_of_views_and_streams_equal_numpy(cluster, program, node, captured):
    """Writes and reads (copies, moves to the other node, copies to the master) through views
    made before or in the program, on three streams with slow ops among them, eagerly or as a
    graph replayed once; every copy and the base equal NumPy's."""
    expected = _base()
    want = _run(program, expected, None, {k: f(expected) for k, f in VIEWS.items()})
    x = mwrt.dist_send(_base(), node=node)
    kept = {k: f(x) for k, f in VIEWS.items()}
    if node not in _STREAMS:  # a session has a quota of streams: each example reuses three
        _STREAMS[node] = [mwrt.Stream(node=node) for _ in range(3)]
    streams = _STREAMS[node]
    if captured:  # (a graph can neither move nor copy to the master: its reads copy)
        with mwrt.graph(x=x) as g:
            got = _run(program, x, streams, kept)
        g.replay()
    else:
        got = _run(program, x, streams, kept, other=1 - node)
    with mwrt.stream(streams[0]):
        last = kept["cols"] * 1  # a read through a view after the program, on a stream of it
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"read {i} of {program}")
    np.testing.assert_array_equal(x.numpy(), expected, err_msg=f"base after {program}")
    np.testing.assert_array_equal(last.numpy(), expected[:, 1:3])


def test_mesh_view_shard_shares_its_base_shard_record(cluster):
    """x.T of a sharded tensor makes a view of each shard: a write through it on one stream
    orders a read of the base's shard on another."""
    mesh = mwrt.mesh(nodes=[0, 1])
    x = mwrt.dist_send(_base(), mesh=mesh, shard=1)
    view = x.T
    part, rows = x.shards()[1], view.shards()[1]
    s1, s2 = _streams(1)
    with mwrt.stream(s1):
        _stall(part)
        rows += 1
    with mwrt.stream(s2):
        seen = part * 1
    np.testing.assert_array_equal(seen.numpy(), _base()[:, 2:] + 1)


@pytest.mark.parametrize("node", [0, 1])
def test_graph_input_view_rebound_orders_the_new_input(cluster, node):
    """A graph whose input is a view writes through a view of it made inside: rebound, the
    replay's write orders later reads of the new input, not of the captured one."""
    s1, s2 = _streams(node)
    captured = mwrt.dist_send(_base(), node=node)[1:]
    with mwrt.graph(x=captured) as g, mwrt.stream(s1):
        _stall(captured)
        inner = captured[:, 1:]
        inner += 1
    other = mwrt.dist_send(_base() * 10, node=node)[1:]
    g.replay(x=other)
    with mwrt.stream(s2):
        seen = other * 1
    expected = _base()[1:] * 10
    expected[:, 1:] += 1
    np.testing.assert_array_equal(seen.numpy(), expected)
