"""`with mwrt.profile() as prof:` — a timeline of what ran where, as a Chrome/Perfetto trace,
and every time the master waited for a worker, by the line that caused it (waits.py)."""

from __future__ import annotations

import json
import threading
from collections import defaultdict

from ..protocol import wire
from . import waits
from .cluster import current
from .queries import synchronize

# Held while a block starts and while the dashboard swaps the workers' recording: a block
# that opens never has its recording restarted under it.
recording = threading.Lock()


class Profile:
    """Slices recorded by every worker while the block ran: (node, device, stream, op, times)."""

    open = 0  # blocks now recording: the dashboard's timeline leaves the workers to them

    def __init__(self):
        self.slices: list[dict] = []
        # Each wait of the master inside the block: {line, call, count, seconds} per line,
        # most first, and one {node, what, start, end, line, call} per wait.
        self.waits: list[dict] = []
        self.wait_slices: list[dict] = []
        self._before: dict | None = None
        self._since = 0.0

    def __enter__(self) -> Profile:
        with recording:
            Profile.open += 1
        synchronize()  # only work issued inside the block is recorded
        for node in current().nodes:
            node.issue(wire.Profile(id=next(node.ids), on=True, token=0))
            node.flush()
        with waits.LOG.lock:
            waits.LOG.recording += 1
        self._before, self._since = waits.LOG.snapshot(), waits.clock()
        return self

    def _take_waits(self) -> None:
        """The master's waits since the block began (before its own closing waits)."""
        self.waits = waits.by_line(waits.LOG.snapshot(), self._before)
        self.wait_slices = [{"node": node, "what": what, "start": start, "end": end,
                             "line": waits.line_text(site), "call": site[3]}
                            for node, what, start, end, site in waits.LOG.recent(self._since)]
        with waits.LOG.lock:
            waits.LOG.recording -= 1

    def __exit__(self, *exc) -> None:
        self._take_waits()
        try:
            cluster = current()
            if exc[0] is None:
                synchronize()
            for node in cluster.nodes:
                if node.lost is not None:
                    continue
                stop = wire.Profile(id=next(node.ids), on=False, token=next(node.tokens))
                reply, _ = node.request(stop, "the profile's timeline")
                self.slices += [as_slice(node.index, raw) for raw in reply.value]
        finally:
            Profile.open -= 1

    def export_chrome_trace(self, path: str) -> None:
        """Write the timeline as Chrome trace JSON: a process per node, a thread per stream."""
        events = []
        for node in sorted({s["node"] for s in self.slices}):
            events.append({"ph": "M", "name": "process_name", "pid": node,
                           "args": {"name": f"node {node}"}})
        for node, device, stream in sorted({(s["node"], s["device"], s["stream"])
                                            for s in self.slices}):
            events.append({"ph": "M", "name": "thread_name", "pid": node, "tid": stream,
                           "args": {"name": f"device {device} stream {stream}"}})
        for s in self.slices:
            events.append({"ph": "X", "name": s["op"], "pid": s["node"], "tid": s["stream"],
                           "ts": s["start"] * 1e6, "dur": (s["end"] - s["start"]) * 1e6,
                           "args": {"shapes": s["shapes"], "device": s["device"]}})
        if self.wait_slices:  # the master's waits, as a process of their own
            events.append({"ph": "M", "name": "process_name", "pid": -1,
                           "args": {"name": "master: waits for workers"}})
        for w in self.wait_slices:
            events.append({"ph": "X", "name": f"wait: {w['call'] or w['what']}", "pid": -1,
                           "tid": w["node"], "ts": w["start"] * 1e6,
                           "dur": (w["end"] - w["start"]) * 1e6,
                           "args": {"line": w["line"], "what": w["what"]}})
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)

    def waits_table(self, top: int = 15) -> str:
        """The lines that made the master wait for a worker, most waits first."""
        return waits.table(self.waits, top)

    def __str__(self) -> str:
        """Both tables: the ops that took the most time, and the lines that waited most."""
        return (f"{self.table()}\n\nthe master's waits for workers, by line:\n"
                f"{self.waits_table()}")

    def __repr__(self) -> str:
        """What the block recorded, in numbers (print() it for the tables)."""
        return (f"<mwrt Profile: {len(self.slices)} ops on {len({s['node'] for s in self.slices})}"
                f" node(s), {sum(w['count'] for w in self.waits)} waits of the master>")

    def table(self, top: int = 15) -> str:
        """The ops that took the most time, summed over nodes and streams."""
        totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for s in self.slices:
            totals[s["op"]][0] += 1
            totals[s["op"]][1] += s["end"] - s["start"]
        lines = [f"{'op':24} {'calls':>8} {'total ms':>10} {'mean µs':>10}"]
        for op, (calls, total) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
            lines.append(f"{op:24} {calls:>8} {total * 1e3:>10.3f} {total / calls * 1e6:>10.1f}")
        return "\n".join(lines)


def as_slice(node: int, raw) -> dict:
    """One op a worker recorded, (device, stream, op, start, end, shapes), as a dict."""
    device, stream, op, start, end, shapes = raw
    return {"node": node, "device": device, "stream": stream, "op": op, "start": start,
            "end": end, "shapes": [list(s) if s else s for s in shapes]}


def profile() -> Profile:
    """Record a timeline of every op the workers run inside the `with` block."""
    return Profile()
