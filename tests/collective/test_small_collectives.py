"""Small all_reduce and barrier, whose messages carry the agreement check (mwrt.collective.agreement):
results, every kind of disagreement between ranks, and ranks that die mid-collective."""

from __future__ import annotations

import os

import numpy as np
import pytest
from tests.support.ranks import available, run_ranks, spawn_and_collect
from tests.collective.test_collectives import data, expected_reduce, ops_for

import mwrt.distributed as dist
from mwrt.channels.inproc import InprocChannel
from mwrt.collective import api as C
from mwrt.collective.group import ProcessGroup
from mwrt.collective.native import NativeCollectives
from mwrt.collective.reduce_ops import ReduceOp
from mwrt.errors import CollectiveMismatchError
from mwrt.store import HashStore

pytestmark = pytest.mark.timeout(120)


def _skip(name):
    return pytest.mark.skipif(not available(name), reason=f"channel {name!r} is not available")


BACKENDS = ["inproc"] + [pytest.param(b, marks=_skip(b)) for b in ("tcp", "shm")]
CASES = [("inproc", n) for n in (2, 3, 4)] + [
    pytest.param(b, n, marks=_skip(b)) for b in ("tcp", "shm") for n in (2, 3, 4)]
DTYPES = [np.float32, np.float64, np.int32, np.uint8]
COUNTS = [1, 3, 1024]  # 1024 float32: the 4 KiB of the latency target


# -- results -------------------------------------------------------------------------------


def _all_reduce(g, r):
    assert g.carries_checks, "the carried path needs recv_message and buffered sends"
    out = {}
    for dtype in DTYPES:
        for count in COUNTS:
            for op in ops_for(dtype):
                a = data(r, count, dtype)
                C.all_reduce(g, a, op)
                out[(np.dtype(dtype).name, count, op)] = a
    C.barrier(g)
    return out


@pytest.mark.parametrize("backend,n", CASES)
def test_small_all_reduce_is_right_and_bitwise_identical(backend, n):
    results = run_ranks(backend, n, _all_reduce)
    for (dtype, count, op), got in results[0].items():
        want = expected_reduce(op, n, count, np.dtype(dtype))
        if np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-6)
        else:
            np.testing.assert_array_equal(got, want)
        for other in results[1:]:
            assert other[(dtype, count, op)].tobytes() == got.tobytes(), (dtype, count, op)


# -- disagreements -------------------------------------------------------------------------

# What rank 1 calls instead of `all_reduce(float32[4], SUM)`, and how the error shows it.
MISMATCHES = {
    "op": (lambda g: C.all_reduce(g, np.ones(4, np.float32), ReduceOp.MAX), "op=MAX"),
    "dtype": (lambda g: C.all_reduce(g, np.zeros(4, np.float64)), "float64[4]"),
    "shape": (lambda g: C.all_reduce(g, np.ones((2, 2), np.float32)), "float32[2, 2]"),
    "count": (lambda g: C.all_reduce(g, np.zeros(1000, np.float32)), "float32[1000]"),
    "barrier": (C.barrier, "barrier"),
    "empty": (lambda g: C.all_reduce(g, np.zeros(0, np.float32)), "float32[0]"),
    "broadcast": (lambda g: C.broadcast(g, np.zeros(4, np.float32), 0), "broadcast"),
}


