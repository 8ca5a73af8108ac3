"""Every wait of the master on a worker, counted at the user's line that caused it.

A program waits on the master only where it reads a value: `float(t)`, `bool(t)`,
`.numpy()`, the shape of a data-dependent result, `synchronize()`. A library that reads
twenty values makes twenty round trips, and this is where a user finds them: each wait is
counted at the first line outside mwrt that led to it (the user's, or the library's that
called mwrt), with the call that waited and the time it took. `mwrt.stats()` gives the
counts to a program, `mwrt.profile()` lists them per line, and while a profile or the
dashboard's timeline records, each wait is also kept as a slice of the master's timeline.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from types import CodeType, FrameType

from ..procs import ctrl_c_held
from .sites import line_of

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mwrt/
_KEPT = 20_000  # wait slices kept while recording (a profile reads those of its block)

# The call a user made, by the outermost mwrt function it went through.
_CALLS = {"__float__": "float()", "__bool__": "bool()", "__int__": "int()",
          "__index__": "an index", "__complex__": "complex()", "item": ".item()",
          "tolist": ".tolist()", "numpy": ".numpy()", "get": ".get()",
          "__array__": "np.asarray()", "__dlpack__": "np.from_dlpack()",
          "<lambda>": "a data-dependent shape", "spec": "a data-dependent shape",
          "__len__": "len() of a data-dependent shape",
          "__enter__": "a with block's start", "__exit__": "a with block's end"}


def caller(depth: int = 2) -> tuple[str, int, str, str]:
    """(file, line, function) of the first frame outside mwrt, and the mwrt call it made."""
    frame: FrameType | None = sys._getframe(depth)
    last: CodeType | None = None
    known = _IN_PACKAGE
    while frame is not None:
        code = frame.f_code
        inside = known.get(code.co_filename)
        if inside is None:
            inside = known[code.co_filename] = code.co_filename.startswith(_PACKAGE_DIR)
        if not inside:
            break
        last, frame = code, frame.f_back
    entry = last.co_name if last is not None else ""
    call = _CALLS.get(entry) or (f"{entry}()" if entry else "")
    if frame is None:
        return ("", 0, "", call)
    code, line = line_of(frame.f_code, frame.f_lasti)
    return (code.co_filename, line, code.co_name, call)


_IN_PACKAGE: dict = {}  # whether a source file is mwrt's, by its name (as in sites.py)


def site() -> tuple | None:
    """The user's line that a wait of this thread, which calls this, counts at: found while
    the worker works on the request (the walk up the stack is not in the round trip); None
    for the heartbeat's and the dashboard's own requests, which are not the program's."""
    if _get_ident() == _MAIN_IDENT:  # (threading.current_thread() is Python code)
        return caller(3)
    thread = threading.current_thread()
    found = getattr(thread, "mwrt_site", None)
    if found is None and not thread.name.startswith(_OWN_THREADS):
        found = caller(3)
    return found


