"""Lanes: a master and the local daemons it starts move batches and replies off ZeroMQ onto a
Unix stream socket each (protocol/lane.py), which admits the master's process alone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import mwrt
from mwrt.master.cluster import current
from mwrt.protocol import lane as lanes


@pytest.fixture
def local_pair():
    """Two local daemons of the test's own (their lanes are the test's subject)."""
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=2)
    yield current().nodes
    mwrt.shutdown()


def _program() -> dict:
    """Small ops and reads, a large inline array each way and a two-node move: their values."""
    x = mwrt.dist_send(np.arange(12.0).reshape(3, 4))
    with mwrt.node(1):
        y = mwrt.dist_send(np.full((3, 4), 0.5))
    big = mwrt.dist_send(np.arange(8000.0))  # 64,000 bytes: inline, a large lane message
    edge = mwrt.dist_send(np.arange(8192.0))  # 64 KiB: its reply's array in a frame of its own
    # Forty arrays of 56 KB in few batches: writes larger than the socket takes at once.
    many = [mwrt.dist_send(np.full(7000, float(i))) for i in range(40)]
    return {"sum": float((x * 2).sum()), "mean": x.mean(axis=0).numpy(),
            "moved": (x + y.to(0)).numpy(), "big": big.numpy(), "big_sum": float(big.sum()),
            "edge": edge.numpy(), "many": np.stack([m.numpy() for m in many]),
            "shape": x[x > 3].shape}


def test_local_workers_take_lanes_and_give_what_zeromq_gives(local_pair, monkeypatch):
    assert all(node.lane is not None for node in local_pair)
    on_lanes = _program()
    mwrt.shutdown()
    monkeypatch.setenv("MWRT_LANES", "0")
    mwrt.init_master_worker(local_workers=2)
    assert all(node.lane is None for node in current().nodes)
    on_zeromq = _program()
    assert on_lanes.keys() == on_zeromq.keys()
    for name, value in on_lanes.items():
        np.testing.assert_array_equal(value, on_zeromq[name], err_msg=name)
    assert on_lanes["sum"] == 132.0 and on_lanes["shape"] == (8,)


_INTRUDER = r"""
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(5)
sock.connect(sys.argv[1])
sid = sys.argv[2].encode()
body = len(b"mwrt-lane").to_bytes(4, "little") + len(sid).to_bytes(4, "little")
try:
    sock.sendall((2).to_bytes(4, "little") + body + b"mwrt-lane" + sid)
    print(repr(sock.recv(100)))
except (ConnectionResetError, BrokenPipeError):  # hung up on, before or after it wrote
    print("reset")
"""


def test_a_lane_admits_the_master_alone(local_pair):
    # Another process of the same user, naming the live session, is hung up on unanswered;
    # the folder's mode 0700 keeps other users out as it does for the ZeroMQ socket.
    node = local_pair[0]
    path = os.path.join(os.path.dirname(node.route.removeprefix("ipc://")), "lane")
    sid = current().connection_id
    knock = subprocess.run([sys.executable, "-c", _INTRUDER, path, sid], capture_output=True,
                           text=True, timeout=60, check=True)
    assert knock.stdout.strip() in ("b''", "reset"), knock
    assert float(mwrt.ones(3).sum()) == 3.0


@pytest.mark.parametrize("first", [
    [b"mwrt-lane", b"no-such-session"],  # names no session
    [b"hello"],  # not a lane's first message
], ids=["unknown session", "not a bind"])
def test_a_lane_that_binds_no_session_is_closed_and_the_daemon_serves_on(local_pair, first):
    node = local_pair[0]
    path = os.path.join(os.path.dirname(node.route.removeprefix("ipc://")), "lane")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    lane = lanes.Lane(sock)
    lane.send(first, 5)
    with pytest.raises(lanes.LaneClosed):
        lane.recv(5)
    lane.close()
    assert float(mwrt.ones(3).sum()) == 3.0


def test_garbage_on_a_lane_closes_it_alone(local_pair):
    # The master's own process may open another lane; bytes that frame no message (a frame
    # larger than any the daemon takes) close that lane, and a second bind of the session
    # is refused; the session's own lane goes on.
    node = local_pair[0]
    path = os.path.join(os.path.dirname(node.route.removeprefix("ipc://")), "lane")
    assert lanes.open_lane(path, current().connection_id.encode(), 5) is None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall((1).to_bytes(4, "little") + (0xFFFFFFF0).to_bytes(4, "little"))
    sock.settimeout(5)
    assert sock.recv(100) == b""  # closed
    sock.close()
    x = mwrt.dist_send(np.arange(4.0))
    assert float(x.sum()) == 6.0


def test_a_killed_local_worker_is_named_through_its_lane(local_pair):
    node = local_pair[1]
    with mwrt.node(1):
        x = mwrt.ones(4)
    float(x.sum())
    os.kill(node.info.pid, 9)
    with pytest.raises(mwrt.WorkerLostError, match="node 1"):
        for _ in range(1000):  # a loop with no wait hears of it too, at a send
            x.numpy()
    assert float(mwrt.ones(2).sum()) == 2.0  # node 0 computes on
