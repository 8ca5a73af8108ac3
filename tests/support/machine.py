"""How busy this machine is, for the bounds that only load breaks: a timeout that a quiet
machine meets with room to spare is scaled by the load, never fixed in seconds."""

from __future__ import annotations

import os

from mwrt.procs import runnable_per_core


def slack() -> float:
    """How many runnable processes share each CPU now (the 1-minute load average per CPU), at
    least 1: 1 on a quiet machine, 7.5 at load 15 on 2 cores. In a parallel run, at least the
    test processes per CPU: the load average takes a minute to count those just started."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(runnable_per_core(), workers / (os.cpu_count() or 1))


def seconds(quiet: float, most: float) -> float:
    """`quiet` seconds, enough on a quiet machine, scaled by slack() up to `most`, to a tenth
    of a second (as the error texts that name a timeout print it)."""
    return min(float(most), round(quiet * slack(), 1))


def segments(pids) -> list[str]:
    """The mwrt shared-memory segments in /dev/shm that processes `pids` made (their names
    begin mwrt-PID-): a test checks its own, as other test processes may run beside it."""
    if not os.path.isdir("/dev/shm"):
        return []
    prefixes = tuple(f"mwrt-{pid}-" for pid in pids)
    return sorted(f"/dev/shm/{name}" for name in os.listdir("/dev/shm")
                  if name.startswith(prefixes))
