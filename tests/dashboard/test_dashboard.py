"""The dashboard: `mwrt.dashboard()` in a master serves status(), the errors and the timeline
to whoever shows the token; `mwrt dashboard --workers` from a shell, seen in a real headless
Chromium, shows two live workers and marks one lost when it is killed. Real daemons."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from tests.support.children import Lines
from tests.support.daemons import start_worker, stop_worker

import mwrt

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def fetch(url: str) -> tuple[int, bytes]:
    """(status, body) of a GET on the loopback, whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def state(board) -> dict:
    return json.loads(fetch(board.url.replace("/?", "/state?"))[1])


def wait_for(predicate, what: str, timeout: float = 60.0):
    """Poll `predicate` until it returns something true; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not seen within {timeout} s")


@pytest.fixture
def board():
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=2, timeout=60)
    dash = mwrt.dashboard(port=0, interval=0.2, quiet=True)
    yield dash
    dash.close()
    mwrt.shutdown()


def test_every_path_is_refused_without_the_token(board):
    base, token = board.url.split("/?token=")
    for path in ("/", "/state", "/static/app.js", "/static/uplot.iife.min.js", "/nothing"):
        code, body = fetch(base + path)
        assert code == 403 and b"missing or wrong token (got none)" in body, (path, body)
        code, body = fetch(f"{base}{path}?token={token[:-1]}x")
        assert code == 403 and b"(got another)" in body, (path, body)
    code, page = fetch(board.url)
    assert code == 200 and b"mwrt dashboard" in page and token.encode() in page
    assert board.url.startswith("http://127.0.0.1:")  # loopback unless asked otherwise
    assert fetch(f"{base}/static/uplot.iife.min.js?token={token}")[0] == 200


def test_a_burst_of_connections_waits_in_the_queue_not_for_a_retry():
    """Connections that come while the server accepts none are held by the kernel's queue:
    with socketserver's queue of 5 their SYNs were dropped, and each client waited a second
    or more for its retry (120 idle connections took 15 s to open)."""
    from mwrt.dashboard import server
    from mwrt.dashboard.history import History

    listening = server.Server(History(), "127.0.0.1", 0, "token")  # not accepting yet
    held = []
    try:
        for _ in range(2 * server.MAX_CONNECTIONS):
            held.append(socket.create_connection(listening.server_address[:2], timeout=5))
    finally:
        for sock in held:
            sock.close()
        listening.close()


def test_idle_connections_take_a_bounded_number_of_threads(board, monkeypatch):
    from mwrt.dashboard import server

    base = board.url.split("/?")[0]
    host, port = base[len("http://"):].rsplit(":", 1)

    def idle(n: int) -> list:
        return [socket.create_connection((host, int(port)), timeout=5) for _ in range(n)]

    def served() -> bool:
        try:
            return fetch(board.url)[0] == 200
        except OSError:  # closed at once while every slot is taken
            return False

    # Silent connections that stay: at most MAX_CONNECTIONS threads, not one each.
    monkeypatch.setattr(server.Handler, "timeout", 60)
    before, held = threading.active_count(), idle(120)
    try:
        time.sleep(1.0)  # every connection accepted (or closed) by now
        assert threading.active_count() <= before + server.MAX_CONNECTIONS
    finally:
        for sock in held:
            sock.close()
    # And a silent connection gives its slot back after Handler.timeout: the page is served
    # again while they are all still open.
    monkeypatch.setattr(server.Handler, "timeout", 1.0)
    held = idle(2 * server.MAX_CONNECTIONS)
    try:
        wait_for(served, "the page while idle connections hold every slot", 30)
    finally:
        for sock in held:
            sock.close()


def test_state_has_the_workers_their_series_errors_and_timeline(board):
    x = mwrt.dist_send(np.arange(1000, dtype=np.float32))
    with pytest.raises(mwrt.RemoteError):
        mwrt.remote(lambda t: 1 / 0)(x).numpy()
    def recorded():  # an op run until one shows: then the recording has begun
        float((x * 1).sum())
        return state(board)["timeline"]

    wait_for(recorded, "a timeline slice")
    for _ in range(20):
        x = x + 1
    assert float(x.sum()) == float(sum(range(1000))) + 20 * 1000
    def with_adds():
        now = state(board)
        return now if any(s["op"] == "add" for s in now["timeline"]) else None

    now = wait_for(with_adds, "the adds on the timeline")
    assert [n["node"] for n in now["nodes"]] == [0, 1]
    assert all(n["lost"] is None and n["pid"] for n in now["nodes"])
    (error,) = [e for e in now["nodes"][0]["errors"] if e["type"] == "ZeroDivisionError"]
    assert error["op"] == "remote" and error["message"] == "division by zero"
    series = now["series"]["0"]
    assert len(series["t"]) >= 2 and series["rss"][-1] > 0 and series["ops"][-1] is not None
    assert all(isinstance(busy, int) and busy >= 0 for busy in series["busy"])
    assert {s["node"] for s in now["timeline"]} == {0}  # node 1 ran nothing


def test_the_timeline_shows_the_masters_waits_at_their_lines(board):
    x = mwrt.dist_send(np.arange(4, dtype=np.float32))

    def waited():  # each float() waits for node 0: a slice in the master's lane
        float(x.sum())
        return [s for s in state(board)["timeline"] if s.get("lane") == "master: waits"]

    slices = wait_for(waited, "a wait on the timeline")
    assert any("float()" in s["op"] and "test_dashboard.py" in s["op"] for s in slices)
    assert all(s["end"] >= s["start"] and s["node"] == 0 for s in slices)


def test_a_user_profile_keeps_its_slices(board):
    """While mwrt.profile() records, the dashboard leaves the workers' recording to it."""
    wait_for(lambda: state(board)["sampled"], "a sample")
    with mwrt.profile() as prof:
        y = mwrt.ones(10)
        for _ in range(5):
            y = y * 2
        time.sleep(1.0)  # several samples pass while the block is open
        assert float(y.sum()) == 320.0
    assert sum(s["op"] == "multiply" for s in prof.slices) == 5, prof.slices


