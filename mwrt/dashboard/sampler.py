"""The dashboard's background thread: every `interval` seconds, `mwrt.status()` of the current
session and, where asked, the timeline the workers recorded for it since the last sample."""

from __future__ import annotations

import logging
import threading

from ..errors import MwrtError
from ..master import profile as profiling
from ..master import waits
from ..master.cluster import current
from ..master.queries import status
from ..protocol import wire
from .history import History

log = logging.getLogger("mwrt.dashboard")

NO_TIMELINE = ("the timeline shows this master's own ops: open the dashboard with "
               "mwrt.dashboard() in the script that runs them")
PROFILING = "paused while a mwrt.profile() block records the timeline"
SLICES = 2000  # ops per node and sample kept for the timeline


class Sampler(threading.Thread):
    """Fills a History from status() (and the session's profile) until stop()."""

    def __init__(self, history: History, interval: float, timeline: bool):
        super().__init__(name="mwrt-dashboard-sampler", daemon=True)
        self.history, self.interval, self.timeline = history, interval, timeline
        self.recording: set[int] = set()  # nodes whose profile this thread turned on
        self.waits_since = 0.0  # the master's waits after this went to the timeline already
        self.stopping = threading.Event()
        history.timeline_note = "" if timeline else NO_TIMELINE

    def run(self) -> None:
        while True:
            self.sample()
            if self.stopping.wait(self.interval):
                break
        self._stop_recording()

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread (and the profile it started on the workers) within `timeout`."""
        self.stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout)

    def sample(self) -> None:
        """One status() and timeline read; a failure is shown on the page, never raised."""
        try:
            rows = status()
        except Exception as exc:  # noqa: BLE001 - the page outlives any failure, and shows it
            self.history.note(f"status(): {type(exc).__name__}: {exc}")
            return
        slices = []
        if self.timeline:
            try:
                slices = self._slices()
            except Exception as exc:  # noqa: BLE001 - as above
                self.history.note(f"timeline: {type(exc).__name__}: {exc}")
        self.history.add(rows, slices=slices)

    def _slices(self) -> list[dict]:
        """What each live node ran since the last call; starts its recording the first time.

        The session's profile is swapped out (stop, then start again) on the socket thread
        of each worker, so no op waits for it. A user's own mwrt.profile() wins: while one
        is open this reads nothing and leaves the recording to it.
        """
        with profiling.recording:
            return self._swap() + self._waits()

    def _waits(self) -> list[dict]:
        """The master's waits on its workers since the last call, as a lane of their own."""
        if not self.waits_since:  # the first call: start keeping them
            with waits.LOG.lock:
                waits.LOG.recording += 1
            self.waits_since = waits.clock()
            return []
        recent = waits.LOG.recent(self.waits_since)
        if recent:
            self.waits_since = max(s[2] for s in recent)
        return [{"node": node, "device": -1, "stream": -1, "lane": "master: waits",
                 "op": f"wait for node {node}: {site[3] or what} at {waits.line_text(site)}",
                 "start": start, "end": end, "shapes": []}
                for node, what, start, end, site in recent[-SLICES:]]

    def _swap(self) -> list[dict]:
        """_slices() under the profile lock."""
        if profiling.Profile.open:
            self.recording.clear()  # its __exit__ turns the recording off
            self.history.timeline_note = PROFILING
            return []
        self.history.timeline_note = ""
        slices = []
        for node in current().nodes:
            if node.lost is not None:
                continue
            if node.index in self.recording:
                stop = wire.Profile(id=next(node.ids), on=False, token=next(node.tokens))
                reply, _ = node.request(stop, "the dashboard's timeline")
                # The newest only: the page draws at most this many, and converting every
                # op of a busy second would hold the GIL the master's own thread needs.
                slices += [profiling.as_slice(node.index, s) for s in reply.value[-SLICES:]]
            node.issue(wire.Profile(id=next(node.ids), on=True, token=0))
            node.flush()
            self.recording.add(node.index)
        return slices

    def _stop_recording(self) -> None:
        """Turn off the profile this thread started, on nodes still there."""
        if self.waits_since:
            with waits.LOG.lock:
                waits.LOG.recording -= 1
            self.waits_since = 0.0
        try:
            nodes = current().nodes
        except (MwrtError, RuntimeError):
            return
        for node in nodes:
            if node.index in self.recording and node.lost is None and not node.closed:
                try:
                    stop = wire.Profile(id=next(node.ids), on=False, token=next(node.tokens))
                    node.request(stop, "the dashboard's last timeline", 5.0)
                except (MwrtError, ConnectionError, TimeoutError) as exc:
                    log.debug("dashboard: profile not stopped on node %s: %s", node.index, exc)
        self.recording.clear()
