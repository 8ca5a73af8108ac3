"""Whether a local process still runs: used to name dead ranks and reap what they left."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """True if process `pid` runs on this host; a zombie (exited, not yet reaped) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc: assume alive rather than accuse
