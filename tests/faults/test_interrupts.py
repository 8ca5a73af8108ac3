"""Ctrl-C, as a user presses it: a master script or a launcher, interrupted at several points,
exits with one KeyboardInterrupt traceback (its main thread's), no traceback of another
thread, no hang at exit; its workers free its session and serve the next master.

Each script runs in a real subprocess, with its own local daemons or with daemons started
here, and gets SIGINT by pid (`kill -INT`) or on its whole process group (what a terminal's
Ctrl-C does, reaching every process the script started in it too).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from tests.support.children import Lines, ctrl_c_reaches
from tests.support.daemons import start_worker, stop_worker

import mwrt
from mwrt.procs import process_alive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
EXIT_TIMEOUT = 60  # seconds a script gets to exit after SIGINT: more is a hang
ELEMENTS = 8_000_000  # 32 MB of float32: far past the inline size, so the data channel moves it

MASTER = textwrap.dedent("""
    import sys, numpy as np, mwrt
    workers, kind = sys.argv[1], sys.argv[2]
    print("starting", flush=True)
    mwrt.init_master_worker(None if workers == "local" else workers, local_workers=2,
                            timeout=30)
    x = mwrt.ones(1000, node=0)
    if kind in ("numpy", "send"):
        big = mwrt.ones(%d, node=0)
        float(big[0])  # made before "ready": the interrupt falls in the transfers
    print("ready", flush=True)
    if kind == "ops":  # ops in flight: batches on their way, none awaited
        while True:
            x += 1
    elif kind == "numpy":
        while True:
            big.numpy()
    elif kind == "send":  # node 0 to node 1 over the data channel
        while True:
            big.dist_send(1)
            mwrt.synchronize()
    elif kind == "all_reduce":  # worker to worker, over the data channel
        a, b = mwrt.ones(%d, node=0), mwrt.ones(%d, node=1)
        while True:
            mwrt.all_reduce([a, b], op=mwrt.ReduceOp.MAX)
            mwrt.synchronize()
    elif kind == "sync":  # synchronize() waiting on a slow remote()
        def slow(a):
            import time
            time.sleep(120)
            return a
        y = mwrt.remote(slow, spec=((1000,), "float32"))(x)
        mwrt.synchronize()
""" % (ELEMENTS, ELEMENTS // 2, ELEMENTS // 2))

SPMD = textwrap.dedent("""
    import os, sys, numpy as np
    import mwrt.distributed as dist

    def main():
        dist.init_process_group(backend=sys.argv[1])
        with open(os.path.join(sys.argv[2], str(dist.get_rank())), "w") as f:
            f.write(str(os.getpid()))  # for the test: no rank may outlive the interrupt
        x = np.ones(%d, np.float32)
        if dist.get_rank() == 0:
            print("ready", flush=True)
        while True:
            dist.all_reduce(x)
            x /= dist.get_world_size()

    if __name__ == "__main__":
        dist.run(main)
