"""The daemon on its own: bad frames get error replies, a killed worker is reported, not hung on."""

from __future__ import annotations

import os
import signal
import time

import msgspec
import numpy as np
import pytest
import zmq
from tests.support.daemons import start_worker, stop_worker
from tests.support.machine import seconds

import mwrt
from mwrt.protocol import wire


@pytest.fixture
def worker():
    mwrt.shutdown()
    process, address = start_worker()
    yield process, address
    mwrt.shutdown()
    stop_worker(process)


def raw_exchange(address, parts, identity=b"x/tx", reply_to=None):
    """Send raw frames as a DEALER; return the decoded reply (or None after 3 s)."""
    ctx = zmq.Context()
    sockets = {}
    for name in {identity, reply_to or identity}:
        sock = sockets[name] = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, name)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
    try:
        time.sleep(0.1)  # both connected before the worker answers
        sockets[identity].send_multipart(parts)
        listener = sockets[reply_to or identity]
        if not listener.poll(3000):
            return None
        frames = listener.recv_multipart()
        return wire.decode(frames)[1][0]
    finally:
        for sock in sockets.values():
            sock.close(0)
        ctx.term()


BAD_FRAMES = [
    [b"garbage"],
    [b"xxxx" + wire.envelope(1, b"\x90")[4:]],  # wrong magic
    [b"mwrt\x63" + wire.envelope(1, b"\x90")[5:]],  # another protocol version
    [msgspec.msgpack.encode([b"mwrt", 1, 1]), b"\x90"],  # version 1's header and body frames
    [wire.envelope(1, b"\x90")[:-1]],  # shorter than its prefix says
    [wire.envelope(1, b"\xc1")],  # invalid msgpack
    [wire.envelope(1, msgspec.msgpack.encode([[999, 1, 2]]))],  # unknown message code
    [wire.envelope(1, msgspec.msgpack.encode([[wire.code(wire.Call), 1]]))],  # missing fields
    [wire.envelope(1, msgspec.msgpack.encode({"a": 1}))],  # not a list
]


@pytest.mark.parametrize("parts", BAD_FRAMES)
def test_malformed_messages_get_an_error_reply_and_the_daemon_serves_on(worker, parts):
    process, address = worker
    reply = raw_exchange(address, parts, reply_to=b"x/rx")
    assert isinstance(reply, wire.Failed), reply
    assert reply.info["kind"] in ("wire", "unknown_session")
    assert process.poll() is None
    mwrt.init_master_worker([address])
    np.testing.assert_array_equal((mwrt.ones(3) + 1).numpy(), [2, 2, 2])


def test_commands_without_a_session_are_refused(worker):
    _, address = worker
    body = wire.encode_body([wire.Create(1, -1, 5, "zeros", (3,), "<f4", -1, ())])
    reply = raw_exchange(address, [wire.envelope(1, body)], identity=b"nosuch/tx",
                         reply_to=b"nosuch/rx")
    assert isinstance(reply, wire.Failed) and reply.info["kind"] == "unknown_session"


def test_unknown_op_is_a_remote_error_and_the_stream_recovers(worker):
    _, address = worker
    mwrt.init_master_worker([address])
    x = mwrt.ones(3)
    node = x._node
    node.issue(wire.Call(id=next(node.ids), stream=-1, outs=(next(node.ids),), op="no_such_op",
                         args=(x._ref,), kwargs={}))
    with pytest.raises(mwrt.RemoteError, match="no_such_op"):
        mwrt.synchronize()
    np.testing.assert_array_equal(x.numpy(), [1, 1, 1])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_worker_raises_worker_lost_naming_the_node(keyed_worker, sig):
    process, address, key = keyed_worker
    mwrt.init_master_worker([address], key=key)
    x = mwrt.ones(1000)
    x.numpy()
    slow = mwrt.remote(lambda a: (time.sleep(30), a)[1])(x)
    time.sleep(0.2)
    process.send_signal(sig)
    start = time.monotonic()
    with pytest.raises(mwrt.WorkerLostError, match="node 0") as info:
        slow.numpy()
    assert time.monotonic() - start < 8
    assert info.value.node == 0
    with pytest.raises(mwrt.WorkerLostError):
        (x + 1).numpy()


@pytest.mark.parametrize("spin_us", ["0", "100000"])
def test_a_daemon_serves_alike_whether_it_spins_or_sleeps_between_messages(spin_us):
    """MWRT_WORKER_SPIN_US: 0 sleeps in poll() at once; 100 ms spins through whole gaps."""
    mwrt.shutdown()
    process, address = start_worker(env={"MWRT_WORKER_SPIN_US": spin_us})
    try:
        mwrt.init_master_worker([address])
        x = mwrt.ones(3)
        for i in range(50):
            x += 1.0
            if i % 10 == 0:
                assert x.numpy()[0] == i + 2
        big = mwrt.dist_send(np.arange(1 << 18, dtype=np.float64))  # through a stream
        assert float(big.sum().numpy()) == float(np.arange(1 << 18).sum())
        time.sleep(0.3)  # a quiet gap longer than any spin
        np.testing.assert_array_equal(x.numpy(), [51.0] * 3)
    finally:
        mwrt.shutdown()
        stop_worker(process)


def test_local_daemons_spin_only_when_each_has_a_core(monkeypatch):
    from mwrt.master.local import local_spin_env

    monkeypatch.delenv("MWRT_WORKER_SPIN_US", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert local_spin_env(4) == {}  # four daemons: a core each (the master's wait shares)
    assert local_spin_env(5) == {"MWRT_WORKER_SPIN_US": "0"}
    monkeypatch.setenv("MWRT_WORKER_SPIN_US", "50")  # the user's word stands
    assert local_spin_env(32) == {}


def test_daemon_refuses_a_non_loopback_bind_without_a_key():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mwrt.worker", "--listen", "0.0.0.0:0"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("mwrt-worker: --listen: refusing to listen on 0.0.0.0 "
                                     "without a key"), result.stderr  # (the name once)


def test_sigterm_stops_the_daemon_cleanly(worker):
    process, _ = worker
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 0


def test_sigterm_stops_a_daemon_within_a_second_mid_transfer(keyed_worker):
    import threading

    process, address, key = keyed_worker
    mwrt.init_master_worker([address], key=key)
    big, errors = np.ones(8 << 20), []

    def transfers():
        try:
            while True:
                mwrt.dist_send(big).numpy()
        except mwrt.MwrtError as exc:
            errors.append(exc)

    thread = threading.Thread(target=transfers, daemon=True)
    thread.start()
    time.sleep(1.0)
    bound = seconds(1.0, 10.0)  # a second on a quiet machine, scaled by the load
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 0
    assert time.monotonic() - started < bound
    thread.join(10)
    assert errors and "node 0" in str(errors[0])


def test_a_port_in_use_is_named_with_the_flag_to_change_it(worker):
    import subprocess
    import sys

    _, address = worker
    port = address.rpartition(":")[2]
    result = subprocess.run([sys.executable, "-m", "mwrt.worker", "--listen",
                             f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith(f"mwrt-worker: --listen: cannot listen on 127.0.0.1:{port}")
    assert "--listen HOST:PORT" in result.stderr and "Traceback" not in result.stderr

