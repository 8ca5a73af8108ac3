"""A data channel after the handshake, attacked by a peer that holds the key (the public one
of an unkeyed daemon): announced sizes cost nothing until the bytes come, unclaimed
messages are bounded per peer, and shared memory is mapped only when the peer made it."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest
from tests.support.faultkit import still_talks

from mwrt import channels
from mwrt.channels.framing import DATA, HEADER, MAGIC
from mwrt.protocol import auth
from mwrt.store import HashStore

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20


def rss() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


@pytest.fixture
def trio(request):
    """Channel ranks 0 and 2 (`request.param`: tcp or shm) in this process; the test plays
    rank 1 through `connect()`."""
    name = request.param
    key, store = auth.generate_hmac_key(), HashStore(timeout=10)
    ranks = {}
    threads = [threading.Thread(target=lambda r: ranks.__setitem__(r, channels.create(
        name, r, 3, store=store, prefix="att", key=key, timeout=5)), args=(r,)) for r in (0, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    def connect() -> socket.socket:
        address = store.get(f"att/{name}/0", timeout=5).decode()
        if name == "tcp":
            host, _, port = address.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=5)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect("\0" + address.rpartition("|")[2])
        auth.client_handshake(sock, key, 5, f"att/{name}/1".encode())
        return sock

    yield ranks[0], ranks[2], connect
    for chan in ranks.values():
        chan.close()


def data_header(tag: int, total: int, seglen: int) -> bytes:
    return HEADER.pack(MAGIC, DATA, 0, 0, 0, tag, total, 0, seglen)


@pytest.mark.parametrize("trio", ["tcp"], indirect=True)
def test_headers_announcing_gigabytes_cost_no_memory(trio):
    rank0, rank2, connect = trio
    before = rss()
    socks = [connect() for _ in range(8)]
    for i, sock in enumerate(socks):  # 8 x 512 MiB announced, 1 KiB sent
        sock.sendall(data_header(i, 512 * MIB, 512 * MIB) + b"x" * 1024)
    time.sleep(0.5)
    grown = rss() - before
    for sock in socks:
        sock.close()
    assert grown < 64 * MIB, f"8 announced 512 MiB messages took {grown / MIB:.0f} MiB"
    still_talks(rank0, rank2)


@pytest.mark.parametrize("trio", ["tcp"], indirect=True)
def test_unclaimed_messages_are_bounded_per_peer(trio, monkeypatch, caplog):
    rank0, rank2, connect = trio
    rank0.matcher._unclaimed_limit = MIB  # as MWRT_MAX_UNCLAIMED_BYTES=1048576 would make it
    sent, payload = 0, b"u" * 60_000
    with caplog.at_level(logging.WARNING), connect() as sock:
        try:
            for i in range(100):  # 6 MB on 100 tags nobody receives
                sock.sendall(data_header(i, len(payload), len(payload)) + payload)
                sent += 1
            time.sleep(0.5)
            sock.sendall(data_header(500, 1, 1) + b"z")
            assert sock.recv(1) == b"", "the connection stayed open past the limit"
        except OSError:
            pass  # dropped while we sent: what we want
    assert rank0.matcher._unclaimed.get(1, 0) <= MIB
    assert "MWRT_MAX_UNCLAIMED_BYTES" in caplog.text, caplog.text[-2000:]
    still_talks(rank0, rank2)


@pytest.mark.parametrize("trio", ["shm"], indirect=True)
def test_a_map_frame_maps_only_the_peers_own_segment(trio, caplog):
    rank0, rank2, connect = trio
    victim = f"/dev/shm/mwrt-1-{os.urandom(4).hex()}"  # "made" by pid 1, not by the peer
    with open(victim, "wb") as f:
        f.write(b"\0" * 65536)
    ours = f"mwrt-{os.getpid()}-{os.urandom(4).hex()}"
    with open(f"/dev/shm/{ours}", "wb") as f:
        f.write(b"\0" * 4096)
    try:
        for name, slots, size in ((victim[9:], 1, 4096),  # someone else's segment
                                  (ours, 1000, 1 << 20)):  # ours, but smaller than announced
            with caplog.at_level(logging.WARNING), connect() as sock:
                map_frame = HEADER.pack(MAGIC, 3, 0, len(name), slots, 0, size, 0, 0)
                sock.sendall(map_frame + name.encode())
                assert sock.recv(1) == b"", "a bad MAP frame did not end the connection"
        assert os.path.exists(victim), "a peer made rank 0 unlink a segment it did not make"
        assert "is not one the peer" in caplog.text and "not the" in caplog.text, caplog.text
    finally:
        for path in (victim, f"/dev/shm/{ours}"):
            if os.path.exists(path):
                os.unlink(path)
    still_talks(rank0, rank2)
