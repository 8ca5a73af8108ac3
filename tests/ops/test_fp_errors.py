"""NumPy's floating-point error state on remote tensors: np.errstate at the line that issues
an op decides what the worker does, and the worker's warnings are the master's own."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

import mwrt
from mwrt import RemoteError

# A few elements run on the worker's socket thread, many on its stream's executor.
SIZES = [2, 200_000]


@pytest.fixture(scope="module")
def mw(cluster):
    return cluster


def zero_and_one(mw, size):
    host = np.zeros(size)
    host[1] = 1.0
    return mw.dist_send(host), host


@pytest.mark.parametrize("size", SIZES)
def test_errstate_raise_fails_at_the_sync_point_naming_the_op(mw, size):
    x, host = zero_and_one(mw, size)
    with np.errstate(divide="raise"):
        y = x / 0
    with pytest.raises(RemoteError, match="FloatingPointError: divide by zero") as raised:
        y.numpy()
    assert raised.value.op == "truediv" or "divide" in raised.value.op, raised.value.op
    assert f"{__file__}:" in str(raised.value)  # the line that issued it
    with np.errstate(all="ignore"):  # the stream runs again after reporting its error
        np.testing.assert_array_equal((x / 0).numpy(), host / 0)


@pytest.mark.parametrize("size", SIZES)
def test_a_workers_runtime_warning_is_issued_at_the_line_of_the_op(mw, size):
    x, host = zero_and_one(mw, size)
    with pytest.warns(RuntimeWarning) as record:
        y = x / 0; line = sys._getframe().f_lineno  # noqa: E702 (the op's line)
        got = y.numpy()
    texts = sorted(str(w.message) for w in record)
    assert any(t.startswith("divide by zero encountered") for t in texts), texts
    assert any(t.startswith("invalid value encountered") for t in texts), texts  # 0 / 0
    assert {(w.filename, w.lineno) for w in record} == {(__file__, line)}
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, host / 0)


def test_errstate_ignore_gives_no_warning_and_numpys_values(mw):
    x, host = zero_and_one(mw, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="ignore"):
            y = x / 0
            z = np.log(x - 1.0)
        got, logs = y.numpy(), z.numpy()
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, host / 0)
        np.testing.assert_array_equal(logs, np.log(host - 1.0))
        assert got.dtype == (host / 0).dtype


def test_the_masters_filters_decide(mw):
    x, _ = zero_and_one(mw, 4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="divide by zero")
        (x / 0).numpy()
    assert [str(w.message).split(" encountered")[0] for w in record] == ["invalid value"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="(divide by zero|invalid value) encountered"):
            (x / 0).numpy()


def test_errstate_per_kind_only_what_differs(mw):
    x, host = zero_and_one(mw, 4)
    with np.errstate(divide="ignore", invalid="raise"):
        y = x / 0
    with pytest.raises(RemoteError, match="FloatingPointError: invalid value"):
        y.numpy()
    with pytest.warns(RuntimeWarning, match="overflow"):
        big = mw.dist_send(np.full(3, 1e308))
        (big * 10.0).numpy()


def test_a_remote_functions_warning_is_issued_at_its_call(mw):
    x, host = zero_and_one(mw, 4)
    divide = mwrt.remote(lambda a: a / 0)
    with pytest.warns(RuntimeWarning) as record:
        y = divide(x); line = sys._getframe().f_lineno  # noqa: E702 (the call's line)
        got = y.numpy()
    assert sorted(str(w.message) for w in record) == [
        "divide by zero encountered in remote", "invalid value encountered in remote"]
    assert {(w.filename, w.lineno) for w in record} == {(__file__, line)}
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, host / 0)


def sharded_zero_and_one(mw, size=8):
    host = np.zeros(size)
    host[::4] = 1.0  # a one at every place of the 2-node mesh
    return mw.dist_send(host, mesh=mwrt.mesh(), shard=0), host


def test_errstate_raise_fails_a_mesh_op_at_the_sync_point(mw):
    x, host = sharded_zero_and_one(mw)
    with np.errstate(divide="raise"):
        y = x / 0
    with pytest.raises(RemoteError, match="FloatingPointError: divide by zero") as raised:
        y.numpy()
    assert f"{__file__}:" in str(raised.value)  # the line that issued it
    with np.errstate(all="ignore"):
        expected = host / 0
        z = x / 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # under errstate(all="ignore") no place warns
        np.testing.assert_array_equal(z.numpy(), expected)


def test_a_mesh_ops_warning_is_issued_once_at_its_line(mw):
    """Every place divides by zero: the master hears of it once, at the op's line."""
    x, host = sharded_zero_and_one(mw)
    with pytest.warns(RuntimeWarning) as record:
        y = x / 0; line = sys._getframe().f_lineno  # noqa: E702 (the op's line)
        got = y.numpy()
    assert sorted(str(w.message).split(" encountered")[0] for w in record) == [
        "divide by zero", "invalid value"]
    assert {(w.filename, w.lineno) for w in record} == {(__file__, line)}
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, host / 0)


