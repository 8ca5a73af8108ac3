"""Who gets in: CURVE keys on the command socket, refusals logged, the daemon serving on."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

import msgspec
import numpy as np
import pytest
import zmq
from tests.support.daemons import start_worker, stop_worker
from tests.support.standins import HangsUp

import mwrt
from mwrt.errors import AuthError
from mwrt.protocol import wire
from mwrt.protocol.auth import keygen


def works(key) -> None:
    """The right master still computes, shipped functions included."""
    mwrt.shutdown()
    mwrt.init_master_worker([ADDRESS[0]], key=key, timeout=5)
    assert float(mwrt.remote(lambda t: t * 2)(mwrt.ones(1))) == 2.0
    mwrt.shutdown()


ADDRESS = [None]


@pytest.fixture
def keyed(keyed_worker):
    """A keyed daemon of the test's own, for a test that stops it to read its log."""
    ADDRESS[0] = keyed_worker[1]
    return keyed_worker


@pytest.fixture(scope="module")
def shared_keyed_daemon(tmp_path_factory):
    """One keyed daemon for the tests that attack it and then check it serves on."""
    worker_key, master_key = keygen(str(tmp_path_factory.mktemp("keys") / "k"))
    process, address = start_worker("--key-file", worker_key)
    yield process, address, master_key
    mwrt.shutdown()
    stop_worker(process)


@pytest.fixture
def served(shared_keyed_daemon):
    """The module's keyed daemon, with no session of this master before and after the test."""
    mwrt.shutdown()
    ADDRESS[0] = shared_keyed_daemon[1]
    yield shared_keyed_daemon
    mwrt.shutdown()


