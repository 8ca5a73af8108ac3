"""The TCPStore admits only the job and parses defensively (issue 19, items 1 and 4).

A stranger without the secret is refused before any request; a key a rank wrote stays
the rank's; announced sizes, stalls, connection floods and bad timeouts are refusals of
one connection, never an allocation or an uncaught exception; a seeded fuzzer leaves the
server serving. Servers that are measured or fuzzed run in a subprocess of their own.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta

import msgspec
import pytest
from tests.support.faultkit import reap

from mwrt import unkeyed
from mwrt.errors import AuthError, ConfigError, RendezvousError
from mwrt.protocol.auth import client_handshake
from mwrt.store import FileStore, HashStore, TCPStore, tcp_store_server
from mwrt.store.tcp_store_server import frame_limit, recv_frame, send_frame

pytestmark = pytest.mark.timeout(90)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY, OTHER = b"k" * 32, b"o" * 32

SERVE = """
import sys
from mwrt.store import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, key=bytes.fromhex(sys.argv[1]))
print(store.port, flush=True)
sys.stdin.read()  # until the test closes our stdin
store.close()
"""


@pytest.fixture
def keyed():
    s = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, key=KEY)
    yield s
    s.close()


@pytest.fixture
def served():
    """A keyed store served by a process of its own: (process, port); stderr is checked."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-c", SERVE, KEY.hex()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        proc.stdin.close()  # its signal to stop
        reap(proc)


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _authed(port: int, key: bytes = KEY, claim: bytes = b"tester:1:00") -> socket.socket:
    sock = _raw(port)
    client_handshake(sock, key, 5.0, claim)
    return sock