""" % (ELEMENTS // 4))

# What must never follow a Ctrl-C: another thread's failure, an exit handler's, the lock
# bug of issue 17, and workers reported lost (they were told to go, or were stopped).
FORBIDDEN = ("Exception in thread", "Exception ignored", "release unlocked lock", " lost:",
             "parent process")


def interrupt(argv, *, group=False, env=None, at="ready", after=0.5, again=None):
    """Run `argv`, SIGINT it `after` seconds past its `at` line (its group with `group`; a
    second SIGINT `again` seconds later), and return (exit code, stderr, pid)."""
    child_env = dict(os.environ, **(env or {}))
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, child_env.get("PYTHONPATH")]))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env, preexec_fn=ctrl_c_reaches(group))
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        try:
            out.until(at)
        except AssertionError as exc:
            proc.kill()
            pytest.fail(f"{exc}; its stderr:\n{err.rest()[-3000:]}")
        time.sleep(after)  # the point of the interrupt, not a measurement
        _sigint(proc, group)
        if again is not None:
            time.sleep(again)
            _sigint(proc, group)
        _exits(proc, EXIT_TIMEOUT, err,
               f"{argv[1:]}: still running {EXIT_TIMEOUT} s after SIGINT (a hang at exit)")
        return proc.returncode, err.rest(), proc.pid
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _sigint(proc, group: bool) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT) if group else proc.send_signal(signal.SIGINT)
    except ProcessLookupError:  # it exited already (after the first of two)
        pass


def assert_one_keyboard_interrupt(err: str, who: str = "") -> None:
    """`err` (the lines of `who`, e.g. '[rank 1] ') holds one exception's traceback, the
    main thread's, ending in KeyboardInterrupt, and nothing FORBIDDEN (another thread's
    traceback is headed 'Exception in thread', an exit handler's 'Exception ignored')."""
    lines = [line[len(who):] for line in err.splitlines() if line.startswith(who)]
    text = "\n".join(lines)
    for bad in FORBIDDEN:
        assert bad not in err, f"{bad!r} after Ctrl-C:\n{err[-4000:]}"
    # One exception: chained ones (a Ctrl-C landing in an except block) print theirs first.
    chained = text.count("During handling of the above exception") + \
        text.count("The above exception was the direct cause")
    assert text.count("Traceback (most recent call last)") == 1 + chained, err[-4000:]
    assert lines and lines[-1].strip() == "KeyboardInterrupt", err[-4000:]