def test_keygen_writes_private_key_files(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mwrt.worker", "keygen", str(tmp_path / "k")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    for name in ("worker.key", "master.key"):
        mode = stat.S_IMODE(os.stat(tmp_path / "k" / name).st_mode)
        assert mode == 0o600, oct(mode)
    again = subprocess.run([sys.executable, "-m", "mwrt.worker", "keygen", str(tmp_path / "k")],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 2 and "exists" in again.stderr


def test_right_key_gets_in(served):
    works(served[2])


def refusals(process) -> list[str]:
    """The worker's log lines about refused masters, once it has stopped."""
    process.terminate()
    _, log = process.communicate(timeout=10)
    return [line for line in log.splitlines() if "refused" in line]


def test_master_without_a_key_is_refused(keyed):
    with pytest.raises(AuthError, match="requires a key and this master has none"):
        mwrt.init_master_worker([keyed[1]], timeout=5)
    assert keyed[0].poll() is None
    works(keyed[2])
    # Three sockets knocked, and retried: one line at most (none when the master hung up
    # before the worker read its greeting), naming the master where its address was readable.
    lines = refusals(keyed[0])
    assert len(lines) <= 1 and all("offered no key" in line or "hung up" in line
                                   for line in lines), lines


def test_a_keyless_master_is_refused_each_time_without_hanging(served):
    """A refusal that came before the Hello was sent left the master's socket no connection
    to queue it on, and its send waited forever (`mwrt status` without --key hung, one try in
    a few on loopback); each try now raises at once."""
    for _ in range(30):
        with pytest.raises(AuthError, match="requires a key and this master has none"):
            mwrt.init_master_worker([served[1]], timeout=5)
    works(served[2])


def test_keyed_master_and_keyless_worker_say_which_lacks_the_key(keyed_worker):
    mwrt.shutdown()
    process, address = start_worker()
    try:
        with pytest.raises(AuthError, match="has no key, but this master offers one"):
            mwrt.init_master_worker([address], key=keyed_worker[2], timeout=5)
    finally:
        lines = refusals(process)
    # The master may hang up before the worker reads its greeting: then there is no refusal.
    assert len(lines) <= 1 and all("this worker has none" in line for line in lines), lines


@pytest.mark.parametrize("which", ["other cluster", "unlisted master"])
def test_wrong_or_stale_key_is_refused_and_logged(keyed, tmp_path, which):
    from mwrt.protocol.auth import KeyFile, load_key_file

    if which == "other cluster":  # a key file made for other workers (or before a re-keygen)
        _, other_master = keygen(str(tmp_path / "other"))
        expected_log = "did not decrypt"
    else:  # knows the worker's public key, but its own key is not listed on the worker
        worker_public = load_key_file(keyed[2]).trusted
        public, secret = zmq.curve_keypair()
        other_master = KeyFile(public, secret, worker_public, b"k" * 32)
        expected_log = "refused a master at 127.0.0.1 whose CURVE key is not in the key file"
    with pytest.raises(AuthError, match="refused this master's key .the keys do not match"):
        mwrt.init_master_worker([keyed[1]], key=other_master, timeout=5)
    works(keyed[2])
    lines = refusals(keyed[0])
    assert len(lines) == 1 and expected_log in lines[0], lines


def test_a_hang_up_is_called_a_key_refusal_only_when_the_worker_refuses_the_key(served):
    # A worker that hangs up mid-handshake and then answers no probe (one dying: its listener
    # outlives its other sockets), or hangs up and then takes this master's key: neither
    # refused the key, and both were said to.
    for then, seen in ((None, "a second connection had no answer within 2 s"),
                       (ADDRESS[0], "a second connection .with the same key, if any. got in")):
        worker = HangsUp(then=then)
        try:
            with pytest.raises(ConnectionError,
                               match=f"hung up during the handshake, (and|but) {seen}") as failed:
                mwrt.init_master_worker([worker.address], key=served[2], timeout=5)
        finally:
            worker.close()
        assert not isinstance(failed.value, AuthError), failed.value
    works(served[2])


def test_plain_zmq_client_gets_nothing_and_daemon_serves_on(served):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"intruder/tx")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(served[1])
    body = msgspec.msgpack.encode([[wire.code(wire.Hello), 1, "s", "intruder", 0]])
    sock.send_multipart([wire.envelope(1, body)])
    assert not sock.poll(1000)
    sock.close(0)
    ctx.term()
    works(served[2])


def test_raw_tcp_garbage_on_the_command_port(served):
    host, port = served[1][len("tcp://"):].rsplit(":", 1)
    for payload in (b"\x00" * 100, b"GET / HTTP/1.0\r\n\r\n", os.urandom(4096)):
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(payload)
    works(served[2])


def test_non_loopback_bind_needs_a_key(tmp_path):
    refused = subprocess.run([sys.executable, "-m", "mwrt.worker", "--listen", "0.0.0.0:0"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "without a key" in refused.stderr
    worker_key, _ = keygen(str(tmp_path / "k"))
    process, address = start_worker("--key-file", worker_key)  # loopback, but keyed: fine
    stop_worker(process)


def test_unkeyed_daemon_does_not_run_shipped_code():
    mwrt.shutdown()
    process, address = start_worker()
    try:
        mwrt.init_master_worker([address])
        with pytest.raises(mwrt.RemoteError, match="no key, so it does not run shipped code"):
            mwrt.remote(lambda t: t)(mwrt.ones(1)).numpy()
        np.testing.assert_array_equal((mwrt.ones(2) + 1).numpy(), [2, 2])  # ops still run
    finally:
        mwrt.shutdown()
        stop_worker(process)


def test_oversized_command_frame_is_refused_naming_the_limit(served):
    mwrt.init_master_worker([served[1]], key=served[2])
    x = mwrt.ones(2)
    node = x._node
    huge = "x" * (2 << 20)  # a 2 MiB string inside a command: over the 1 MiB frame limit
    node.issue(wire.Call(id=next(node.ids), stream=-1, outs=(next(node.ids),), op=huge, args=(),
                         kwargs={}))
    with pytest.raises(mwrt.MwrtError, match="MWRT_MAX_FRAME_BYTES"):
        mwrt.synchronize()
    assert served[0].poll() is None


def test_oversized_tensor_is_refused_naming_the_limit(served):
    mwrt.init_master_worker([served[1]], key=served[2])
    huge = mwrt.empty(1 << 40, dtype=np.uint8)  # 1 TiB: over MWRT_MAX_TENSOR_BYTES
    with pytest.raises(mwrt.RemoteError, match="MWRT_MAX_TENSOR_BYTES"):
        huge.numpy()
    np.testing.assert_array_equal(mwrt.ones(2).numpy(), [1, 1])


_KNOCK = """
import sys, msgspec, zmq
from mwrt.protocol import wire
ctx = zmq.Context()
answered = []
for address in sys.argv[1:]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"intruder/rx")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    body = msgspec.msgpack.encode([[wire.code(wire.Hello), 1, "s", "intruder", 0, 0.0]])
    sock.send_multipart([wire.envelope(0, body)])
    answered.append(bool(sock.poll(1000)))
    sock.close(0)
print(answered)
"""


def test_a_local_worker_admits_its_master_alone_on_either_socket():
    # Its Unix socket (where the master connects) lets in the master's pid only, in a folder
    # of mode 0700; its tcp port wants the session's key. A Hello from another process of
    # the same user gets no answer on either, and the master computes on.
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=1)
    try:
        node = mwrt.master.cluster.current().nodes[0]
        assert node.route.startswith("ipc://") and node.route_keys is None
        folder = os.path.dirname(node.route.removeprefix("ipc://"))
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        knock = subprocess.run([sys.executable, "-c", _KNOCK, node.route, node.address],
                               capture_output=True, text=True, timeout=60, check=True)
        assert knock.stdout.split("\n")[0] == "[False, False]", knock
        assert float(mwrt.ones(3).sum()) == 3.0
    finally:
        mwrt.shutdown()
    assert not os.path.exists(folder)  # the daemon's exit removed it
