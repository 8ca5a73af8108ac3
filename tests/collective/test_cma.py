"""The shm channel's single-copy collectives: peers' buffers read in place (CMA)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from tests.support import machine, ranks
from tests.support.ranks import available, run_ranks

import mwrt.distributed as dist
from mwrt.collective.cma_collectives import CmaGroup
from mwrt.collective import api as C
from mwrt.collective.reduce_ops import ReduceOp

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(not available("shm"), reason="the shm channel needs Linux")]

COUNT = 600_001  # several 512 KiB pieces per chunk, chunks of unequal size


def _large(g, r):
    a = (np.arange(COUNT, dtype=np.float32) % 7) * (r + 1)
    C.all_reduce(g, a)
    m = np.full(COUNT, r, np.int64)
    C.all_reduce(g, m, ReduceOp.MAX)
    out = np.empty(g.size * COUNT, np.float32)
    C.all_gather(g, out, a)
    rs = np.empty(COUNT // g.size, np.float64)
    C.reduce_scatter(g, rs, np.ones(rs.size * g.size) * (r + 1), ReduceOp.AVG)
    return a, m, out, rs, [isinstance(g.natives.state, CmaGroup)]


@pytest.mark.parametrize("stage_bytes", ["0", str(16 << 20)], ids=["in-place", "staged"])
@pytest.mark.parametrize("n", [2, 3])
def test_large_collectives_read_peers_in_place(n, stage_bytes, monkeypatch):
    monkeypatch.setenv("MWRT_SHM_STAGE_BYTES", stage_bytes)  # the forked ranks inherit it
    results = run_ranks("shm", n, _large, timeout=30)
    total = sum(r + 1 for r in range(n))
    want = (np.arange(COUNT, dtype=np.float32) % 7) * total
    for a, m, out, rs, used in results:
        assert used == [True]
        np.testing.assert_array_equal(a, want)
        assert a.tobytes() == results[0][0].tobytes()
        assert (m == n - 1).all()
        np.testing.assert_array_equal(out.reshape(n, COUNT), np.stack([want] * n))
        np.testing.assert_allclose(rs, total / n)


def _one_rank_refuses(g, r):
    if r == 0:
        os.environ["MWRT_SHM_CMA"] = "0"  # this process only (forked ranks)
    a = np.full(1000, r + 1.0)
    C.all_reduce(g, a)
    return a, [g.natives.state]


def test_a_rank_that_refuses_turns_it_off_for_all():
    for a, states in run_ranks("shm", 2, _one_rank_refuses, timeout=30):
        assert states == [None]  # both fell back to the socket and slot path, together
        assert (a == 3.0).all()


def _leaves_after_one(g, r, stay):
    a = np.ones(4096, np.float32)
    C.all_reduce(g, a)
    if r == 1:
        time.sleep(stay)  # then return: the harness closes the channel, the process exits
        return "left"
    t0 = time.monotonic()
    try:
        C.all_reduce(g, a)
    except Exception as exc:  # noqa: BLE001 - the error is the result under test
        return f"{type(exc).__name__}: {exc}", time.monotonic() - t0
    return "no error", 0.0


def test_a_peer_that_dies_is_named_not_waited_for():
    errors = run_ranks("shm", 2, _leaves_after_one, 0.0, timeout=60, errors=True)
    text, _ = errors[0]
    assert errors[1] == "left"
    assert "rank 1" in text and "timed out" not in text, text


def test_a_silent_peer_times_out_naming_it():
    errors = run_ranks("shm", 2, _leaves_after_one, 4.0, timeout=1.0, errors=True)
    text, _ = errors[0]
    assert "ChannelTimeoutError" in text and "rank 1" in text and "all_reduce" in text, text


def _last_call(g, r):
    a = np.full(1000, r + 1.0)
    C.all_reduce(g, a)  # then return: the harness closes the channel, the process exits
    return a


@pytest.mark.slow  # forks four ranks
def test_ranks_that_leave_right_after_a_collective_do_not_fail_the_others():
    """The first rank to see a call done must not leave while a peer still polls it."""
    for _ in range(20):  # four ranks on fewer cores: the last one is often descheduled
        for a in run_ranks("shm", 4, _last_call, timeout=30):
            assert (a == 10.0).all()


def _script_without_destroy(rank):
    dist.init_process_group("shm")
    a = np.ones(1000)
    dist.all_reduce(a)  # the script's last line: no destroy_process_group
    assert (a == 4).all()


def test_a_script_may_end_right_after_a_collective():
    for _ in range(5):
        dist.spawn(_script_without_destroy, nprocs=4, start_method="fork", timeout=60)


def _stage_sizes_differ(g, r, sizes):
    os.environ["MWRT_SHM_STAGE_BYTES"] = str(sizes[r])  # this process only (forked ranks)
    out = []
    for count in (1000, 300_000):  # 4 KB: staged wherever anyone stages; 1.2 MB: in between
        a = np.full(count, r + 1.0, np.float32)
        C.all_reduce(g, a)
        out.append(a)
    c = g.natives.state
    return out, c.stage_bytes


@pytest.mark.parametrize("sizes", [(1 << 20, 4 << 20), (4 << 20, 1 << 40)],
                         ids=["smaller-wins", "one-cannot-stage"])
def test_ranks_agree_on_what_to_stage(sizes):
    """A rank with a smaller staging area, or none (/dev/shm too small), decides for all."""
    started = len(ranks.STARTED)
    results = run_ranks("shm", 2, _stage_sizes_differ, sizes, timeout=30)
    for out, stage_bytes in results:
        assert stage_bytes == (1 << 20 if sizes[0] == 1 << 20 else 0)
        assert all((a == 3.0).all() for a in out)
    assert machine.segments(ranks.STARTED[started:]) == []  # every staging area was unlinked
