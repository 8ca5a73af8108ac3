"""A stranger on another host cannot block a job's rendezvous (issue 27, item 6): it floods
the store with connections that never answer the challenge, from a host of its own, while a
rank on a third host joins through the same store. Simulated hosts (tests/support/hosts.py)."""

from __future__ import annotations

import sys

from tests.support.hosts import hosts3  # noqa: F401  (fixture)

PORT, KEY = 29731, "6b" * 32

SERVER = f"""
from mwrt.store import TCPStore
store = TCPStore("{{addr}}", {PORT}, is_master=True, timeout=40, key=bytes.fromhex("{KEY}"))
print("SERVING", flush=True)
print("GOT", store.get("rank1", timeout=40).decode(), flush=True)
"""

# A stranger that never answers a challenge: it opens connections as fast as it can without
# waiting for them and keeps each until the server closes it (up to 20,000 at once, or its fd limit), so the
# slots it got are held, and it takes any slot that frees within microseconds. It says
# FLOODING once it has opened 1,000, and stops at SIGTERM (the test is done) or after its time.
FLOOD = """
import resource, select, signal, socket, sys, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
most = min(hard - 64, 20000)
target, source, seconds = (sys.argv[1], int(sys.argv[2])), sys.argv[3], float(sys.argv[4])
held, opened, end, poller = {}, 0, time.monotonic() + seconds, select.poll()
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
while time.monotonic() < end and not stop:
    if len(held) < most:
        sock = socket.socket()
        sock.setblocking(False)
        if source:
            sock.bind((source, 0))
        sock.connect_ex(target)
        held[sock.fileno()] = sock
        poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        opened += 1
        if opened == 1000:
            print("FLOODING", flush=True)
    if opened % 200 == 0 or len(held) >= most:  # let go of those the server closed
        for fd, _ in poller.poll(0):
            try:
                data = held[fd].recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # closed by the server: its slot went to someone else
                poller.unregister(fd)
                held.pop(fd).close()
print("OPENED", opened, flush=True)
"""

RANK = f"""
import time
from mwrt.store import TCPStore
start = time.monotonic()
rank = TCPStore("{{addr}}", {PORT}, timeout=6, key=bytes.fromhex("{KEY}"))
rank.set("rank1", "here")
print("JOINED in %.1f s" % (time.monotonic() - start), flush=True)
"""


def test_a_stranger_on_another_host_cannot_hold_the_stores_challenge_slots(hosts3):  # noqa: F811
    import subprocess

    store_host, stranger, rank_host = hosts3
    server = store_host.popen([sys.executable, "-c", SERVER.format(addr=store_host.addr)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "SERVING" in server.stdout.readline()
        flood = stranger.popen([sys.executable, "-c", FLOOD, store_host.addr, str(PORT), "",
                                "25"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started = flood.stdout.readline()
        assert "FLOODING" in started, started + flood.stdout.read()[-2000:]
        rank = rank_host.python(RANK.format(addr=store_host.addr), timeout=60, check=False)
        out, _ = server.communicate(timeout=60)
        flood.terminate()
        flooded, _ = flood.communicate(timeout=60)
    finally:
        for process in (server,):
            if process.poll() is None:
                process.kill()
                process.communicate()
    print(f"\n[figure] across hosts: {flooded.strip()} by a stranger; rank {rank.stdout.strip()}")
    assert "JOINED" in rank.stdout, rank.stderr[-2000:]
    assert "GOT here" in out
