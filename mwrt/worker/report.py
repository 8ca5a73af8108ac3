"""What a daemon tells `mwrt status`: its process, host memory, GPUs, sessions and counters.

The counters (stream commands run, bytes in and out, inline and over the data channel)
are plain ints on each stream executor, written only by the thread running its commands;
this sums them on the socket thread, with those of sessions that ended, so the totals
only grow and two snapshots give rates (`mwrt status --watch`).
"""

from __future__ import annotations

import os
import socket
import time

COUNTERS = ("ops", "bytes_in", "bytes_out")
ERRORS_KEPT = 10  # failed ops a report lists, newest last (the dashboard shows them)


def worker(daemon) -> dict:
    """The daemon's report: process, host memory, sessions, GPUs, totals since it started."""
    from .. import arrays

    live = list(daemon.sessions.values())
    sessions = [_session(s) for s in live]
    totals = dict(daemon.retired)
    for session in live:
        add_counters(totals, session)
    return {"pid": os.getpid(), "hostname": socket.gethostname(),
            "incarnation": daemon.incarnation, "uptime": time.monotonic() - daemon.started,
            "rss": _status_bytes("/proc/self/status", "VmRSS"),
            "host_free": _status_bytes("/proc/meminfo", "MemAvailable"),
            "host_total": _status_bytes("/proc/meminfo", "MemTotal"),
            "sessions": sessions, "streams_busy": sum(s["streams_busy"] for s in sessions),
            "gpus": arrays.devices(), "errors": list(daemon.errors), **totals}


def _session(session) -> dict:
    """One session as `mwrt status` lists it: whose, which node, what it holds and runs.
    Its id only begins: the whole names the session's connections to any other master."""
    executors = list(session.streams.values())
    return {"id": session.id[:8], "master": session.master, "node": session.node,
            **session.stats(), "streams_busy": sum(not ex.idle() for ex in executors),
            "idle": time.monotonic() - session.last_seen, "grace": session.grace}


def note_error(session, info: dict) -> None:
    """Keep a failed op's summary on the daemon (its first line only: no traceback, no data)."""
    message = str(info.get("message", "")).strip().splitlines() or [""]
    session.daemon.errors.append({
        "time": time.time(), "session": session.id[:8], "node": session.node,
        "stream": info.get("stream"), "op": info.get("op"), "type": info.get("type"),
        "message": message[0][:300]})


def add_counters(totals: dict, session) -> None:
    """Add the stream counters of `session` (COUNTERS) into `totals`."""
    for executor in list(session.streams.values()):
        for name in COUNTERS:
            totals[name] += getattr(executor, name)


def _status_bytes(path: str, field: str) -> int | None:
    """A "Field: N kB" line of a /proc file, in bytes (None where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
