"""A lane's framing and writes (mwrt/protocol/lane.py) over real Unix socket pairs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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


class _Interrupt:
    """A profile hook raising KeyboardInterrupt once, as a call named `name` returns: where
    a Ctrl-C lands between a system call and the store of its result (Python's handler
    raises it there, after the call, before its result is kept)."""

    def __init__(self, *names: str):
        self.names, self.fired = names, False

    def __call__(self, frame, event, arg):
        if event == "c_return" and not self.fired and getattr(arg, "__name__", "") in self.names:
            self.fired = True
            sys.setprofile(None)
            raise KeyboardInterrupt


def _pair():
    import socket

    from mwrt.protocol.lane import Lane
    a, b = socket.socketpair()
    return Lane(a), Lane(b)


def test_a_ctrl_c_as_a_read_returns_keeps_its_bytes():
    # The bytes a read took were dropped, and the lane's next message was framed from the
    # middle of another: the master then waited for bytes that never came.
    reader, writer = _pair()
    writer.send([b"first" * 100], 5)
    writer.send([b"second"], 5)
    hook = _Interrupt("recv", "extend")
    sys.setprofile(hook)
    try:
        with pytest.raises(KeyboardInterrupt):
            reader.recv(5)
    finally:
        sys.setprofile(None)
    assert hook.fired
    assert reader.recv(5) == [b"first" * 100]
    assert reader.recv(5) == [b"second"]


def test_a_ctrl_c_as_a_write_returns_leaves_the_rest_known():
    # The count a write sent was lost: the batch's fate unknown, the session refused every
    # later command. Now the lane knows what went (`cut`); finish() writes the rest.
    reader, writer = _pair()
    hook = _Interrupt("send", "extend")
    sys.setprofile(hook)
    try:
        with pytest.raises(KeyboardInterrupt):
            writer.send([b"x" * 1000], 5)
    finally:
        sys.setprofile(None)
    assert hook.fired and writer.cut
    writer.finish(5)
    writer.send([b"next"], 5)
    assert reader.recv(5) == [b"x" * 1000]
    assert reader.recv(5) == [b"next"]
