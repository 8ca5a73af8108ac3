"""Shared by the fault suite: the counts behind its summary line, and small process helpers."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

import mwrt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))


class Tally:
    """What the fault suite injected and saw; printed as one line after the run."""

    def __init__(self):
        self.lock = threading.Lock()
        self.injected = self.named = self.hangs = 0
        self.detections: list[float] = []
        self.bad_frames = self.crashes = 0
        self.fuzz_cases = 0
        self.load: str | None = None

    def fault(self, named: bool, detection: float | None = None, hang: bool = False) -> None:
        with self.lock:
            self.injected += 1
            self.named += bool(named)
            self.hangs += bool(hang)
            if detection is not None:
                self.detections.append(detection)

    def frames(self, sent: int, crashes: int = 0) -> None:
        with self.lock:
            self.bad_frames += sent
            self.crashes += crashes

    def state(self) -> dict:
        """The counts, for a parallel run's worker to send to the process that prints them."""
        with self.lock:
            return {k: v for k, v in vars(self).items() if k != "lock"}

    def merge(self, state: dict) -> None:
        """Add another process's counts (state()) to these."""
        with self.lock:
            for key, value in state.items():
                if key == "load":
                    self.load = self.load or value
                else:
                    setattr(self, key, getattr(self, key) + value)

    def line(self) -> str | None:
        if not (self.injected or self.bad_frames or self.fuzz_cases or self.load):
            return None
        parts = []
        if self.injected:
            median = statistics.median(self.detections) if self.detections else float("nan")
            worst = max(self.detections) if self.detections else float("nan")
            parts.append(f"{self.injected} injected, {self.named} named errors, {self.hangs} "
                         f"hangs, median detection {median:.2f} s (max {worst:.2f} s)")
        if self.bad_frames or self.fuzz_cases:
            parts.append(f"bad frames: {self.bad_frames} live + {self.fuzz_cases} decoder fuzz "
                         f"cases, {self.crashes} crashes")
        if self.load:
            parts.append(f"load: {self.load}")
        return "faults: " + "; ".join(parts)


TALLY = Tally()


def names(exc: BaseException, index: int) -> bool:
    """True if the error says which node or rank failed."""
    text = str(exc)
    if getattr(exc, "node", None) == index or getattr(exc, "peer", None) == index:
        return True
    return f"node {index}" in text or f"rank {index}" in text


def wait_until(predicate, timeout: float, step: float = 0.02) -> float | None:
    """Seconds until `predicate()` held, or None if it did not within `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    return None


def python(script: str, *args, env=None, **popen) -> subprocess.Popen:
    """A Python child running `script` with this checkout on its path; stdout piped, text."""
    child_env = dict(os.environ, **(env or {}))
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, child_env.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env, **popen)


def read_line(process: subprocess.Popen, timeout: float) -> str:
    """The child's next stdout line, or '' if none came within `timeout` seconds."""
    import select

    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline() if ready else ""


def reap(process: subprocess.Popen, timeout: float = 10.0) -> int:
    """Wait for a child we started; SIGKILL it (by pid) if it lingers; its exit code."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    return process.returncode


def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_targets(pid: int | str = "self") -> list[str]:
    """What a process's descriptors point at (sockets, pipes, files), for a leak's message."""
    out = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            out.append(f"{fd}->{os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except OSError:
            pass
    return out


def kill(process, sig: int) -> None:
    os.kill(process.pid, sig)


SIGNALS = [signal.SIGKILL, signal.SIGTERM]


def start_logged_worker(log_path, *extra, env=None):
    """A worker daemon whose log goes to a file, not a pipe nobody drains (a full pipe would
    block its logging, and with it the daemon): (process, address)."""
    child_env = dict(os.environ, **(env or {}))
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, child_env.get("PYTHONPATH")]))
    log = open(log_path, "w")
    try:
        process = subprocess.Popen([sys.executable, "-m", "mwrt.worker", "--listen",
                                    "127.0.0.1:0", *extra], stdout=subprocess.PIPE, stderr=log,
                                   text=True, env=child_env)
    finally:
        log.close()
    line = read_line(process, 30)
    if "listening on" not in line:
        process.kill()
        process.wait()
        raise RuntimeError(f"worker did not start: {line!r}; see {log_path}")
    return process, line.split()[-1]


def still_talks(rank0, rank2) -> None:
    """Ranks 0 and 2 of a channel still exchange 1000 ints (after a fault near them)."""
    out, got = np.arange(1000, dtype=np.int32), np.zeros(1000, np.int32)
    work = rank2.irecv(got, 0, tag=99)
    rank0.send(out, 2, tag=99)
    work.wait(5)
    np.testing.assert_array_equal(out, got)
