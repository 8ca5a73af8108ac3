"""A named session outlives its master for MWRT_SESSION_GRACE seconds and is re-attached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from tests.support.daemons import start_worker, stop_worker

import mwrt
from mwrt.protocol import wire

pytestmark = pytest.mark.timeout(120)

FIRST_MASTER = textwrap.dedent("""
    import sys, time, numpy as np, mwrt
    mwrt.init_master_worker([sys.argv[1]], key=sys.argv[2], session="job")
    w = mwrt.dist_send(np.arange(5.0))
    w.name = "w"
    w += 1
    s = mwrt.Stream()
    with mwrt.stream(s):
        opt = mwrt.zeros(3)
    mwrt.save(sys.argv[3], {"opt": opt})
    print(float(w.sum()), flush=True)
    time.sleep(600)
""")


@pytest.fixture
def keyed(tmp_path):
    """A keyed worker that frees a silent master's session after 2 s: (address, master key)."""
    from mwrt.protocol.auth import keygen

    worker_key, master_key = keygen(str(tmp_path / "keys"))
    mwrt.shutdown()
    process, address = start_worker("--key-file", worker_key,
                                    env={"MWRT_LEASE_TIMEOUT": "2"})
    yield address, master_key
    mwrt.shutdown()
    stop_worker(process)


def _kill_first_master(address: str, key: str, path, grace: str) -> None:
    """Run FIRST_MASTER until it has made its tensors, then SIGKILL it."""
    master = subprocess.Popen([sys.executable, "-c", FIRST_MASTER, address, key, str(path)],
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, MWRT_SESSION_GRACE=grace))
    try:
        assert master.stdout.readline().strip() == "15.0"
    finally:
        master.send_signal(signal.SIGKILL)
        master.wait(30)
        master.stdout.close()


def _attach(address: str, key: str) -> None:
    """Connect as the named session, retrying while the worker still counts its master live."""
    deadline = time.monotonic() + 20
    while True:
        try:
            mwrt.init_master_worker([address], key=key, session="job")
            return
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_new_master_re_attaches_to_a_named_session(keyed, tmp_path, monkeypatch):
    address, key = keyed
    _kill_first_master(address, key, tmp_path, grace="60")
    time.sleep(3)  # past the worker's lease: only the grace keeps the session now
    monkeypatch.setenv("MWRT_SESSION_GRACE", "60")
    _attach(address, key)
    found = mwrt.attached()
    assert sorted(found) == ["opt", "w"]
    np.testing.assert_array_equal(found["w"].numpy(), np.arange(1.0, 6.0))
    assert (found["opt"].shape, found["opt"].dtype) == ((3,), np.float32)
    fresh = mwrt.ones(5) * 2  # new ids and streams do not collide with the old master's
    s = mwrt.Stream()
    with mwrt.stream(s):
        found["w"] += fresh
    np.testing.assert_array_equal(found["w"].numpy(), np.arange(3.0, 8.0))
    mwrt.shutdown()  # an explicit shutdown ends it: a next master finds nothing
    _attach(address, key)
    assert mwrt.attached() == {}


def test_without_a_grace_the_session_is_freed(keyed, tmp_path):
    address, key = keyed
    _kill_first_master(address, key, tmp_path, grace="0")
    mwrt.init_master_worker([address], key=key, session="job")  # no wait: a fresh session
    assert mwrt.attached() == {}
    deadline = time.monotonic() + 20
    while len(mwrt.status()[0]["worker"]["sessions"]) > 1:  # the lease frees the old one
        assert time.monotonic() < deadline, mwrt.status()[0]["worker"]["sessions"]
        time.sleep(0.2)


OWNER = textwrap.dedent("""
    import sys, time, numpy as np, mwrt
    mwrt.init_master_worker([sys.argv[1]], key=sys.argv[2], session="job")
    w = mwrt.dist_send(np.arange(5.0))
    w.name = "w"
    print(float(w.sum()), flush=True)
    while True:  # a live master: an op every 50 ms
        w += 0
        float(w.sum())
        time.sleep(0.05)
""")


def _owner(address: str, key: str, grace: str) -> subprocess.Popen:
    """A live master of session "job" (OWNER), once it has named its tensor."""
    master = subprocess.Popen([sys.executable, "-c", OWNER, address, key],
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, MWRT_SESSION_GRACE=grace))
    assert master.stdout.readline().strip() == "10.0"
    return master