def _ask(sock: socket.socket, req):
    send_frame(sock, req)
    return recv_frame(sock, frame_limit())


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server closes `sock` (whatever it sent before), False on a timeout."""
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


# -- admission -----------------------------------------------------------------------------


def test_a_stranger_without_the_secret_is_refused_before_any_request(keyed, monkeypatch):
    monkeypatch.setattr(tcp_store_server, "HANDSHAKE_SECONDS", 0.5)  # for the raw request below
    with pytest.raises(AuthError, match="refused the HMAC handshake.*MWRT_JOB_SECRET"):
        TCPStore("127.0.0.1", keyed.port, timeout=5, key=OTHER)
    with pytest.raises(AuthError):
        TCPStore("127.0.0.1", keyed.port, timeout=5)  # no key: the public one, also wrong
    # A request sent straight away is read as a (failed) challenge answer, never obeyed.
    payload = msgspec.msgpack.encode(["set", "mwrt/pg/addr/1", b"evil:1", None])
    with _raw(keyed.port) as sock:
        sock.sendall(struct.pack(">I", len(payload)) + payload + b"\0" * 64)
        assert _closed_by_server(sock)
    with pytest.raises(AuthError):
        _authed(keyed.port, key=OTHER)
    assert not keyed.check(["mwrt/pg/addr/1"]) and keyed.num_keys() == 0
    friend = TCPStore("127.0.0.1", keyed.port, timeout=5, key=KEY)
    friend.set("k", "v")
    assert keyed.get("k") == b"v"
    friend.close()


JOB = """
import os, sys, time
import numpy as np
import mwrt.distributed as dist
dist.init_process_group("tcp", timeout=30)
deadline = time.monotonic() + 20  # the store stays up until a stranger was turned away
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.01)
x = np.ones(4, np.float32)
dist.all_reduce(x)
print("sum", x[0], flush=True)
dist.destroy_process_group()
"""


def test_a_strangers_attempts_leave_the_real_job_running(tmp_path):
    from mwrt.distributed.spawn import free_port

    script, port = tmp_path / "job.py", free_port()
    script.write_text(JOB)
    env = dict(os.environ, PYTHONPATH=ROOT, MWRT_JOB_SECRET="the-real-one")
    refused_once = tmp_path / "refused"
    job = subprocess.Popen([sys.executable, "-m", "mwrt.distributed.launch", "--nproc-per-node",
                            "2", "--master-port", str(port), str(script), str(refused_once)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    refused = 0
    try:
        while job.poll() is None:  # knock while the job lives: refused, and no harm done
            try:
                TCPStore("127.0.0.1", port, timeout=0.5, key=OTHER).close()
                raise AssertionError("a stranger's store client was admitted")
            except AuthError:
                refused += 1
                refused_once.touch()  # the job may finish now
            except RendezvousError:
                pass  # not listening yet, or gone already
            time.sleep(0.01)  # knock, not flood: the flood tests are below
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, err
    assert out.count("sum 2.0") == 2
    assert refused > 0


# -- bound values --------------------------------------------------------------------------


def test_a_second_party_cannot_overwrite_a_ranks_address(keyed):
    rank1 = TCPStore("127.0.0.1", keyed.port, timeout=5, key=KEY)
    other = TCPStore("127.0.0.1", keyed.port, timeout=5, key=KEY)  # holds the key, not rank 1
    try:
        rank1.set("mwrt/pg/addr/1", "10.0.0.1:4000")
        for write in (lambda: other.set("mwrt/pg/addr/1", "evil:1"),
                      lambda: other.compare_set("mwrt/pg/addr/1", "10.0.0.1:4000", "evil:1"),
                      lambda: other.add("mwrt/pg/addr/1", 1),
                      lambda: other.delete_key("mwrt/pg/addr/1")):
            with pytest.raises(RendezvousError, match="belongs to host .* pid .*, which wrote"):
                write()
        # A compare_set that would not write is no write: it answers the value, as torch's.
        assert other.compare_set("mwrt/pg/addr/1", "", "evil:1") == b"10.0.0.1:4000"
        assert keyed.get("mwrt/pg/addr/1") == b"10.0.0.1:4000"
        rank1.set("mwrt/pg/addr/1", "10.0.0.1:4001")  # its own key: rank 1 may rewrite it
        assert other.get("mwrt/pg/addr/1") == b"10.0.0.1:4001"
        # First come, first bound: a rank whose key was taken fails loudly, not silently.
        other.set("mwrt/pg/addr/2", "evil:2")
        with pytest.raises(RendezvousError, match="belongs to"):
            rank1.set("mwrt/pg/addr/2", "10.0.0.1:4002")
        # Counters created by add stay shared (barriers, failure counts).
        assert rank1.add("count", 1) == 1 and other.add("count", 2) == 3
        assert rank1.delete_key("mwrt/pg/addr/1") and not other.check(["mwrt/pg/addr/1"])
    finally:
        rank1.close()
        other.close()


def test_unkeyed_stores_stay_on_loopback_unless_insecure(monkeypatch, caplog):
    monkeypatch.delenv("MWRT_INSECURE", raising=False)
    with pytest.raises(ConfigError, match="no secret.*MWRT_JOB_SECRET.*MWRT_INSECURE=1"):
        TCPStore("127.0.0.1", 0, is_master=True, timeout=2, bind="0.0.0.0")
    with pytest.raises(ConfigError, match="will not use 192.0.2.1"):
        TCPStore("192.0.2.1", 29500, timeout=2)  # refused before any packet leaves
    monkeypatch.setenv("MWRT_INSECURE", "1")
    monkeypatch.setattr(unkeyed, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="mwrt.store"):
        s = TCPStore("127.0.0.1", 0, is_master=True, timeout=2, bind="0.0.0.0")
    s.close()
    assert "MWRT_INSECURE=1" in caplog.text


# -- defensive parsing ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tcp", "hash", "file"])
def test_timeouts_must_be_finite_and_not_negative(kind, tmp_path, keyed):
    store = {"tcp": lambda: TCPStore("127.0.0.1", keyed.port, timeout=5, key=KEY),
             "hash": lambda: HashStore(timeout=5),
             "file": lambda: FileStore(str(tmp_path / "f"), timeout=5)}[kind]()
    try:
        store.set("k", "v")
        for bad in (math.inf, math.nan, -1.0):
            with pytest.raises(ValueError, match="finite number of seconds >= 0"):
                store.get("k", timeout=bad)
            with pytest.raises(ValueError, match="finite number of seconds >= 0"):
                store.wait(["k"], timeout=bad)
        assert store.get("k", timeout=timedelta(seconds=1)) == b"v"
    finally:
        store.close()
    with pytest.raises(ValueError, match="TCPStore: timeout"):
        TCPStore("127.0.0.1", keyed.port, timeout=math.inf, key=KEY)


def test_the_server_refuses_bad_arguments_and_keeps_serving(keyed):
    keyed.set("k", "v")
    with _authed(keyed.port) as sock:
        for bad in (math.inf, math.nan, -1.0, 1e400, "soon", True, None, [1]):
            reply = _ask(sock, ["get", "k", bad, None])
            assert reply[:2] == ["err", "value"], reply
        for req in (["set", 7, b"v", None], ["set", "k2", "not bytes", None],
                    ["add", "n", 1.5, None], ["wait", "not a list", 1.0, None],
                    ["cas", "c", None, b"x"]):
            assert _ask(sock, req)[:2] == ["err", "value"], req
        assert _ask(sock, ["frobnicate", "k", None, None])[:2] == ["err", "wire"]
        assert _ask(sock, ["get", "k", 1.0, None]) == ["ok", b"v"]


def test_oversized_frames_stalls_and_silence_are_cut_off(keyed, monkeypatch):
    monkeypatch.setattr(tcp_store_server, "FRAME_SECONDS", 0.5)
    monkeypatch.setattr(tcp_store_server, "HANDSHAKE_SECONDS", 0.5)
    with _authed(keyed.port) as big:  # over the limit: dropped before a byte of the body
        big.sendall(struct.pack(">I", 64 << 20) + b"x" * 76)
        assert _closed_by_server(big)
    with _authed(keyed.port) as slow:  # under the limit, then stalled mid-frame
        slow.sendall(struct.pack(">I", 1 << 20) + b"x" * 76)
        assert _closed_by_server(slow)
    with _raw(keyed.port) as mute:  # never answers the challenge
        assert _closed_by_server(mute)
    with _authed(keyed.port) as idle:  # an admitted client may idle between frames
        assert _ask(idle, ["check", ["k"], None, None]) == ["ok", False]
        # and a get may wait longer than a frame may take: its timeout rules
        threading.Timer(1.5, keyed.set, ("late", "v")).start()
        assert _ask(idle, ["get", "late", 10.0, None]) == ["ok", b"v"]


def test_connections_beyond_the_cap_are_refused(monkeypatch):
    monkeypatch.setenv("MWRT_STORE_MAX_CONNECTIONS", "4")
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, key=KEY)  # 1 of the 4
    held = [_authed(store.port) for _ in range(3)]
    try:
        with _raw(store.port) as extra:
            assert _closed_by_server(extra)
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:  # the server forgets the closed one once its thread sees the EOF
            try:
                _authed(store.port).close()
                break
            except (AuthError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        for sock in held:
            sock.close()
        store.close()


def test_refusals_are_logged_naming_the_peer_and_rate_limited(keyed, caplog):
    with caplog.at_level(logging.WARNING, logger="mwrt.store"):
        for _ in range(20):
            with _raw(keyed.port) as sock:
                sock.sendall(b"\xff" * 80)  # a claim of 65535 bytes: refused at once
                assert _closed_by_server(sock)
        deadline = time.monotonic() + 10
        while keyed._server.log.total < 20 and time.monotonic() < deadline:
            time.sleep(0.02)  # the last refusal is logged just after its socket closes
    lines = [r.getMessage() for r in caplog.records if "refused 127.0.0.1:" in r.getMessage()]
    assert keyed._server.log.total == 20
    assert len(lines) == 1 and "claim too long" in lines[0], lines  # one per peer a minute


def test_silent_strangers_cannot_crowd_out_a_rank(keyed, monkeypatch):
    monkeypatch.setattr(tcp_store_server, "HANDSHAKE_SECONDS", 0.5)
    mute = [_raw(keyed.port) for _ in range(tcp_store_server._MAX_PENDING + 8)]  # past the cap
    try:
        rank = TCPStore("127.0.0.1", keyed.port, timeout=20, key=KEY)  # let in once reaped
        rank.set("k", "v")
        rank.close()
        assert sum(_closed_by_server(sock) for sock in mute) == len(mute)
    finally:
        for sock in mute:
            sock.close()


def test_announced_size_floods_leave_the_servers_rss_flat(served):
    proc, port = served
    client = TCPStore("127.0.0.1", port, timeout=10, key=KEY)
    try:
        client.set("warm", b"x" * 1000)
        base = _rss_kib(proc.pid)
        # Issue 19: 20 connections announcing 64 MiB frames (80 bytes sent) took 1.3 GB.
        # Strangers, then members over the limit, then members under it who stall.
        flood = []
        for _ in range(20):
            flood.append(_raw(port))
            flood[-1].sendall(struct.pack(">I", 64 << 20) + b"x" * 76)
        for size in (64 << 20, 8 << 20):
            for i in range(20):
                sock = _authed(port, claim=f"flood:{i}:{size}".encode())
                sock.sendall(struct.pack(">I", size) + b"x" * 76)
                flood.append(sock)
        peak = base
        for _ in range(20):  # sample while the stalled frames are held open
            peak = max(peak, _rss_kib(proc.pid))
            time.sleep(0.05)
        assert client.get("warm") == b"x" * 1000  # still serving
        for sock in flood[20:40]:
            assert _closed_by_server(sock)
        for sock in flood:
            sock.close()
    finally:
        client.close()
    assert peak - base < 24 << 10, f"server RSS grew from {base} to {peak} KiB"
    assert proc.poll() is None


# -- fuzzing -------------------------------------------------------------------------------

_OPS = ["set", "get", "add", "cas", "wait", "check", "del", "num", "hello", "x", ""]
_VALUES = [None, True, 0, -1, 2**63 - 1, -2**63, 1.5, math.inf, -math.inf, math.nan, 0.0,
           0.01, "", "k", "é" * 40, b"", b"v", [], ["k"], [["k"]], {"a": 1}, [1, 2, 3]]


def _fuzz_frame(rng: random.Random) -> bytes:
    """One frame: garbage, a bad length, or a well-formed request with random arguments."""
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))
    if kind == 1:
        return struct.pack(">I", rng.choice([0, 1, 2**31, 2**32 - 1])) + rng.randbytes(20)
    if kind == 2:
        body = rng.randbytes(rng.randrange(0, 100))
        return struct.pack(">I", len(body)) + body
    req = [rng.choice(_OPS)] + [rng.choice(_VALUES) for _ in range(3)]
    if kind == 3:
        req = req[: rng.randrange(0, 6)] if rng.random() < 0.3 else req
    body = msgspec.msgpack.encode(req)
    return struct.pack(">I", len(body)) + body


def test_store_fuzzer_never_kills_the_server(served):
    proc, port = served
    rng, deadline = random.Random(19), time.monotonic() + 30
    for i in range(300):
        if time.monotonic() > deadline:
            break
        try:
            member = rng.random() < 0.8
            sock = _authed(port, claim=f"fuzz:{i}:00".encode()) if member else _raw(port)
        except (AuthError, OSError):
            continue
        with sock:
            sock.settimeout(0.2)
            try:
                for _ in range(rng.randrange(1, 4)):
                    sock.sendall(_fuzz_frame(rng))
                sock.recv(1 << 16)
            except OSError:
                pass  # refused, cut off, or no answer yet: all fine
    client = TCPStore("127.0.0.1", port, timeout=10, key=KEY)
    client.set("after", "fuzz")
    assert client.get("after") == b"fuzz"
    client.close()
    assert proc.poll() is None
    proc.stdin.close()
    proc.wait(10)
    err = proc.stderr.read()
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]


def test_a_flood_of_silent_strangers_cannot_hold_the_challenge_slots(keyed):
    """The slots of the challenge free as fast as a stranger fills them: past its share, the
    oldest of its connections is cut off for each new one, so two ranks get in meanwhile."""
    from tests.security.test_security_hosts import FLOOD

    flood = subprocess.Popen([sys.executable, "-c", FLOOD, "127.0.0.1", str(keyed.port),
                              "127.0.0.2", "12"], stdout=subprocess.PIPE, text=True)
    try:
        assert "FLOODING" in flood.stdout.readline()  # the flood is under way
        # 6 s: past the 2 s challenge deadline, short of the 5 s one before this change + 1
        ranks = [TCPStore("127.0.0.1", keyed.port, timeout=6, key=KEY) for _ in range(2)]
        ranks[0].set("rank0", "here")
        assert ranks[1].get("rank0") == b"here"
        for rank in ranks:
            rank.close()
    finally:
        flood.terminate()  # the ranks are in: no need to flood on for the rest of its 12 s
        out, _ = flood.communicate(timeout=60)
    print(f"\n[figure] {out.strip()} connections by the stranger meanwhile")


def test_a_burst_of_one_hosts_ranks_is_never_pushed_out_of_the_challenge():
    """32 local workers connect at once from one address: every one of the job's members
    keeps its place in the challenge until it answers (eight did, and the rest pushed the
    oldest out), while a stranger's address still holds only its share."""
    world = 32
    store = TCPStore("127.0.0.1", 0, world + 1, is_master=True, timeout=5, key=KEY)
    socks = [socket.create_connection(("127.0.0.1", store.port), timeout=5)
             for _ in range(world)]
    try:
        for sock in socks:  # the server sent each its challenge: all admitted, none answered
            assert sock.recv(1, socket.MSG_PEEK), "the store closed a connection in the challenge"
        for rank, sock in enumerate(socks):
            client_handshake(sock, KEY, 5, f"localhost:{rank + 1}:burst".encode())
    finally:
        for sock in socks:
            sock.close()
        store.close()
