"""A master's session in the processes and threads a user's program makes: children of
os.fork() and multiprocessing, which must leave the parent's session as it was (each such
test runs a script in a fresh process, as a user does, and reads what it prints), and
threads that issue ops, moves and collectives at once, each reading its own values."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mwrt

pytestmark = pytest.mark.timeout(120)

# A child's wait, bounded: a child that hangs is killed and said so, never waited on forever.
_WAIT_CHILD = textwrap.dedent("""
    import os, time
    def wait_child(pid, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"
""")

FORK_THEN_EXIT = _WAIT_CHILD + textwrap.dedent("""
    import sys, numpy as np, mwrt
    mwrt.init_master_worker()
    x = mwrt.dist_send(np.arange(10.0))
    with mwrt.node(1):
        y = mwrt.ones(4)
    x += 1  # queued when the fork comes
    pid = os.fork()
    if pid == 0:  # touches a handle, drops them all and exits as a script does (atexit runs)
        try:
            (x * 2).numpy()
        except mwrt.MwrtError as exc:
            print("child:", exc, flush=True)
        del x, y
        sys.exit(3)
    print("child exit:", wait_child(pid), flush=True)
    print("parent:", (x * 2).numpy().tolist(), float(y.sum()), flush=True)
    mwrt.shutdown()
""")

FORK_OWN_SESSION = _WAIT_CHILD + textwrap.dedent("""
    import sys, numpy as np, mwrt
    mwrt.init_master_worker()
    x = mwrt.dist_send(np.arange(3.0))
    pid = os.fork()
    if pid == 0:
        mwrt.init_master_worker(local_workers=1)
        print("child:", (mwrt.dist_send(np.arange(4.0)) * 3).numpy().tolist(), flush=True)
        sys.exit(0)  # its atexit stops its own daemon, and not the parent's
    print("child exit:", wait_child(pid), flush=True)
    print("parent:", (x + 1).numpy().tolist(), flush=True)
""")

POOL = textwrap.dedent("""
    import multiprocessing as mp, numpy as np, mwrt
    def read(i):
        try:
            return float(X.sum())
        except mwrt.MwrtError as exc:
            return str(exc)
    if __name__ == "__main__":
        mwrt.init_master_worker()
        X = mwrt.dist_send(np.arange(10.0))
        for _ in range(2):
            with mp.get_context("fork").Pool(2) as pool:
                print("pool:", pool.map(read, range(2))[0], flush=True)
            print("parent:", float((X * 2).sum()), flush=True)
""")


def _run(script: str) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=100, env=dict(os.environ, PYTHONPATH=root))


def test_a_forked_child_that_exits_leaves_the_parents_session_running():
    # Its exit ran shutdown() at exit on the parent's sockets: the Bye ended the parent's
    # session and the child spun forever waiting for an answer that went to the parent.
    done = _run(FORK_THEN_EXIT)
    out = done.stdout
    assert done.returncode == 0 and "child exit: 3" in out, out + done.stderr[-3000:]
    assert "is a fork of the master" in out and "init_master_worker() in it" in out, out
    assert "parent: [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0] 4.0" in out, out
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, \
        done.stderr[-3000:]


def test_a_forked_child_opens_a_session_of_its_own():
    done = _run(FORK_OWN_SESSION)
    out = done.stdout
    assert "child: [0.0, 3.0, 6.0, 9.0]" in out and "child exit: 0" in out, \
        out + done.stderr[-3000:]
    assert "parent: [1.0, 2.0, 3.0]" in out and done.returncode == 0, out + done.stderr[-3000:]


def test_a_fork_pools_workers_are_refused_the_parents_handles_and_leave_it_running():
    done = _run(POOL)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 4, done.stdout + done.stderr[-3000:]
    assert all("is a fork of the master" in line for line in lines[0::2]), lines
    assert lines[1::2] == ["parent: 90.0"] * 2, lines


def _in_threads(work, count: int = 8) -> list:
    """work(k) on `count` threads at once; what each returned, each awaited 60 s at most."""
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(work, k) for k in range(count)]
        return [future.result(timeout=60) for future in futures]


def test_threads_moving_tensors_both_ways_between_two_nodes_get_their_values(cluster):
    # Two threads' moves, interleaved, left node 0's stream in the receive of one and node
    # 1's in the receive of the other, each send queued behind the other node's receive.
    base = np.arange(1000.0)
    x, y = mwrt.dist_send(base, node=0), mwrt.dist_send(base * 2, node=1)

    def work(k):
        moved = [(y.to(node=0) if k % 2 else x.to(node=1)) * k for _ in range(30)]
        return [float(t.sum()) for t in moved]

    for k, sums in enumerate(_in_threads(work)):
        assert sums == [float((base * (2 if k % 2 else 1)).sum()) * k] * 30


def test_threads_issuing_mesh_ops_and_their_collectives_get_their_values(cluster):
    # A mesh op grew a run that another thread was still queueing at the nodes: it reached
    # node 1 after that thread's next command there, a collective whose input was missing.
    mesh = mwrt.mesh()

    def work(k):
        sums = []
        for _ in range(30):
            m = mwrt.dist_send(np.full((10, 4), float(k)), mesh=mesh, shard=0)
            sums.append((m.sum(axis=0) + 0).numpy().tolist())
            pair = [mwrt.full(100 + k, float(k + n), node=n) for n in (0, 1)]
            sums.append([float(t.sum()) for t in mwrt.all_reduce(pair)])
        return sums

    for k, sums in enumerate(_in_threads(work)):
        assert sums == [[10.0 * k] * 4, [(2.0 * k + 1) * (100 + k)] * 2] * 30


def test_threads_sending_reading_and_moving_large_tensors_get_their_values(cluster):
    # A thread reading node 1 held its reply lock while its reply was queued behind a
    # dist_send's receive, whose bytes the sending thread, waiting for that lock to see the
    # answer that the reader had routed, never sent.
    def work(k):
        sums = []
        for r in range(6):
            a = np.full(100_000 + k, float(r + k))  # over MWRT_INLINE_BYTES: the data channel
            t = mwrt.dist_send(a, node=k % 2)
            sums.append(float((t.to(node=1 - k % 2) * 2).numpy().sum()))
        return sums

    for k, sums in enumerate(_in_threads(work)):
        assert sums == [2.0 * (r + k) * (100_000 + k) for r in range(6)]