@pytest.fixture
def two_workers():
    """Two separately started daemons: [(process, HOST:PORT)], stopped after the test."""
    workers = [start_worker() for _ in range(2)]
    yield [(p, a.removeprefix("tcp://")) for p, a in workers]
    for process, _ in workers:
        stop_worker(process)


def shell_dashboard(workers) -> tuple[subprocess.Popen, str]:
    """`mwrt dashboard --workers A,B --port 0` in a process of its own: (process, its URL)."""
    shell = subprocess.Popen([sys.executable, "-m", "mwrt.cli", "dashboard", "--port", "0",
                              "--interval", "0.3", "--workers", ",".join(a for _, a in workers)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return shell, Lines(shell.stdout).until("http://", timeout=60).split()[-1]
    except AssertionError:
        shell.kill()
        shell.wait(30)
        raise


def test_the_shell_command_serves_the_workers_and_stops_on_sigterm(two_workers):
    shell, url = shell_dashboard(two_workers)
    try:
        base, token = url.split("/?token=")
        assert fetch(base + "/state")[0] == 403
        def both():
            now = json.loads(fetch(f"{base}/state?token={token}")[1])
            return now if len(now["nodes"]) == 2 else None

        now = wait_for(both, "two nodes")
        assert [n["address"].removeprefix("tcp://") for n in now["nodes"]] == \
            [a for _, a in two_workers]
        assert "mwrt.dashboard() in the script" in now["timeline_note"]
    finally:
        shell.send_signal(signal.SIGTERM)
        assert shell.wait(30) == 0


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="needs Debian's chromium and chromium-driver (apt-get install -y "
                           "chromium chromium-driver)")
def test_the_page_in_chromium_shows_two_workers_then_one_lost(two_workers, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip)")
    shell, url = shell_dashboard(two_workers)
    browser = None
    try:
        browser = _chromium(webdriver, tmp_path)
        browser.get(url)
        rows = wait_for(lambda: _rows(browser) if len(_rows(browser)) == 2 and all(
            state == "live" for state in _rows(browser).values()) else None, "two live rows")
        assert rows == {"0": "live", "1": "live"}
        two_workers[1][0].send_signal(signal.SIGKILL)
        rows = wait_for(lambda: _rows(browser, lost="1"), "node 1 shown lost")
        assert rows["0"] == "live" and "connection closed" in rows["1"], rows
        browser.get(url.split("?")[0])  # the same page without the token
        assert "missing or wrong token" in browser.find_element("tag name", "body").text
    finally:
        if browser is not None:
            browser.quit()
        shell.send_signal(signal.SIGTERM)
        assert shell.wait(30) == 0


def _rows(browser, lost: str | None = None) -> dict[str, str] | None:
    """The workers table as the page shows it: node -> its state cell's text (None while
    node `lost` is not shown lost)."""
    # Read in one script: the page replaces the rows every second, so elements found one
    # call earlier may be gone by the next.
    rows = dict(browser.execute_script(
        "return [...document.querySelectorAll('#workers tbody tr')]"
        ".map(row => [row.dataset.node, row.cells[1].textContent])"))
    return None if lost is not None and not rows.get(lost, "").startswith("lost") else rows


def _chromium(webdriver, tmp_path):
    """Headless Debian Chromium through chromedriver, with no network of its own."""
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}"):
        options.add_argument(flag)
    service = Service(CHROMEDRIVER, log_output=os.devnull)
    browser = webdriver.Chrome(service=service, options=options)
    browser.set_page_load_timeout(60)
    return browser