def wait_gone(pattern: str, timeout: float = 30.0) -> None:
    """Wait until no process's command line contains `pattern`; fail naming those left."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True,
                             text=True).stdout
        left = [line for line in out.splitlines() if pattern in line and
                process_alive(int(line.split()[0]))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"still running {timeout} s after the script exited: {left}"


def wait_ranks_gone(folder, count: int = 2, timeout: float = 30.0) -> None:
    """Wait until the ranks that wrote their pid into `folder` are gone; fail naming any."""
    pids = [int((folder / str(rank)).read_text()) for rank in range(count)]
    deadline = time.monotonic() + timeout
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in pids if process_alive(pid)]
    assert not left, f"ranks {left} still running {timeout} s after the interrupt"


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """The master and SPMD scripts, as files."""
    folder = tmp_path_factory.mktemp("interrupts")
    for name, text in (("master.py", MASTER), ("spmd.py", SPMD)):
        (folder / name).write_text(text)
    return lambda name: str(folder / name)


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """Two keyed daemons started here (remote() needs a key): (HOST:PORT,..., key file)."""
    from mwrt.protocol.auth import keygen

    worker_key, master_key = keygen(str(tmp_path_factory.mktemp("keys") / "keys"))
    workers = [start_worker("--key-file", worker_key) for _ in range(2)]
    yield ",".join(a.removeprefix("tcp://") for _, a in workers), master_key
    mwrt.shutdown()
    for process, _ in workers:
        stop_worker(process)


KINDS = [("ops", "auto"), ("numpy", "auto"), ("numpy", "tcp"), ("send", "auto"),
         ("send", "tcp"), ("all_reduce", "auto"), ("sync", "auto")]


def _ids(case) -> str:
    return "-".join(case)


@pytest.mark.parametrize("kind,channel", KINDS, ids=map(_ids, KINDS))
def test_master_with_local_workers(script, kind, channel):
    """kill -INT of a master with its own daemons: one traceback, and the daemons stop."""
    code, err, pid = interrupt([sys.executable, script("master.py"), "local", kind],
                               env={"MWRT_CHANNEL": channel})
    assert code == -signal.SIGINT, err[-3000:]
    assert_one_keyboard_interrupt(err)
    wait_gone(f"--parent-pid {pid} ")


@pytest.mark.parametrize("kind", ["ops", "numpy", "sync"])
def test_terminal_ctrl_c_of_a_master_with_local_workers(script, kind):
    """Ctrl-C in a terminal (the whole process group): the master's daemons are not in it,
    so the master frees its sessions and stops them; no node is reported lost."""
    code, err, pid = interrupt([sys.executable, script("master.py"), "local", kind],
                               group=True)
    assert code == -signal.SIGINT, err[-3000:]
    assert_one_keyboard_interrupt(err)
    wait_gone(f"--parent-pid {pid} ")


@pytest.mark.parametrize("after", [0.0, 0.3])
def test_ctrl_c_while_local_workers_start(script, after):
    """Ctrl-C inside init_master_worker(): no daemon it was starting outlives it."""
    code, err, pid = interrupt([sys.executable, script("master.py"), "local", "ops"],
                               at="starting", after=after)
    assert code == -signal.SIGINT, err[-3000:]
    assert_one_keyboard_interrupt(err)
    wait_gone(f"--parent-pid {pid} ")


def test_second_ctrl_c_during_exit(script):
    """An impatient second Ctrl-C while the master exits does not cut its shutdown short
    (an exit handler's traceback, daemons left to notice their parent is gone)."""
    code, err, pid = interrupt([sys.executable, script("master.py"), "local", "numpy"],
                               again=0.1)
    assert code == -signal.SIGINT, err[-3000:]
    assert_one_keyboard_interrupt(err)
    wait_gone(f"--parent-pid {pid} ")


def sessions_of(pid: int, workers: str, key: str, timeout: float) -> list:
    """As a new master: wait up to `timeout` s for the workers to hold no session of master
    `pid`; return those left (none: freed), after checking that the workers compute."""
    mwrt.init_master_worker(workers, key=key, timeout=30)
    try:
        deadline = time.monotonic() + timeout
        while True:
            left = [s for row in mwrt.status() for s in row["worker"]["sessions"]
                    if s["master"].endswith(f":{pid}")]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        sums = [float(mwrt.ones(3, node=i).sum()) for i in range(mwrt.num_nodes())]
        assert sums == [3.0] * mwrt.num_nodes()
        return left
    finally:
        mwrt.shutdown()


@pytest.mark.parametrize("kind,channel", KINDS, ids=map(_ids, KINDS))
def test_master_with_separate_workers(script, external, kind, channel):
    """kill -INT of a master of daemons started apart: one traceback; the daemons free its
    session (within their lease at worst) and serve the next master."""
    workers, key = external
    code, err, pid = interrupt([sys.executable, script("master.py"), workers, kind],
                               env={"MWRT_CHANNEL": channel, "MWRT_KEY_FILE": key})
    assert code == -signal.SIGINT, err[-3000:]
    assert_one_keyboard_interrupt(err)
    lease = mwrt.config.get("lease_timeout")
    assert sessions_of(pid, workers, key, lease + 10) == []


# -- a Ctrl-C that leaves a collective to its helper (waits.uninterrupted) ---------------------

# The script's all_reduce is slowed on its helper thread, and a Ctrl-C lands in its caller,
# which exits: in helper.start() or in the wait for the helper (`where`). `then`: "whole",
# the helper sends node 0's part, then node 1's a second later, as the caller exits; "again",
# it holds both parts until after the Bye, and a second Ctrl-C comes while shutdown waits;
# "bound", it holds them until after the Bye, and no second Ctrl-C comes. Marks on stdout
# say when each part went (sent N) and each Bye (bye N).
LEFT_TO_ITS_HELPER = textwrap.dedent("""
    import os, signal, sys, threading, time, mwrt
    from mwrt.master.client import Node
    workers, where, then = sys.argv[1:4]
    issue, start, goodbye = Node.issue, threading.Thread.start, Node.say_goodbye
    said_bye = threading.Event()

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)

    def ctrl_c_in_its_wait():  # once the caller waits for this thread, past its start()
        while True:
            frame, names = sys._current_frames()[threading.main_thread().ident], set()
            while frame is not None:
                names.add(frame.f_code.co_name)
                frame = frame.f_back
            if "uninterrupted" in names and "start" not in names:
                return ctrl_c()
            time.sleep(0.01)

    def starting(self):  # a Ctrl-C as the helper starts lands in its caller, in start()
        start(self)
        if self.name == "mwrt-uninterrupted" and where == "start":
            ctrl_c()

    def slowed(self, command, *args, **kwargs):  # on the helper: the collective's parts
        if type(command).__name__ == "Collective":
            if self.index == 0 and where == "wait" and then == "whole":
                issue(self, command, *args, **kwargs)
                print("sent 0", flush=True)
                ctrl_c_in_its_wait()
                return
            if self.index == 0 and then != "whole":  # nothing sent before the Bye
                if where == "wait":
                    ctrl_c_in_its_wait()
                if then == "again":  # once the exit handler is deaf to Ctrl-C: a second
                    while signal.getsignal(signal.SIGINT) in (signal.default_int_handler,
                                                          mwrt.procs.interrupt_handler):
                        time.sleep(0.01)
                    ctrl_c()
                said_bye.wait(60)
            if self.index == 1 and then == "whole":
                time.sleep(1.0)  # the caller meanwhile goes on to exit
        issue(self, command, *args, **kwargs)
        if type(command).__name__ == "Collective":
            print(f"sent {self.index}", flush=True)

    def saying_goodbye(self):
        if self.bye is None and not self.closed:
            print(f"bye {self.index}", flush=True)
        goodbye(self)
        if self.index == 1:
            said_bye.set()

    threading.Thread.start, Node.issue, Node.say_goodbye = starting, slowed, saying_goodbye
    mwrt.init_master_worker(workers, timeout=30)
    a, b = mwrt.ones(1000, node=0), mwrt.ones(1000, node=1)
    print("ready", float(a[0]) + float(b[0]), flush=True)
    mwrt.all_reduce([a, b])
    print("not interrupted", flush=True)
""")


def _exits(proc, timeout: float, err, what: str) -> None:
    """Wait `timeout` s for `proc` to exit; else kill it and fail, saying `what` and its stderr."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{what}; its stderr:\n{err.rest()[-3000:]}")


def run_to_its_end(argv, env, timeout: float = EXIT_TIMEOUT):
    """Run `argv` (which interrupts itself) to its end: (exit code, stdout, stderr, pid)."""
    child_env = dict(os.environ, **env)
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, child_env.get("PYTHONPATH")]))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env, preexec_fn=ctrl_c_reaches())
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        _exits(proc, timeout, err, f"{argv[1:]}: still running after {timeout} s")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return proc.returncode, out.rest(), err.rest(), proc.pid


HELPER_CASES = [("start", "whole"), ("wait", "whole"), ("wait", "again"), ("wait", "bound")]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where,then", HELPER_CASES, ids=map(_ids, HELPER_CASES))
def test_a_collective_left_to_its_helper_goes_out_before_the_bye_or_not_at_all(
        tmp_path, external, where, then):
    # A Ctrl-C in uninterrupted() left the helper sending node 1's part of an all_reduce as
    # the master exited: its Bye went first, the worker answered "has no session for this
    # master", and the exit reported the node lost. Shutdown now waits for the helper before
    # any Bye (up to a bound, or until a second Ctrl-C), and a node drops what comes after.
    workers, key = external
    path = tmp_path / "left_to_its_helper.py"
    path.write_text(LEFT_TO_ITS_HELPER)
    # tcp: over auto's shared memory, a session ended right after an all_reduce can leave a
    # worker's segment in /dev/shm (so with no Ctrl-C at all), which is not this test's matter
    env = {"MWRT_KEY_FILE": key, "MWRT_CHANNEL": "tcp",
           "MWRT_SYNC_TIMEOUT": "3" if then == "bound" else "60"}
    code, out, err, pid = run_to_its_end([sys.executable, str(path), workers, where, then], env)
    assert code == -signal.SIGINT, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("shutdown: ")]
    assert_one_keyboard_interrupt("\n".join(line for line in err.splitlines()
                                            if line not in said))
    assert "in uninterrupted" in err, err[-3000:]  # the Ctrl-C landed where it was meant to
    marks = [line for line in out.splitlines() if line.startswith(("sent", "bye"))]
    if then == "whole":
        assert marks == ["sent 0", "sent 1", "bye 0", "bye 1"], (out, err[-3000:])
        assert said == [], err[-3000:]
    else:  # given up on, and said so: nothing went before the Bye, what came after dropped
        assert marks[:2] == ["bye 0", "bye 1"], (out, err[-3000:])
        why = "(a second Ctrl-C)" if then == "again" else "(after 3 s)"
        assert len(said) == 1 and f"stopped waiting for all_reduce() at {path}:" in said[0] \
            and why in said[0], err[-3000:]
    # Both nodes were told Bye (the lease would take longer), and both serve the next master.
    assert sessions_of(pid, workers, key, mwrt.config.get("lease_timeout") / 2) == []


@pytest.mark.parametrize("channel,group", [("auto", False), ("auto", True), ("tcp", True)],
                         ids=["auto-kill", "auto-terminal", "tcp-terminal"])
def test_launcher_during_all_reduce(script, tmp_path, channel, group):
    """Ctrl-C to mwrt-launch while its 2 ranks all_reduce: each rank prints its own
    KeyboardInterrupt and nothing else, the launcher says so and exits 130."""
    code, err, _ = interrupt([sys.executable, "-m", "mwrt.distributed.launch",
                              "--nproc-per-node", "2", script("spmd.py"), channel, tmp_path],
                             group=group)
    assert code == 130, err[-3000:]
    for rank in (0, 1):
        assert_one_keyboard_interrupt(err, f"[rank {rank}] ")
    assert "mwrt-launch: interrupted" in err
    wait_ranks_gone(tmp_path)


@pytest.mark.parametrize("group", [False, True], ids=["kill", "terminal"])
def test_spawn_during_all_reduce(script, tmp_path, group):
    """Ctrl-C to a script whose dist.run() spawned 2 ranks: one traceback, no rank left."""
    code, err, _ = interrupt([sys.executable, script("spmd.py"), "auto", tmp_path],
                             group=group)
    assert code == -signal.SIGINT, err[-3000:]
    assert_one_keyboard_interrupt(err)
    wait_ranks_gone(tmp_path)


@pytest.mark.parametrize("kind", ["numpy", "sync"])
def test_ctrl_c_of_a_worker_daemon(script, tmp_path, kind):
    """Ctrl-C of `mwrt-worker` with a master's work in flight: the daemon stops with no
    traceback (exit 0), and the master fails naming the lost node instead of waiting."""
    from mwrt.protocol.auth import keygen

    worker_key, master_key = keygen(str(tmp_path / "keys"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
        "PYTHONPATH")])), MWRT_KEY_FILE=master_key)
    daemon = subprocess.Popen([sys.executable, "-m", "mwrt.worker", "--listen", "127.0.0.1:0",
                               "--key-file", worker_key], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env,
                              preexec_fn=ctrl_c_reaches())
    other, other_address = start_worker("--key-file", worker_key)
    logged, master = Lines(daemon.stderr), None
    try:
        address = Lines(daemon.stdout).until("listening on").split()[-1]
        workers = ",".join(a.removeprefix("tcp://") for a in (address, other_address))
        master = subprocess.Popen([sys.executable, script("master.py"), workers, kind],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env, preexec_fn=ctrl_c_reaches())
        said, failed = Lines(master.stdout), Lines(master.stderr)
        said.until("ready")
        time.sleep(0.5)  # the point of the interrupt, not a measurement
        daemon.send_signal(signal.SIGINT)
        assert daemon.wait(EXIT_TIMEOUT) == 0
        text = logged.rest()
        assert "Traceback" not in text and "Exception in thread" not in text, text
        assert master.wait(EXIT_TIMEOUT) == 1
        error = failed.rest()
        assert "WorkerLostError: node 0" in error, error  # raised from the channel's error
        assert "Exception in thread" not in error and "Exception ignored" not in error, error
    finally:
        for process in (daemon, master):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        stop_worker(other)


# -- a notebook's Ctrl-C: the interrupted transfer ends whole, and the session goes on -------

# The script sends itself SIGINT (a Ctrl-C) as the k-th segment of its transfers goes out
# (dist_send) or comes in (numpy: a chunk read in place from the worker's memory; channel:
# a segment of the data channel, where reads in place are off), or as dist_send waits for
# the worker to post its receive (post): a point inside a large transfer, the same in every
# run.
AFTER_CTRL_C = textwrap.dedent("""
    import os, signal, sys, numpy as np, mwrt
    from mwrt.channels import cma
    from mwrt.channels.matching import Matcher
    from mwrt.channels.paths import OutConn
    from mwrt.master.client import Node
    kind, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    seen = [-1]  # armed at 0

    def counting(original):
        def at_segment(self, *args):
            if seen[0] >= 0:
                seen[0] += 1
                if seen[0] == k:
                    os.kill(os.getpid(), signal.SIGINT)
            return original(self, *args)
        return at_segment

    if kind == "send":
        OutConn.write = counting(OutConn.write)
    elif kind == "post":
        Node.wait = counting(Node.wait)
    elif kind == "numpy":
        cma.read_remote = counting(cma.read_remote)
    else:
        Matcher.segment_done = counting(Matcher.segment_done)
    mwrt.init_master_worker(timeout=30)
    big, host = mwrt.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32)
    float(big[0])
    seen[0] = 0
    try:  # a notebook cell interrupted: the kernel catches the KeyboardInterrupt and goes on
        while True:
            big.numpy() if kind in ("numpy", "channel") else mwrt.dist_send(host)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    seen[0] = -1
    for what, call in (("numpy", lambda: big.numpy()[-1]),
                       ("send", lambda: mwrt.dist_send(host).numpy()[-1]),
                       ("op", lambda: (big + 1)[n - 2].item())):
        try:
            print(f"next {what}: {int(call())}", flush=True)
        except Exception as exc:
            print(f"next {what}: {type(exc).__name__}: {exc}", flush=True)
    mwrt.shutdown()
