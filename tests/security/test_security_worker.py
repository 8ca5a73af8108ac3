"""What one master leaves on a worker cannot reach the next, and keys others could read are
refused (issue 27, items 8 and 9)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.support.daemons import start_worker, stop_worker
from tests.worker.test_quotas import finish, master_process

import mwrt
from mwrt.errors import AuthError
from mwrt.protocol.auth import keygen, load_key_file

# The same source in each master, so the shipped bytes are the same: module state kept on
# the worker between them would show as a count above 1.
COUNTING = """
SEEN = []
def count(t):
    SEEN.append(1)
    return t * len(SEEN)
print("COUNT", float(mwrt.remote(count)(mwrt.ones(1))), float(mwrt.remote(count)(mwrt.ones(1))))
"""


def test_shipped_functions_are_not_shared_across_masters(keyed_worker):
    _, address, master_key = keyed_worker
    outs = [finish(master_process(address, COUNTING, env={"MWRT_KEY_FILE": master_key}))
            for _ in range(3)]
    for out in outs:  # within a master its state lives on (1 then 2); never across masters
        assert "COUNT 1.0 2.0" in out, out[-2000:]


def _worker(key_file: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mwrt.worker", "--listen", "127.0.0.1:0",
                           "--key-file", key_file], capture_output=True, text=True, timeout=30,
                          check=False)


def test_a_key_file_others_may_read_is_refused_with_the_fix(tmp_path):
    worker_key, master_key = keygen(str(tmp_path / "keys"))
    for path in (worker_key, master_key):
        os.chmod(path, 0o644)
    refused = _worker(worker_key)
    assert refused.returncode != 0 and f"chmod 600 {worker_key}" in refused.stderr, refused
    with pytest.raises(AuthError, match=r"others may read or change it \(mode 0644"):
        mwrt.init_master_worker(["127.0.0.1:1"], key=master_key, timeout=5)
    os.chmod(master_key, 0o640)
    with pytest.raises(AuthError, match="chmod 600"):
        load_key_file(master_key)
    os.chmod(master_key, 0o600)
    assert load_key_file(master_key).path == master_key


def test_a_key_in_a_directory_anyone_may_write_is_refused(tmp_path):
    worker_key, _ = keygen(str(tmp_path / "keys"))
    os.chmod(tmp_path / "keys", 0o777)
    try:
        refused = _worker(worker_key)
        assert refused.returncode != 0 and "writable by anyone" in refused.stderr, refused
        assert f"chmod o-w {tmp_path / 'keys'}" in refused.stderr
        os.chmod(tmp_path / "keys", 0o1777)  # sticky, as /tmp: others cannot replace the file
        process, _ = start_worker("--key-file", worker_key)
        stop_worker(process)
    finally:
        os.chmod(tmp_path / "keys", 0o700)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    return child.pid


def _worker_with_its_own_shm() -> tuple[subprocess.Popen, str]:
    """A daemon in a mount namespace of its own, with a private /dev/shm (no other daemon on
    this machine reaps there): (process, address). Its /dev/shm is /proc/PID/root/dev/shm."""
    import shlex

    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        root, os.environ.get("PYTHONPATH")])))
    script = ("mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "
              + shlex.join([sys.executable, "-m", "mwrt.worker", "--listen", "127.0.0.1:0"]))
    process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    line = process.stdout.readline()
    if "listening on" not in line:
        process.kill()
        pytest.skip(f"no private /dev/shm here (unshare: {process.stderr.read()[:200]})")
    return process, line.split()[-1]


def test_the_shm_reaper_judges_only_this_users_segments_and_off_the_socket_thread():
    """Another user's files in /dev/shm, named like ours or not, are left alone; an orphan of
    ours is reaped; and masters are served meanwhile (their round trips are printed)."""
    import secrets
    import time

    import numpy as np

    dead = _dead_pid()
    mwrt.shutdown()
    process, address = _worker_with_its_own_shm()
    shm = f"/proc/{process.pid}/root/dev/shm"
    try:
        made = []
        for i in range(4000):  # a local user's flood: named as ours, dead pid or pid 1
            path = f"{shm}/mwrt-{dead if i % 2 else 1}-{secrets.token_hex(8)}"
            with open(f"{shm}/unnamed", "w"):
                pass
            os.chown(f"{shm}/unnamed", 65534, 65534)
            os.rename(f"{shm}/unnamed", path)  # named once it is theirs
            made.append(path)
        orphan = f"{shm}/mwrt-{dead}-{secrets.token_hex(8)}"
        with open(orphan, "w"):
            pass
        mwrt.init_master_worker([address], timeout=30)
        x, worst = mwrt.ones(4), 0.0
        deadline = time.monotonic() + 30
        while os.path.exists(orphan) and time.monotonic() < deadline:
            start = time.perf_counter()
            np.testing.assert_array_equal(x.numpy(), np.ones(4))
            worst = max(worst, time.perf_counter() - start)
        assert not os.path.exists(orphan), "the orphan segment of this user was not reaped"
        print(f"\n[figure] round trip while the reaper ran over 4,000 strangers' files: "
              f"worst {worst * 1e3:.1f} ms")
        assert all(os.path.exists(p) for p in made), "another user's file was removed"
        assert process.poll() is None
    finally:
        mwrt.shutdown()
        stop_worker(process)


def test_a_strangers_refused_connections_make_one_log_line_a_minute(caplog):
    """200 connections that fail a data channel's challenge: one line, naming the peer."""
    import logging
    import socket

    from mwrt import channels
    from mwrt.protocol.auth import generate_hmac_key
    from mwrt.store import HashStore

    caplog.set_level(logging.WARNING, logger="mwrt.channels")
    store = HashStore()
    channel = channels.create("tcp", 0, 2, store=store, host="127.0.0.1", key=generate_hmac_key())
    try:
        host, port = store.get("mwrt/tcp/0").decode().rsplit(":", 1)
        for _ in range(200):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.recv(64)
                sock.sendall(b"x" * 200)  # garbage where the HMAC answer should be
                try:
                    sock.recv(1)
                except OSError:
                    pass
    finally:
        channel.close()
    lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(lines) == 1 and "from 127.0.0.1:" in lines[0], lines


def test_mwrt_status_counts_every_bounded_table():
    mwrt.shutdown()
    process, address = start_worker()
    try:
        mwrt.init_master_worker([address], timeout=30)
        mwrt.ones(2).numpy()
        session = mwrt.status()[0]["worker"]["sessions"][0]
        for table in ("tensors", "bytes", "streams", "events", "events_fired", "waits",
                      "functions", "graphs", "graph_bytes", "queued_bytes"):
            assert table in session, (table, session)
    finally:
        mwrt.shutdown()
        stop_worker(process)


def test_a_refused_peer_is_named_by_its_own_kind_of_socket():
    """The worker's refusal log names a peer from the accepted descriptor: a Unix socket's
    (local workers are reached on one) was read as TCP's and gave an empty name."""
    import socket

    from mwrt.protocol.refusals import LOCAL, UNNAMED, peer_of_fd

    ours, theirs = socket.socketpair()
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, address = server.accept()
    with ours, theirs, server, client, accepted:
        assert peer_of_fd(ours.fileno()) == LOCAL
        assert peer_of_fd(accepted.fileno()) == f"127.0.0.1:{address[1]}"
    assert peer_of_fd(ours.fileno()) == UNNAMED  # closed: gone before it could be read
