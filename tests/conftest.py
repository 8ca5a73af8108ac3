"""Fixtures: real worker daemons on loopback, and a leak check after the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import mwrt


@pytest.fixture(scope="module")
def cluster():
    """Two local worker daemons for the tests of one module."""
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=2, timeout=30)
    yield mwrt
    mwrt.shutdown()


def quick_to_notice_losses(monkeypatch, workers: int):
    """A fresh session of `workers` local daemons whose deaths the master hears of in 3 s:
    for a fixture to yield from."""
    mwrt.shutdown()
    monkeypatch.setenv("MWRT_HEARTBEAT_TIMEOUT", "3")
    mwrt.init_master_worker(local_workers=workers, timeout=30)
    try:
        yield mwrt.master.cluster.current()
    finally:
        mwrt.shutdown()


def start_worker(*extra, env=None):
    """A worker daemon process on a free loopback port: (process, address)."""
    child_env = dict(os.environ, **(env or {}))
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, child_env.get("PYTHONPATH")]))
    process = subprocess.Popen([sys.executable, "-m", "mwrt.worker", "--listen", "127.0.0.1:0",
                                *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=child_env)
    line = process.stdout.readline()
    if "listening on" not in line:
        process.kill()
        raise RuntimeError(f"worker did not start: {line!r} {process.stderr.read()}")
    return process, line.split()[-1]


@pytest.fixture
def keyed_worker(tmp_path):
    """A worker daemon with a key: (process, address, path of the master's key file)."""
    from mwrt.protocol.auth import keygen

    worker_key, master_key = keygen(str(tmp_path / "keys"))
    mwrt.shutdown()
    process, address = start_worker("--key-file", worker_key)
    yield process, address, master_key
    mwrt.shutdown()
    stop_worker(process)


def stop_worker(process) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def _leftovers() -> list[str]:
    found = []
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, ppid, args = line.split(None, 2)
        if "mwrt.worker" in args and int(ppid) == os.getpid():
            found.append(f"worker process {pid}: {args}")
    if os.path.isdir("/dev/shm"):
        found += [f"/dev/shm/{name}" for name in os.listdir("/dev/shm") if "mwrt" in name]
    return found


_FD_SLACK = 16  # pytest, hypothesis and lazily opened modules keep a few files open


@pytest.fixture(scope="session", autouse=True)
def no_leaks():
    """After the suite: no worker process started by it, no mwrt shared-memory segment, and
    not many more open file descriptors than before it."""
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    yield
    mwrt.shutdown()
    leftovers = _leftovers()
    if "cupy" in sys.modules:  # CUDA keeps device files, eventfds, pipes and a socket open
        fds = None  # for the process's life once used: the count cannot tell them from ours
    if fds is not None and len(os.listdir("/proc/self/fd")) > fds + _FD_SLACK:
        now = sorted(os.listdir("/proc/self/fd"), key=int)
        targets = [os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}")
                   else "?" for fd in now]
        leftovers.append(f"{len(now)} open file descriptors (were {fds}): {targets}")
    if leftovers:
        pytest.fail("leaked after the test suite:\n" + "\n".join(leftovers))


def pytest_terminal_summary(terminalreporter):
    """The fault suite's one-line summary (tests/faultkit.py), when any of it ran."""
    import faultkit

    line = faultkit.TALLY.line()
    if line:
        terminalreporter.write_line(line)
