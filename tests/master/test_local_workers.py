"""Local daemons (init_master_worker(local_workers=N)) start together and stop together, each
forked by the master's zygote (mwrt.master.forked) unless MWRT_FORK_LOCAL_WORKERS=0."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import mwrt
from mwrt.master import forked
from mwrt.master.local import start_many, stop_all


def _ours() -> list[str]:
    """The daemons this test process started that still run (not the zygote, which stays)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return [line for line in out.splitlines()
            if "mwrt.worker" in line and f"--parent-pid {os.getpid()} " in line + " "
            and int(line.split()[0]) not in forked.zygote_pids()]


def _parent_and_name(pid: int) -> tuple[int, str]:
    with open(f"/proc/{pid}/stat") as stat:
        ppid = int(stat.read().rpartition(")")[2].split()[1])
    with open(f"/proc/{pid}/comm") as comm:
        return ppid, comm.read().strip()


def _wait_none_left(timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while _ours() and time.monotonic() < deadline:
        time.sleep(0.1)
    return _ours()


def test_daemons_start_together_and_each_says_its_address():
    counted = []
    workers = start_many(6, 60.0, started=counted.append)
    try:
        addresses = [w.address for w in workers]
        assert len(set(addresses)) == 6 and all(a.startswith("tcp://127.0.0.1:") for a in addresses)
        assert sum(counted) == 6
    finally:
        stop_all(workers)
    assert _wait_none_left() == []


def test_a_daemon_that_does_not_start_is_named_and_none_is_left():
    with pytest.raises(ConnectionError, match=r"local worker \d+ of 5 \(pid \d+\): did not "
                                              r"start within [\d.]+ s \(the timeout scaled by the "
                                              r"machine's load"):
        start_many(5, 0.01)
    assert _wait_none_left() == []


def test_a_daemon_that_exits_says_its_code(tmp_path):
    with pytest.raises(ConnectionError, match=r"local worker \(pid \d+\): exited with code "
                                              r"\d+ before listening"):
        start_many(1, 60.0, key_file=str(tmp_path / "no-such.key"))
    assert _wait_none_left() == []


def test_daemons_are_forked_by_one_zygote_and_stop_as_children_do(monkeypatch):
    monkeypatch.setenv("MWRT_FORK_LOCAL_WORKERS", "1")
    workers = start_many(3, 60.0)
    try:
        assert all(isinstance(w.process, forked.Forked) for w in workers)
        parents = {_parent_and_name(w.process.pid) for w in workers}
        assert len(parents) == 1 and parents <= {(z, "mwrt-worker") for z in forked.zygote_pids()}
        assert workers[0].process.poll() is None
        workers[0].process.kill()
        assert workers[0].process.wait(30) == -9  # its status, from the zygote that reaped it
    finally:
        stop_all(workers)
    assert [w.process.returncode for w in workers[1:]] == [0, 0]  # SIGTERM: a clean stop
    assert _wait_none_left() == [] and parents.pop()[0] in forked.zygote_pids()  # it stays


def test_each_forked_daemon_reads_the_settings_of_its_own_start(monkeypatch):
    monkeypatch.setenv("MWRT_FORK_LOCAL_WORKERS", "1")
    start_many(1, 60.0)[0].stop()  # a zygote that started before the setting below
    monkeypatch.setenv("MWRT_FAKE_GPUS", "2")
    mwrt.init_master_worker(local_workers=2)
    try:
        gpu = mwrt.ones(3, device=1)  # only a daemon that read MWRT_FAKE_GPUS has a GPU 1
        np.testing.assert_array_equal(gpu.numpy(), np.ones(3, np.float32))
        # Each daemon draws its own numbers: not a copy of the zygote's generator.
        draw = mwrt.remote(lambda a: a + np.random.random(a.shape), spec=((4,), np.float64))
        values = [draw(mwrt.zeros(4, dtype=np.float64, node=i)).numpy() for i in (0, 1)]
        assert not np.array_equal(values[0], values[1])
    finally:
        mwrt.shutdown()


def test_a_zygote_is_not_used_where_its_imports_saw_another_environment(monkeypatch):
    monkeypatch.setenv("MWRT_FORK_LOCAL_WORKERS", "1")
    start_many(1, 60.0)[0].stop()
    first = forked.zygote_pids()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # read by NumPy's import, in the zygote
    worker, = start_many(1, 60.0)
    try:
        assert _parent_and_name(worker.process.pid)[0] in forked.zygote_pids() - first
    finally:
        worker.stop()
    assert _wait_none_left() == []


def test_without_forking_each_daemon_is_a_fresh_process(monkeypatch):
    monkeypatch.setenv("MWRT_FORK_LOCAL_WORKERS", "0")
    worker, = start_many(1, 60.0)
    try:
        assert isinstance(worker.process, subprocess.Popen)
        assert _parent_and_name(worker.process.pid)[0] == os.getpid()
    finally:
        worker.stop()


def test_importing_the_daemon_reads_no_setting():
    # The zygote imports the daemon's modules once, for daemons started later with other
    # settings: a setting read at import would be the zygote's, not the daemon's.
    code = """
import os, sys
read = []
class Recording(type(os.environ)):
    def __getitem__(self, key):
        read.append(key)
        return super().__getitem__(key)
os.environ.__class__ = Recording
from mwrt.worker import zygote
zygote._preload()
print(sorted({k for k in read if k.startswith("MWRT_")}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, MWRT_FAKE_GPUS="1"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_a_zygote_that_died_leaves_fresh_processes_to_start_daemons(monkeypatch):
    monkeypatch.setenv("MWRT_FORK_LOCAL_WORKERS", "1")
    monkeypatch.setenv("TEST_ZYGOTE", "doomed")  # a zygote of this test's own
    monkeypatch.setattr(forked, "_failed", False)  # (restored after: others fork on)
    start_many(1, 60.0)[0].stop()
    os.kill(list(forked._zygotes.values())[-1].process.pid, 9)  # the newest: this test's
    worker, = start_many(1, 60.0)
    try:
        assert isinstance(worker.process, subprocess.Popen) and forked._failed
    finally:
        worker.stop()
    assert _wait_none_left() == []