""")


INSIDE = [(kind, segment) for kind in ("numpy", "send") for segment in (1, 9, 200)] + [
    ("channel", 9),
    ("post", 1)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind,segment", INSIDE)
def test_a_session_works_after_a_ctrl_c_inside_a_large_transfer(tmp_path, kind, segment):
    # 32 MB transfers in 64 KiB segments (512 each; a read in place: 9 chunks): a Ctrl-C
    # after the first, inside, or several transfers on. The next calls in both directions
    # must work: a message cut in two stalled the worker's receive, its stream and the calls
    # behind it until the channel timeout, and then named the live worker lost; a read in
    # place must give its pin back, and leave no thread copying into the session.
    path = tmp_path / "after_ctrl_c.py"
    path.write_text(AFTER_CTRL_C)
    env = dict(os.environ, MWRT_CHANNEL_TIMEOUT="60", MWRT_SYNC_TIMEOUT="60",
               MWRT_SEGMENT_BYTES=str(64 << 10), MWRT_SHM_CMA="0" if kind == "channel" else "1",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, str(path), kind, str(ELEMENTS), str(segment)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=ctrl_c_reaches())
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        out.until("interrupted")
        nexts = [out.next(EXIT_TIMEOUT).strip() for _ in range(3)]
        assert nexts == [f"next numpy: {ELEMENTS - 1}", f"next send: {ELEMENTS - 1}",
                         f"next op: {ELEMENTS - 1}"], f"{nexts}\n{err.rest()[-3000:]}"
        assert proc.wait(EXIT_TIMEOUT) == 0, err.rest()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


STUCK_BEHIND = textwrap.dedent("""
    import os, signal, threading, numpy as np, mwrt
    mwrt.init_master_worker(timeout=30)
    x = mwrt.ones(4)
    def slow(a):
        import time
        time.sleep(6)
        return a + 1
    y = mwrt.remote(slow, spec=((4,), np.float32))(x)
    z = y * 2  # queued behind slow
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:  # a notebook cell waiting on y, interrupted
        y.numpy()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    mwrt.cancel()
    print("next", (x + 5).numpy().tolist(), flush=True)  # waits behind slow, and says so
    try:
        z.numpy()
    except mwrt.RemoteError as exc:
        print("z:", exc, flush=True)
    print("y", y.numpy().tolist(), flush=True)
    mwrt.shutdown()
