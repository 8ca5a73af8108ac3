"""Hang reports, mwrt-launch's table of current calls, the collective timeout, and the 2017
proposal's spellings (recv(src), get_num_processes, collectives returning their tensor)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from tests.support import machine

import mwrt.distributed as dist
from mwrt.collective.group import ProcessGroup
from mwrt.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = os.path.join(ROOT, "tests", "programs")


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT, **extra)
    env.pop("MWRT_STATUS_DIR", None)
    return env


def _launch(program, *args, env=None, timeout=90):
    return subprocess.run([sys.executable, "-m", "mwrt.distributed.launch", "--nproc-per-node",
                           "2", os.path.join(PROGRAMS, program), *args], capture_output=True,
                          text=True, env=env or _env(), timeout=timeout)


def test_the_proposal_example_runs_unchanged():
    res = _launch("proposal.py")
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] proposal {rank} 2 ndarray float64 [0.0, 2.0, 4.0, 6.0]" \
            in res.stdout, res.stdout + res.stderr


def test_a_rank_that_never_calls_is_reported_then_times_out():
    # The report names the missing rank and the call well before the timeout fails it; the
    # timeout comes from MWRT_COLLECTIVE_TIMEOUT alone.
    timeout = machine.seconds(3, 10)  # the report comes at 1 s, the launcher's table with it
    res = _launch("hang.py", env=_env(MWRT_HANG_WARNING="1", MWRT_COLLECTIVE_TIMEOUT=str(timeout)))
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "[rank 0] mwrt: rank 0 has waited" in out, out
    line = next(ln for ln in out.splitlines() if "[rank 0] mwrt: rank 0 has waited" in ln)
    assert "all_reduce #1 on the default group [0, 1]" in line, line
    assert "waiting for ranks [1]" in line, line
    assert "rank 1: idle on the default group [0, 1] (no collective yet)" in line, line
    assert "all_to_all" not in line, line  # init_process_group's own, not the user's
    assert f"timed out after {timeout} s" in out and "MWRT_COLLECTIVE_TIMEOUT" in out, out
    # the launcher noticed the hang too, and printed its table
    assert "mwrt-launch: every rank's current call (rank 0 in all_reduce #1" in out, out


def test_a_recv_from_a_silent_rank_is_reported():
    timeout = machine.seconds(3, 10)
    res = _launch("hang.py", "recv", env=_env(MWRT_HANG_WARNING="1",
                                              MWRT_COLLECTIVE_TIMEOUT=str(timeout)))
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    line = next((ln for ln in out.splitlines() if "[rank 0] mwrt: rank 0 has waited" in ln), "")
    assert "in recv from rank 1 (tag 0) on the default group [0, 1], waiting for ranks [1]" \
        in line, out
    assert "rank 1: idle on the default group [0, 1] (no collective yet)" in line, line


def _pump(stream, lines):
    for line in stream:
        lines.append(line)


def _table(lines, start) -> str:
    """The last complete table (its header line and two rank lines) after lines[start]."""
    got = lines[start:]
    heads = [i for i, ln in enumerate(got) if "on SIGUSR1" in ln and i + 4 <= len(got)]
    return "".join(got[heads[-1]:heads[-1] + 4]) if heads else ""


def test_sigusr1_to_the_launcher_prints_every_ranks_call(tmp_path):
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-m", "mwrt.distributed.launch", "--nproc-per-node",
                             "2", os.path.join(PROGRAMS, "hang.py"), str(go)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(MWRT_HANG_WARNING="600"))
    out: list[str] = []
    err: list[str] = []
    pumps = [threading.Thread(target=_pump, args=a, daemon=True)
             for a in ((proc.stdout, out), (proc.stderr, err))]
    for t in pumps:
        t.start()
    try:
        deadline, table = time.monotonic() + 90, ""
        while time.monotonic() < deadline and not any("entering" in ln for ln in out):
            time.sleep(0.1)  # the launcher handles SIGUSR1 once its ranks run
        # The watchdog writes what each rank does within a few seconds: ask until it shows.
        while time.monotonic() < deadline and "all_reduce #1" not in table:
            start = len(err)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            table = _table(err, start)
        assert "waiting" in table and "all_reduce #1 on the default group [0, 1]" in table, \
            "".join(err)
        assert "idle" in table and "(no collective yet)" in table, table
        assert "all_to_all" not in table, table  # init_process_group's, not the user's
        go.write_text("")
        proc.wait(60)
        for t in pumps:
            t.join(10)
        assert proc.returncode == 0, "".join(out + err)
        assert "[rank 1] result [2.0, 2.0, 2.0, 2.0]\n" in out, out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)


def test_the_collective_timeout_variable_and_group_timeouts(monkeypatch):
    from mwrt import channels
    from mwrt.store import HashStore

    ch = channels.create("inproc", 0, 1, store=HashStore(), prefix="t")
    try:
        monkeypatch.setenv("MWRT_COLLECTIVE_TIMEOUT", "7")
        assert ProcessGroup(ch).timeout == 7.0
        assert ProcessGroup(ch, timeout=2).timeout == 2.0  # per group wins
        monkeypatch.setenv("MWRT_COLLECTIVE_TIMEOUT", "soon")
        with pytest.raises(ConfigError, match="MWRT_COLLECTIVE_TIMEOUT"):
            ProcessGroup(ch)
    finally:
        ch.close()


@pytest.mark.quick
def test_a_calls_time_counts_from_when_it_began_not_from_the_watchdogs_look(
        monkeypatch, tmp_path):
    """The status mwrt-launch's table and the hang reports read gives a call's start, not
    when the watchdog (which looks every few seconds) first saw it; a collective of mwrt's
    own (init_process_group's) is named as its, and leaves the group with none of the user's."""
    from mwrt import channels
    from mwrt.collective import api as C
    from mwrt.collective import watchdog
    from mwrt.store import HashStore

    monkeypatch.setenv("MWRT_STATUS_DIR", str(tmp_path))
    store = HashStore(timeout=30)
    chans = [channels.create("inproc", r, 2, store=store, timeout=30) for r in range(2)]
    groups = [ProcessGroup(ch, store=store, timeout=30) for ch in chans]

    def init_like():
        with watchdog.internal(groups[0], "init_process_group"):
            C.all_reduce(groups[0], np.ones(2))

    waiter = threading.Thread(target=init_like, daemon=True)
    try:
        waiter.start()
        deadline = time.monotonic() + machine.seconds(10, 60)
        while not watchdog.state_of(groups[0])[1] and time.monotonic() < deadline:
            time.sleep(0.001)
        entered = time.time()  # after the call began; the watchdog looks later, mostly
        rows: list = []
        while not rows and time.monotonic() < deadline:
            time.sleep(0.05)
            rows = [row for rec in watchdog.read_status(str(tmp_path)).values()
                    for row in rec["calls"] if row["busy"]]
        assert [row["what"] for row in rows] == [
            "init_process_group's all_reduce #0 on the default group [0, 1]"], rows
        assert rows[0]["since"] <= entered, (rows, entered)
        C.all_reduce(groups[1], np.ones(2))
        waiter.join(30)
        assert watchdog.state_of(groups[0])[2] == ("idle on the default group [0, 1] (no "
                                                   "collective yet)")
        assert watchdog.state_of(groups[1])[2].startswith("idle after all_reduce #0")
    finally:
        for ch in chans:
            ch.close()

def _recv_forms(rank):
    dist.init_process_group("tcp")
    assert dist.get_num_processes() == 2
    if rank == 0:
        dist.send(np.arange(6, dtype=np.float32).reshape(2, 3), 1)
        dist.send(np.arange(3, dtype=np.int64), 1, tag=5)
        dist.send(np.ones(4), 1)
        dist.send(np.arange(100_000, dtype=np.float32), 1)  # data after its header
        dist.send(np.zeros((0, 3), np.int16), 1)
        dist.isend(np.arange(5.0), 1).wait()
        dist.isend(np.arange(100_000.0), 1).wait()
        dist.send(np.arange(2.0), 1)
    else:
        new = dist.recv(0)
        assert new.dtype == np.float32 and new.tolist() == [[0, 1, 2], [3, 4, 5]], new
        into = np.zeros(3, np.int64)
        assert dist.recv(into, 0, tag=5) == 0 and into.tolist() == [0, 1, 2]  # torch's form
        with pytest.raises(ValueError, match=r"rank 0 sent float64\[4\] \(32 bytes\), this "
                                             r"array holds 24 bytes"):
            dist.recv(np.zeros(3), 0)
        big = dist.recv(0)
        assert big.dtype == np.float32 and big[-1] == 99_999
        empty = dist.recv(0)
        assert empty.shape == (0, 3) and empty.dtype == np.int16
        small, large = np.zeros(5), np.zeros(100_000)
        dist.irecv(small, 0).wait()
        dist.irecv(large, 0).wait()
        assert small.tolist() == [0, 1, 2, 3, 4] and large[-1] == 99_999
        # by keyword too (it said 'expected an array ..., got NoneType')
        assert dist.recv(src=0).tolist() == [0.0, 1.0]
        with pytest.raises(TypeError, match=r"recv: nothing to receive into and no sender "):
            dist.recv()
    t = np.full(2, rank + 1.0)
    assert dist.all_reduce(t) is t and t.tolist() == [3.0, 3.0]
    assert dist.broadcast(t, 0) is t
    assert dist.all_reduce(t, async_op=True).wait()
    dist.destroy_process_group()


def test_recv_of_a_rank_returns_a_new_array_and_torchs_form_still_works():
    dist.spawn(_recv_forms, nprocs=2, timeout=60)