def test_gpu_memory_over_time_on_fake_gpus(monkeypatch):
    """A worker's GPUs (two fake ones) are listed, and the bytes a GPU tensor takes show in
    the GPU memory series."""
    mwrt.shutdown()
    monkeypatch.setenv("MWRT_FAKE_GPUS", "2")
    mwrt.init_master_worker(local_workers=1, timeout=60)
    board = mwrt.dashboard(port=0, interval=0.2, quiet=True, timeline=False)
    try:
        g = mwrt.ones(1_000_000, device=1)
        assert float(g.sum()) == 1e6

        def used():
            now = state(board)
            series = now["series"].get("0", {}).get("gpu_used", [])
            return now if series and series[-1] >= g.nbytes else None

        now = wait_for(used, "the GPU tensor's bytes in the series")
        assert [gpu["index"] for gpu in now["nodes"][0]["gpus"]] == [0, 1]
    finally:
        board.close()
        mwrt.shutdown()


def test_the_dashboard_outlives_a_shutdown_and_follows_the_next_session():
    """After mwrt.shutdown() the page says so once (with a count), and shows the workers of
    the next init_master_worker()."""
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=2, timeout=60)
    board = mwrt.dashboard(port=0, interval=0.1, quiet=True)
    try:
        wait_for(lambda: len(state(board)["nodes"]) == 2, "two nodes")
        mwrt.shutdown()
        notes = wait_for(lambda: [n for n in state(board)["notes"] if n["count"] >= 3],
                         "the same note three times")
        assert len(notes) == 1 and "not initialized" in notes[0]["message"], notes
        mwrt.init_master_worker(local_workers=1, timeout=60)
        wait_for(lambda: len(state(board)["nodes"]) == 1, "the new session's one node")
    finally:
        board.close()
        mwrt.shutdown()


@pytest.mark.quick
def test_the_timeline_is_sent_incrementally():
    """/state?since=CURSOR carries only the slices added after that cursor (the whole
    timeline every second was ~300 KB a poll); a cursor it does not know sends all again."""
    from mwrt.dashboard.history import History

    history, now = History(keep_slices=5), time.time()
    history.add([], now, [{"node": 0, "op": f"op{i}", "end": now} for i in range(3)])
    first = history.state()
    assert [s["op"] for s in first["timeline"]] == ["op0", "op1", "op2"]
    assert first["timeline_reset"] and first["timeline_cursor"] == 3
    assert history.state(since=3)["timeline"] == []
    history.add([], now, [{"node": 0, "op": f"op{i}", "end": now} for i in range(3, 7)])
    later = history.state(since=3)
    assert [s["op"] for s in later["timeline"]] == ["op3", "op4", "op5", "op6"]
    assert not later["timeline_reset"] and later["timeline_cursor"] == 7
    gone = history.state(since=1)  # op1 fell out of the 5 kept: all of it, said so
    assert gone["timeline_reset"] and [s["op"] for s in gone["timeline"]][0] == "op2"
    assert history.state(since=99)["timeline_reset"]  # a page from an earlier dashboard


@pytest.mark.quick
def test_the_page_asks_for_the_timeline_since_its_cursor(board):
    x = mwrt.dist_send(np.arange(10, dtype=np.float32))

    def recorded():
        float((x * 1).sum())
        return state(board)["timeline"]

    wait_for(recorded, "a timeline slice")
    cursor = state(board)["timeline_cursor"]
    since = json.loads(fetch(board.url.replace("/?", "/state?") + f"&since={cursor}")[1])
    assert not since["timeline_reset"] and since["timeline_cursor"] >= cursor
    assert len(since["timeline"]) == since["timeline_cursor"] - cursor
    app = fetch(board.url.replace("/?", "/static/app.js?"))[1].decode()
    assert '"&since=" + cursor' in app