""")


@pytest.mark.timeout(120)
def test_a_wait_behind_an_interrupted_op_says_what_it_waits_for(tmp_path):
    # The Ctrl-C cuts the wait, not the op: the next wait behind it says which op it waits
    # for, from which line, for how long; mwrt.cancel() drops what was queued behind it.
    path = tmp_path / "stuck_behind.py"
    path.write_text(STUCK_BEHIND)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env,
                          timeout=90, check=False, preexec_fn=ctrl_c_reaches())
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert out[0] == "interrupted" and out[1] == "next [6.0, 6.0, 6.0, 6.0]", done.stdout
    assert out[2].startswith("z: node 0, device -1, stream -1: multiply") and \
        "Cancelled: dropped by mwrt.cancel() before it ran" in out[2], done.stdout
    assert out[-1] == "y [2.0, 2.0, 2.0, 2.0]", done.stdout
    said = [line for line in done.stderr.splitlines() if "waits behind" in line]
    assert len(said) == 1, done.stderr[-3000:]
    assert f"waits behind remote on stream -1, issued at {path}:9 in <module>, running for" \
        in said[0] and "mwrt.cancel() drops the commands queued behind it" in said[0], said


HALF_ISSUED = textwrap.dedent("""
    import os, signal, numpy as np, mwrt
    from mwrt.master.client import Node
    issue, seen = Node.issue, []

    def counting(self, command, *args, **kwargs):
        if type(command).__name__ == "Collective":
            seen.append(self.index)
            if len(seen) == 2:  # node 0 has its part of the all_reduce, node 1 not yet
                os.kill(os.getpid(), signal.SIGINT)
        return issue(self, command, *args, **kwargs)

    Node.issue = counting
    mwrt.init_master_worker(local_workers=2, timeout=30)
    a, b = mwrt.ones(1000, node=0), mwrt.ones(1000, node=1)
    try:
        mwrt.all_reduce([a, b])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    Node.issue = issue
    print("next", a.numpy()[0], b.numpy()[0], flush=True)
    mwrt.all_reduce([a, b])
    print("again", a.numpy()[0], b.numpy()[0], flush=True)
    mwrt.shutdown()
