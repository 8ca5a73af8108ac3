"""A lane's framing and writes (mwrt/protocol/lane.py) over real Unix socket pairs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_DEAD_PEER = textwrap.dedent("""
    import signal, socket, sys
    from mwrt.protocol.lane import Lane, LaneClosed
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as a CLI piped to `head` does
    a, b = socket.socketpair()
    b.close()  # its daemon (or its master) died
    lane = Lane(a)
    try:
        lane.send([b"x" * int(sys.argv[1])], 5)
    except LaneClosed as exc:
        print("closed:", exc)
    lane.post([b"y" * 100])  # the daemon's end: the read side says so
    print("posted")
""")


def test_a_write_to_a_dead_peer_raises_and_never_kills_with_sigpipe():
    # A program that restored SIGPIPE's default action died (exit -13, no word) at its
    # next batch after a local worker was killed, where ZeroMQ's path raises WorkerLostError.
    for size in (100, 200_000):  # one write; several
        done = subprocess.run([sys.executable, "-c", _DEAD_PEER, str(size)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done
        assert done.stdout.splitlines() == ["closed: lane: [Errno 32] Broken pipe", "posted"]