def _disagree(g, r, field, mine_is_barrier):
    call, _ = MISMATCHES[field]
    mine = np.full(4, r + 1.0, np.float32)
    try:
        if r == 1:
            call(g)
        elif mine_is_barrier:
            C.barrier(g)
        else:
            C.all_reduce(g, mine)
        error = None
    except CollectiveMismatchError as e:
        error = str(e)
    untouched = r == 1 or np.array_equal(mine, np.full(4, r + 1.0))  # nothing combined in
    a = np.full(3, r + 1.0)
    C.all_reduce(g, a)  # leftovers of the failed call never meet the next one
    return error, untouched, a


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("field", list(MISMATCHES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_rank_raises_naming_every_rank(backend, field, n):
    _, needle = MISMATCHES[field]
    results = run_ranks(backend, n, _disagree, field, False)
    for r, (error, untouched, after) in enumerate(results):
        assert error is not None, f"rank {r} did not raise"
        assert untouched, f"rank {r}: data was combined although the calls disagree"
        assert "ranks disagree" in error and needle in error and "rank 1:" in error, error
        assert ("ranks 0, 2:" if n == 3 else "rank 0:") in error, error
        assert "float32[4]" in error and "op=SUM" in error, error  # the others' call, too
        np.testing.assert_array_equal(after, np.full(3, n * (n + 1) / 2))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_barrier_against_all_reduce_raises_everywhere(backend, n):
    """Rank 1 calls all_reduce where the others call barrier (the reverse of the above)."""
    results = run_ranks(backend, n, _disagree, "op", True)
    for r, (error, _, _) in enumerate(results):
        assert error is not None and "barrier" in error and "op=MAX" in error, (r, error)


# -- ranks that die ------------------------------------------------------------------------


def _dies_in_a_loop(rank, queue):
    dist.init_process_group("tcp", timeout=60)  # far longer than the test waits
    a = np.ones(1024, np.float32)
    try:
        for i in range(100000):
            if rank == 2 and i == 50:
                os._exit(3)  # a crash: no close, no goodbye
            if i % 2:
                dist.all_reduce(a)
            else:
                dist.barrier()
            a[:] = 1
        queue.put((rank, "no error"))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, str(e)))


@pytest.mark.slow  # spawns ranks, one of which dies
@pytest.mark.skipif(not available("tcp"), reason="needs the tcp channel")
def test_a_rank_dying_mid_small_collective_is_named_at_once():
    """Ranks that wait on a survivor rather than on the dead rank learn it from that
    survivor, long before their 60 s timeout."""
    exited, got = spawn_and_collect(_dies_in_a_loop, nprocs=3, reports=2, join=40)
    assert exited, "survivors still waiting"
    for rank in (0, 1):
        assert "rank 2" in got[rank], got[rank]


# -- the check handed to a native collective -----------------------------------------------


TAKEN = []  # what the native barrier took, in call order


class _CheckingBarrier(NativeCollectives):
    """A 'native' barrier that carries the agreement check itself."""

    kinds = frozenset({"barrier"})
    checks_calls = True

    def run(self, kind, call, *args):
        TAKEN.append((call.seq, call.take_check()))
        with pytest.raises(RuntimeError, match="already started"):
            call.take_check()
        return True


class _NativeBarrier(InprocChannel):
    """An inproc channel that declares its barrier native (the class itself, not a name)."""

    native_collectives = _CheckingBarrier


def test_a_native_collective_that_checks_calls_takes_the_check():
    store = HashStore(timeout=5)
    chans = [_NativeBarrier(r, 2, store=store, timeout=5) for r in range(2)]
    try:
        group = ProcessGroup(chans[0])
        C.barrier(group)
        C.barrier(group)
        assert [seq for seq, _ in TAKEN] == [0, 1]  # the sequence number comes with the call
        assert all(len(desc) == 76 for _, desc in TAKEN)
        assert not any(chans[0]._boxes.queues.values()), "a check message was sent anyway"
    finally:
        for ch in chans:
            ch.close()


# -- device arrays staged through the host -------------------------------------------------


class _FakeDeviceArray:
    """Quacks like a CuPy array to host_view: the collective must stage it through the host."""

    __cuda_array_interface__ = None  # only its presence matters here

    def __init__(self, host):
        self.data, self.shape = host.copy(), host.shape

    def get(self):
        return self.data.copy()

    def set(self, host):
        self.data[...] = host


def _device_all_reduce(g, r):
    a = _FakeDeviceArray(np.full((2, 3), r + 1.0, np.float32))
    C.all_reduce(g, a)
    return a.data


def test_device_arrays_are_staged_and_written_back():
    for got in run_ranks("inproc", 2, _device_all_reduce):
        np.testing.assert_array_equal(got, np.full((2, 3), 3.0, np.float32))
