"""A named session outlives its master for MWRT_SESSION_GRACE seconds and is re-attached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import start_worker, stop_worker

import mwrt

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
