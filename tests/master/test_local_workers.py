"""Local daemons (init_master_worker(local_workers=N)) start together and stop together."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from mwrt.master.local import start_many, stop_all


def _ours() -> list[str]:
    """The daemons this test process started that still run."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    return [line for line in out.splitlines()
            if "mwrt.worker" in line and f"--parent-pid {os.getpid()} " in line + " "]


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