def _sessions(address: str) -> list[dict]:
    """The sessions the worker holds, as `mwrt status` lists them (asked by a master of
    its own, which is one of them)."""
    return mwrt.status()[0]["worker"]["sessions"]


def test_a_second_master_is_refused_while_the_owner_lives(keyed, monkeypatch):
    address, key = keyed
    monkeypatch.setenv("MWRT_SESSION_GRACE", "60")
    owner = _owner(address, key, grace="60")
    try:
        for _ in range(5):  # each names the session, its master and when it may be re-attached
            with pytest.raises(ConnectionError, match=r"refused this master \(session 'job'\): "
                               r"session: named-\w+ is held by master \S+:\d+ .* it may be "
                               r"re-attached once that master has been silent for 2 s"):
                mwrt.init_master_worker([address], key=key, session="job")
    finally:
        owner.kill()
        owner.wait(30)
        owner.stdout.close()
    _attach(address, key)  # once the owner is gone, its session passes on
    np.testing.assert_array_equal(mwrt.attached()["w"].numpy(), np.arange(5.0))


def _ping_as(address: str, key: str, sid: bytes, stop: threading.Event) -> None:
    """Ping the worker on the heartbeat connection `sid`/hb until `stop`, as a key holder
    who knows a session's id but is not its master."""
    import zmq

    from mwrt.master.client import dealer
    from mwrt.protocol.auth import load_key_file

    context = zmq.Context()
    sock = dealer(context, sid + b"/hb", address, load_key_file(key))
    try:
        while not stop.is_set():
            sock.send_multipart(wire.encode(0, [wire.Ping(0)]))
            time.sleep(0.1)
    finally:
        sock.close(linger=0)
        context.term()


def test_pinging_a_dead_masters_heartbeat_neither_keeps_nor_blocks_its_session(keyed):
    from mwrt.master.cluster import _named_id
    from mwrt.protocol.auth import load_key_file

    address, key = keyed
    owner = _owner(address, key, grace="3")
    owner.kill()
    owner.wait(30)
    owner.stdout.close()
    sid = _named_id("job", load_key_file(key)).encode()
    stop = threading.Event()
    pinger = threading.Thread(target=_ping_as, args=(address, key, sid, stop))
    pinger.start()
    try:
        mwrt.init_master_worker([address], key=key)  # a bystander, to read the worker's sessions
        deadline = time.monotonic() + 20  # freed after lease (2 s) + grace (3 s), pings or not
        while any(s["id"] == sid[:8].decode() for s in _sessions(address)):
            assert time.monotonic() < deadline, _sessions(address)
            time.sleep(0.2)
    finally:
        stop.set()
        pinger.join()


def test_the_rightful_re_attach_is_served_while_a_key_holder_pings(keyed, monkeypatch):
    from mwrt.master.cluster import _named_id
    from mwrt.protocol.auth import load_key_file

    address, key = keyed
    owner = _owner(address, key, grace="60")
    owner.kill()
    owner.wait(30)
    owner.stdout.close()
    sid = _named_id("job", load_key_file(key)).encode()
    stop = threading.Event()
    pinger = threading.Thread(target=_ping_as, args=(address, key, sid, stop))
    pinger.start()
    try:
        monkeypatch.setenv("MWRT_SESSION_GRACE", "60")
        _attach(address, key)
        np.testing.assert_array_equal(mwrt.attached()["w"].numpy(), np.arange(5.0))
    finally:
        stop.set()
        pinger.join()


def test_an_unkeyed_worker_keeps_no_session_past_its_master(monkeypatch):
    mwrt.shutdown()
    process, address = start_worker(env={"MWRT_LEASE_TIMEOUT": "2"})
    try:
        monkeypatch.setenv("MWRT_SESSION_GRACE", str(7 * 86400))
        mwrt.init_master_worker([address], session="job")
        assert [s["grace"] for s in _sessions(address)] == [0.0]
    finally:
        mwrt.shutdown()
        stop_worker(process)


