"""How busy this machine is, for the bounds that only load breaks: a timeout that a quiet
machine meets with room to spare is scaled by the load, never fixed in seconds."""

from __future__ import annotations

from mwrt.procs import runnable_per_core


def slack() -> float:
    """How many runnable processes share each CPU now (the 1-minute load average per CPU), at
    least 1: 1 on a quiet machine, 7.5 at load 15 on 2 cores."""
    return runnable_per_core()


def seconds(quiet: float, most: float) -> float:
    """`quiet` seconds, enough on a quiet machine, scaled by slack() up to `most`, to a tenth
    of a second (as the error texts that name a timeout print it)."""
    return min(float(most), round(quiet * slack(), 1))