class WaitLog:
    """The master's waits on its workers: totals, per line, and recent slices."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # (file, line, function, call) -> [count, seconds]; the totals are their sums
        self.lines: dict[tuple, list] = {}
        self.recording = 0  # profiles and timelines that want slices
        self.slices: deque = deque(maxlen=_KEPT)

    def note(self, node: int, what: str, start: float, end: float, site: tuple | None) -> None:
        """Count one wait on node `node` (wall-clock `start`, `end`) at `site`, its user's
        line (site(); None: not the program's wait)."""
        if site is None:
            return
        seconds = end - start
        with self.lock:
            counts = self.lines.get(site)
            if counts is None:
                counts = self.lines[site] = [0, 0.0]
            counts[0] += 1
            counts[1] += seconds
            if self.recording:
                self.slices.append((node, what, start, end, site))

    def snapshot(self) -> dict:
        """Copies of the counters: {site: (count, seconds)}, and the totals."""
        with self.lock:
            lines = {site: tuple(c) for site, c in self.lines.items()}
        return {"count": sum(c[0] for c in lines.values()),
                "seconds": sum(c[1] for c in lines.values()), "lines": lines}

    def recent(self, since: float) -> list[tuple]:
        """The slices (node, what, start, end, site) of waits that began after `since`."""
        with self.lock:
            return [s for s in self.slices if s[2] > since]


_OWN_THREADS = ("mwrt-heartbeat", "mwrt-dashboard")
_MAIN_IDENT, _get_ident = threading.main_thread().ident, threading.get_ident
LOG = WaitLog()


def by_line(now: dict, then: dict | None = None) -> list[dict]:
    """The waits per line between two snapshots (or since the start), most first."""
    before = then["lines"] if then else {}
    rows = []
    for site, (count, seconds) in now["lines"].items():
        count0, seconds0 = before.get(site, (0, 0.0))
        if count > count0:
            rows.append({"line": line_text(site), "call": site[3], "count": count - count0,
                         "seconds": seconds - seconds0})
    return sorted(rows, key=lambda r: (-r["count"], -r["seconds"]))


def line_text(site: tuple) -> str:
    """'file:line in function' of a site ('' for a wait with no frame outside mwrt)."""
    return f"{site[0]}:{site[1]} in {site[2]}" if site[0] else "(inside mwrt)"


def table(rows: list[dict], top: int = 15) -> str:
    """The per-line waits as text: count, total and mean time, the call, the line."""
    lines = [f"{'waits':>6} {'total ms':>10} {'mean µs':>9}  call at line"]
    for row in rows[:top]:
        lines.append(f"{row['count']:>6} {row['seconds'] * 1e3:>10.3f} "
                     f"{row['seconds'] / row['count'] * 1e6:>9.1f}  {row['call']} at "
                     f"{row['line']}")
    return "\n".join(lines)


def stats() -> dict:
    """The master's waits on its workers since the program started, for programs:
    `waits` (each a round trip), `wait_seconds`, and `lines`: per line that caused them,
    {line, call, count, seconds}, most first. Diff two calls to count a stretch of code."""
    now = LOG.snapshot()
    return {"waits": now["count"], "wait_seconds": now["seconds"], "lines": by_line(now)}


def clock() -> float:
    """The wall clock the workers' timelines use (time.time())."""
    return time.time()


# The uninterrupted() helpers still running, and the event each sets when done: shutdown
# waits for those a Ctrl-C left running before it says Bye (dict operations hold the GIL).
_RUNNING: dict[threading.Thread, threading.Event] = {}


def uninterrupted(fn, *args):
    """Run fn(*args) on a helper thread and wait for it here: a Ctrl-C lands in this wait,
    while the helper runs to the end, so what fn sends goes out whole (every node's part of
    a collective, a transfer's receive and its bytes) and no worker waits for the rest."""
    done, box = threading.Event(), []

    def run():
        try:
            box.append((True, fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
            box.append((False, exc))
        finally:
            _RUNNING.pop(helper, None)
            done.set()

    helper = threading.Thread(target=run, name="mwrt-uninterrupted", daemon=True)
    helper.mwrt_site = caller()  # type: ignore[attr-defined]  # its waits are the caller's
    # Known before it runs, and started whole: a Ctrl-C inside start() left a helper that
    # shutdown could not wait for, its parts sent after the Bye.
    with ctrl_c_held():
        _RUNNING[helper] = done
        try:
            helper.start()
        except BaseException:  # no thread to be had: nothing of fn runs
            _RUNNING.pop(helper, None)
            raise
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def finish_uninterrupted(timeout: float, heard: threading.Event | None = None) -> list[str]:
    """Wait up to `timeout` s for the uninterrupted() helpers still running, or until `heard`
    is set; the calls given up on ('all_reduce() at file:line in f'), no longer waited for."""
    deadline = time.monotonic() + timeout
    try:
        for done in list(_RUNNING.values()):
            # In slices: a Ctrl-C sets `heard` from its handler, which wakes no wait on `done`.
            while not done.wait(min(max(deadline - time.monotonic(), 0.0), 0.05)):
                if time.monotonic() >= deadline or (heard is not None and heard.is_set()):
                    break
    finally:  # forgotten even if a Ctrl-C ends this wait: a later shutdown waits no more
        left = [helper for helper, done in list(_RUNNING.items()) if not done.is_set()]
        for helper in left:
            _RUNNING.pop(helper, None)
    return [_call_text(helper.mwrt_site) for helper in left]  # type: ignore[attr-defined]


def _call_text(site: tuple) -> str:
    """'all_reduce() at file:line in f': the call that a helper runs, and its line."""
    return f"{site[3] or 'a call'} at {line_text(site)}"
