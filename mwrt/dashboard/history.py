"""What the dashboard shows, kept between samples: each worker's latest report, its series over
time (memory, ops/s, MB/s), the errors seen and a timeline of recent ops per stream.

It reads only `mwrt.status()` rows (what `mwrt status --json` prints) and the slices
`mwrt.profile()` records; rates come from two reports of one worker, on its own clock.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque

SERIES = ("t", "rss", "host_used", "gpu_used", "busy", "ops", "mb_in", "mb_out")


class History:
    """The dashboard's state: thread-safe, written by the sampler and read by the server."""

    def __init__(self, keep_seconds: float = 300.0, timeline_seconds: float = 10.0,
                 keep_slices: int = 4000):
        self.keep_seconds, self.timeline_seconds = keep_seconds, timeline_seconds
        self.lock = threading.Lock()
        self.rows: list[dict] = []
        self.series: dict[int, dict[str, deque]] = {}
        self.previous: dict[int, dict] = {}  # each node's last worker report, for rates
        self.slices: deque = deque(maxlen=keep_slices)
        self.added = 0  # slices ever added: the page's cursor (state(since=))
        self.notes: deque = deque(maxlen=20)  # what went wrong on the dashboard's side
        self.timeline_note = ""
        self.sampled = 0.0

    def add(self, rows: list[dict], now: float | None = None, slices=()) -> None:
        """One sample: the status rows, and the profile slices recorded since the last."""
        now = time.time() if now is None else now
        with self.lock:
            self.rows, self.sampled = rows, now
            for row in rows:
                if row.get("worker"):
                    self._extend(row["node"], now, row["worker"])
            self.slices.extend(slices)
            self.added += len(slices)

    def note(self, message: str) -> None:
        """An error of the dashboard's own (a status() that failed), shown with the workers'."""
        with self.lock:
            if self.notes and self.notes[-1]["message"] == message:  # once, with its count
                self.notes[-1].update(time=time.time(), count=self.notes[-1]["count"] + 1)
            else:
                self.notes.append({"time": time.time(), "message": message, "count": 1})

    def _extend(self, node: int, now: float, worker: dict) -> None:
        """Append one point to `node`'s series, dropping points older than keep_seconds."""
        series = self.series.setdefault(node, {name: deque() for name in SERIES})
        ops, mb_in, mb_out = rates(worker, self.previous.get(node))
        self.previous[node] = worker
        gpus = worker.get("gpus") or []
        point = {"t": now, "rss": worker.get("rss"), "host_used": _used(worker),
                 "gpu_used": sum((g.get("total_memory") or 0) - (g.get("free_memory") or 0)
                                 for g in gpus) if gpus else None,
                 "busy": worker.get("streams_busy"), "ops": ops, "mb_in": mb_in,
                 "mb_out": mb_out}
        for name in SERIES:
            series[name].append(point[name])
        while series["t"] and series["t"][0] < now - self.keep_seconds:
            for name in SERIES:
                series[name].popleft()

    def state(self, since: int | None = None) -> dict:
        """Everything the page draws, as JSON-ready values. The timeline holds only the
        slices added after cursor `since` (the last state's "timeline_cursor"), for a page
        that keeps those it has: the whole of it every second was ~300 KB a poll; where
        `since` is not a cursor of these slices, all of it, and "timeline_reset" says so."""
        with self.lock:
            now = time.time()
            first = self.added - len(self.slices)  # the cursor of the oldest slice kept
            reset = since is None or not first <= since <= self.added
            new = itertools.islice(self.slices, 0 if since is None or reset else since - first,
                                   None)
            recent = [s for s in new if s["end"] >= now - self.timeline_seconds]
            return {"now": now, "sampled": self.sampled, "nodes": [_node(r) for r in self.rows],
                    "series": {str(n): {k: list(v) for k, v in s.items()}
                               for n, s in self.series.items()},
                    "timeline": recent, "timeline_seconds": self.timeline_seconds,
                    "timeline_cursor": self.added, "timeline_reset": reset,
                    "timeline_note": self.timeline_note, "notes": list(self.notes)}


def rates(now: dict, then: dict | None) -> tuple:
    """Ops/s, MB/s in and MB/s out between two reports of one worker (None without the first,
    or across a restart: its counters started again)."""
    if not then or then.get("incarnation") != now.get("incarnation"):
        return (None, None, None)
    seconds = now.get("uptime", 0) - then.get("uptime", 0)
    if seconds <= 0:
        return (None, None, None)
    return tuple((now.get(name, 0) - then.get(name, 0)) / seconds / scale
                 for name, scale in (("ops", 1), ("bytes_in", 1e6), ("bytes_out", 1e6)))


def _used(worker: dict) -> int | None:
    total, free = worker.get("host_total"), worker.get("host_free")
    return None if total is None or free is None else total - free


def _node(row: dict) -> dict:
    """A status row flattened for the page: the worker's report beside the session's view."""
    worker = row.get("worker") or {}
    return {"node": row["node"], "address": row["address"], "lost": row.get("lost"),
            "heartbeat_age": row.get("heartbeat_age"),
            **{k: worker.get(k) for k in ("hostname", "pid", "uptime", "rss", "host_free",
                                           "host_total", "streams_busy", "ops", "bytes_in",
                                           "bytes_out")},
            "sessions": worker.get("sessions", []), "gpus": worker.get("gpus", []),
            "errors": worker.get("errors", [])}