def test_a_mesh_op_run_place_by_place_warns_once(mw):
    """A mean over an empty sharded axis: a sum at every place, then a division by the count
    at every place, each issued on its own; their warnings are one op's."""
    Z = mw.dist_send(np.zeros((0, 3)), mesh=mwrt.mesh(), shard=0)
    with pytest.warns(RuntimeWarning) as record:
        got = Z.mean(axis=0); line = sys._getframe().f_lineno  # noqa: E702 (the op's line)
        got.numpy()
        mwrt.synchronize()  # every place has answered: what each noted has come
    from_workers = [w for w in record if "encountered" in str(w.message)]
    assert [str(w.message) for w in from_workers] == ["invalid value encountered in divide"]
    assert (from_workers[0].filename, from_workers[0].lineno) == (__file__, line)


def test_warnings_name_the_ufunc_and_a_functions_own_warnings_come_too(mw):
    """NumPy names the ufunc ("in divide", where mwrt's op is true_divide), and a NumPy
    function's own RuntimeWarning (nanmean's "Mean of empty slice") reaches the master."""
    x, host = zero_and_one(mw, 4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        (x / 0).numpy()
        host / 0
    texts = [str(w.message) for w in record]
    assert texts[:2] == texts[2:] and "divide by zero encountered in divide" in texts, texts
    nans = mw.dist_send(np.full((2, 3), np.nan))
    with pytest.warns(RuntimeWarning, match="Mean of empty slice") as record:
        got = np.nanmean(nans, axis=0); line = sys._getframe().f_lineno  # noqa: E702
        got.numpy()
    assert {(w.filename, w.lineno) for w in record} == {(__file__, line)}
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):  # each call, as NumPy's
        np.nanmean(nans).numpy()


def test_each_issue_of_an_op_warns(mw):
    """One warning per op issued, as NumPy: a line run twice warns twice."""
    x, _ = zero_and_one(mw, 4)
    with pytest.warns(RuntimeWarning) as record:
        for _ in range(2):
            (x / 0).numpy()
    assert len(record) == 4  # divide by zero and 0 / 0, twice


@pytest.mark.slow  # torch's import on the workers
def test_torch_handles_do_as_torch_does(mw):
    """torch has no floating-point error state: its ops neither warn nor raise, and
    np.errstate does not reach them, on a worker as on the master."""
    torch = pytest.importorskip("torch")
    local = torch.tensor([0.0, 1.0])
    t = mw.dist_send(local)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            got = (t / 0).numpy()
            expected = (local / 0).numpy()
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", SIZES)
def test_each_op_in_a_loop_of_errstate_blocks_runs_under_its_own_state(mw, size):
    """Both sides keep the last error state (the master's np.geterr(), the worker's NumPy
    object of it): ops in nested and repeated blocks still run under the state of their line."""
    x, want = mw.dist_send(np.ones(size)), np.full(size, np.inf)  # 1 / 0: divide by zero

    def quiet(t):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(t.numpy(), want)

    for _ in range(3):
        with np.errstate(divide="ignore"):
            quiet(x / 0)
            with np.errstate(divide="warn"):
                warned = x / 0
            with pytest.warns(RuntimeWarning, match="divide by zero"):
                np.testing.assert_array_equal(warned.numpy(), want)
            quiet(x / 0)
            with np.errstate(divide="raise"):
                loud = x / 0
            with pytest.raises(RemoteError, match="FloatingPointError: divide by zero"):
                loud.numpy()
            quiet(x / 0)
        assert np.geterr()["divide"] == "warn"  # NumPy's default again after the block
