"""`mwrt status` counts what workers did: ops run and bytes moved, inline and over the data
channel, in `mwrt.status()`, `--json` totals and `--watch` rates; sessions are listed by
master and go when it does. Real daemons, real masters, outputs parsed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from tests.support.daemons import start_worker, stop_worker
from tests.support.children import Lines, ctrl_c_reaches
from tests.cli.test_cli import run

import mwrt

COUNTED = ("ops", "bytes_in", "bytes_out")


@pytest.fixture(scope="module")
def daemon():
    """One separately started daemon (unkeyed, loopback) for the module: (process, HOST:PORT);
    its totals only grow, so the tests read what they did as differences."""
    process, address = start_worker()
    yield process, address.removeprefix("tcp://")
    stop_worker(process)


@pytest.fixture
def worker(daemon):
    """The module's daemon with no session of this master on it before and after the test."""
    mwrt.shutdown()
    yield daemon
    mwrt.shutdown()


def totals(node: int = 0) -> dict:
    return {name: mwrt.status()[node]["worker"][name] for name in COUNTED}


@pytest.mark.parametrize("size", [1000, 100_000], ids=["inline", "data-channel"])
def test_counters_grow_by_what_the_master_did(worker, size):
    """Sending `size` floats, 50 ops on them and reading them back: ops grow by at least 52,
    bytes in and out by at least the array's bytes, whichever path the bytes take."""
    mwrt.init_master_worker([worker[1]], timeout=30)
    before = totals()
    array = np.arange(size, dtype=np.float32)
    x = mwrt.dist_send(array, 0)
    for _ in range(50):
        x += 1
    assert np.array_equal(x.numpy(), array + 50)
    after = totals()
    grew = {name: after[name] - before[name] for name in COUNTED}
    assert grew["ops"] >= 52, grew
    assert grew["bytes_in"] >= array.nbytes and grew["bytes_out"] >= array.nbytes, grew
    mwrt.synchronize()
    assert totals()["ops"] >= after["ops"]  # totals never go back


def test_sessions_are_listed_by_master_and_their_counters_outlive_them(worker):
    """A master's session is in the worker's list while it runs, gone after shutdown(); what
    it did stays in the worker's totals."""
    mwrt.init_master_worker([worker[1]], timeout=30)
    x = mwrt.ones(1000, node=0)
    float(x.sum())
    (session,) = mwrt.status()[0]["worker"]["sessions"]
    assert session["master"].endswith(f":{os.getpid()}") and session["tensors"] >= 1
    done = totals()["ops"]
    mwrt.shutdown()
    mwrt.init_master_worker([worker[1]], timeout=30)
    report = mwrt.status()[0]["worker"]
    assert [s["id"] for s in report["sessions"]] != [session["id"]], report["sessions"]
    assert len(report["sessions"]) == 1 and report["ops"] >= done


def test_json_has_the_totals(worker):
    rows = json.loads(run("mwrt", "status", "--workers", worker[1], "--json").stdout)
    assert set(COUNTED) <= set(rows[0]["worker"]) and rows[0]["worker"]["streams_busy"] == 0
    assert [s["node"] for s in rows[0]["worker"]["sessions"]] == [0]  # its own session


def tables(lines: Lines, count: int) -> list[list[dict]]:
    """Read `count` tables of `mwrt status --watch` (blank-line separated), parsed by column."""
    out, rows = [], []
    while len(out) < count:
        line = lines.next()
        if not line:
            raise AssertionError(f"mwrt status --watch ended after {len(out)} tables")
        if line.strip():
            rows.append(line.rstrip("\n"))
            continue
        columns = list(re.finditer(r"\S+(?: \S+)*", rows[0]))  # names: one space inside
        ends = [c.start() for c in columns[1:]] + [None]
        out.append([{c.group(): row[c.start():end].strip() for c, end in zip(columns, ends)}
                    for row in rows[1:]])
        rows = []
    return out


def test_watch_shows_rates_while_a_master_runs_ops(worker):
    """`mwrt status --watch` while another master loops on ops: OPS/S becomes > 0 on a
    refresh; the first refresh has no rates yet; Ctrl-C ends it with status 0."""
    loop = ("import mwrt; mwrt.init_master_worker([%r], timeout=30); x = mwrt.ones(10, node=0)"
            "\nprint('running', flush=True)\nwhile True:\n    x += 1\n    float(x[0])"
            % worker[1])
    master = subprocess.Popen([sys.executable, "-c", loop], stdout=subprocess.PIPE, text=True)
    watch = subprocess.Popen([sys.executable, "-m", "mwrt.cli", "status", "--workers",
                              worker[1], "--watch", "0.3"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches())
    errors = Lines(watch.stderr)
    try:
        assert Lines(master.stdout).next() == "running\n"
        shown = Lines(watch.stdout)
        (first,) = tables(shown, 1)
        assert first[0]["OPS/S"] == "-" and first[0]["NODE"] == "0"
        for _ in range(50):  # each table is 0.3 s more of the loop
            (row,) = tables(shown, 1)[0]
            if row["OPS/S"] != "0":
                break
        assert float(row["OPS/S"]) > 0 and row["IN/S"].endswith("MB/s"), row
        assert row["SESSIONS"] == "2", row  # the loop's and the watcher's own
        watch.send_signal(signal.SIGINT)
        assert watch.wait(30) == 0, errors.rest()
    finally:
        for process in (watch, master):  # their pipes close at the end of their output
            if process.poll() is None:
                process.kill()
            process.wait(30)


def test_graph_replays_count_their_ops(worker):
    """A replayed graph's ops run on a prepared path; they are counted all the same."""
    mwrt.init_master_worker([worker[1]], timeout=30)
    x = mwrt.zeros(100, node=0)
    with mwrt.graph() as graph:
        for _ in range(10):
            x += 1
    float(x[0])
    before = totals()["ops"]
    for _ in range(5):
        graph.replay()
    assert float(x[0]) == 50  # capturing records the ops; each replay runs them
    assert totals()["ops"] - before >= 50


def test_counters_count_transfers_to_and_from_a_gpu():
    """Bytes staged through a GPU's pinned buffers (a fake GPU here) are counted as well."""
    mwrt.shutdown()
    process, address = start_worker(env={"MWRT_FAKE_GPUS": "1"})
    try:
        mwrt.init_master_worker([address.removeprefix("tcp://")], timeout=30)
        before = totals()
        array = np.arange(100_000, dtype=np.float32)
        x = mwrt.dist_send(array, 0, device=0)
        assert np.array_equal(x.numpy(), array)
        after = totals()
        assert after["bytes_in"] - before["bytes_in"] >= array.nbytes, (before, after)
        assert after["bytes_out"] - before["bytes_out"] >= array.nbytes, (before, after)
    finally:
        mwrt.shutdown()
        stop_worker(process)