""")


@pytest.mark.timeout(180)
def test_a_ctrl_c_while_a_collective_is_issued_reaches_every_node_or_none(tmp_path):
    # A Ctrl-C between two nodes' parts of an all_reduce left node 0 inside the collective,
    # waiting for node 1 until the collective timeout, and every call on node 0 behind it.
    path = tmp_path / "half_issued.py"
    path.write_text(HALF_ISSUED)
    env = dict(os.environ, MWRT_COLLECTIVE_TIMEOUT="100", MWRT_SYNC_TIMEOUT="100",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=ctrl_c_reaches())
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        out.until("interrupted")
        assert out.next(EXIT_TIMEOUT).strip() == "next 2.0 2.0", err.rest()[-3000:]
        assert out.next(EXIT_TIMEOUT).strip() == "again 4.0 4.0", err.rest()[-3000:]
        assert proc.wait(EXIT_TIMEOUT) == 0, err.rest()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


FINALIZER = textwrap.dedent("""
    import os, signal, sys, time
    import mwrt
    mwrt.init_master_worker(local_workers=1, timeout=30)

    class Slow:  # its __del__ runs when it is dropped: the signal lands inside it
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(10_000))

    x = mwrt.ones(8)
    try:
        Slow()
        for _ in range(100):
            x += 1.0  # ops go on; the Ctrl-C must come before they end
            time.sleep(0.01)
        print("ran on past a Ctrl-C in a __del__", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    mwrt.shutdown()
""")


def test_a_ctrl_c_that_lands_in_a_finalizer_is_not_lost(tmp_path):
    """Python drops an exception raised in a __del__ or a weakref callback ('Exception
    ignored'): a Ctrl-C that lands in a __del__ (a handle's) or importlib's module-lock
    callback (while workers start: one run in a whole suite) reaches the program once the
    finalizer returns."""
    path = tmp_path / "finalizer.py"
    path.write_text(FINALIZER)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=EXIT_TIMEOUT, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "interrupted", done.stdout