def test_a_worker_bounds_its_sessions_and_their_grace(tmp_path, monkeypatch):
    from mwrt.protocol.auth import keygen

    worker_key, key = keygen(str(tmp_path / "keys"))
    mwrt.shutdown()
    process, address = start_worker("--key-file", worker_key, env={
        "MWRT_LEASE_TIMEOUT": "2", "MWRT_MAX_SESSIONS": "2", "MWRT_MAX_SESSION_GRACE": "30"})
    try:
        owner = _owner(address, key, grace=str(7 * 86400))  # one session
        monkeypatch.setenv("MWRT_SESSION_GRACE", "0")
        mwrt.init_master_worker([address], key=key)  # the second
        assert sorted(s["grace"] for s in _sessions(address)) == [0.0, 30.0]
        extra = subprocess.run([sys.executable, "-c", "import sys, mwrt; mwrt."
                                "init_master_worker([sys.argv[1]], key=sys.argv[2])", address,
                                key], capture_output=True, text=True, timeout=60)
        assert "already holds 2 sessions (MWRT_MAX_SESSIONS = 2)" in extra.stderr, extra.stderr
        owner.kill()  # its session is kept for its grace, but yields to a live master
        owner.wait(30)
        owner.stdout.close()
        deadline = time.monotonic() + 20
        while subprocess.run([sys.executable, "-c", "import sys, mwrt; mwrt.init_master_worker("
                              "[sys.argv[1]], key=sys.argv[2]); print(len(mwrt.status()[0]"
                              "['worker']['sessions']))", address, key], capture_output=True,
                             text=True, timeout=60).stdout.strip() != "2":
            assert time.monotonic() < deadline, "the orphan did not yield to a live master"
            time.sleep(0.5)
    finally:
        mwrt.shutdown()
        stop_worker(process)


QUERIED_AS_IT_ENDS = textwrap.dedent("""
    import sys, threading, mwrt
    for round in range(int(sys.argv[1])):
        mwrt.init_master_worker(local_workers=1, timeout=60)
        stop, answers, refusals = threading.Event(), [0], []

        def ask():  # as the dashboard's sampler does, beside the program
            while not stop.is_set():
                try:
                    mwrt.status()
                    answers[0] += 1
                except Exception as exc:
                    refusals.append(f"{type(exc).__name__}: {exc}")
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        while not answers[0]:
            pass
        mwrt.shutdown()
        stop.set()
        asker.join(30)
        assert not asker.is_alive(), "the asking thread hung"
        odd = {r for r in refusals if not r.startswith("MwrtError")}
        assert not odd, odd
    print("ok", flush=True)
""")


def test_a_thread_asking_a_node_as_shutdown_closes_it_gets_an_error_not_an_abort():
    # A ZeroMQ socket closed while another thread read on it aborted the process (a
    # dashboard's sampler asked status() as mwrt.shutdown() ran: "Fatal Python error").
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    done = subprocess.run([sys.executable, "-c", QUERIED_AS_IT_ENDS, "12"], timeout=240,
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=root))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


THREADS_AT_EXIT = textwrap.dedent("""
    import threading, numpy as np, mwrt
    mwrt.init_master_worker(local_workers=2, timeout=60)

    def reads(i, going):
        with mwrt.node(i):
            x = mwrt.ones(1000)
        while True:
            x = x + 1
            float(x.sum())
            going.set()

    def makes(i, going):
        while True:
            with mwrt.node(i):
                y = mwrt.ones(10) * 2
            going.set()
            del y

    def big(i, going):
        with mwrt.node(i):
            x = mwrt.ones(2_000_000)
        while True:
            x.numpy()
            going.set()

    def moves(i, going):
        with mwrt.node(i):
            x = mwrt.ones(1000)
        while True:
            float(x.to(node=1 - i).sum())
            going.set()

    started = []
    for work in (reads, makes, big, moves):
        for i in range(2):
            started.append(threading.Event())
            threading.Thread(target=work, args=(i, started[-1]), daemon=True).start()
    assert all(going.wait(60) for going in started)
    print("main ends", flush=True)
""")


def test_daemon_threads_still_using_mwrt_end_quietly_with_the_program():
    # The at-exit shutdown closed the session under them: each printed a traceback of its
    # internals ("session has ended" after a zmq.Again, "not initialized", a worker "lost").
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    done = subprocess.run([sys.executable, "-c", THREADS_AT_EXIT], timeout=240,
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=root))
    assert done.returncode == 0 and done.stdout.strip() == "main ends", done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr, \
        done.stderr[-3000:]
