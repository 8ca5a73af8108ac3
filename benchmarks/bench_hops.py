"""The hops of one round trip, timed on both sides: where a sync read's time goes.

The local workers `init_master_worker()` starts are used, reached as users reach them (over
their Unix socket, without CurveZMQ, the spin as local_spin_env sets it), each with a few
of its functions wrapped to note the time (the monotonic clock, which every process of a
host shares) by a sitecustomize on its path; the master's sends and reads are wrapped
alike; then `x.numpy()` of one element and `float(t.sum())` of four run in a loop. Each
round trip's notes, from both processes, are put in time order: the path they take (the
most common sequence of notes) and the p50 of each hop along it. A change that
adds a hop (a hand-off to a stream thread, a second message, another ZeroMQ frame per
message) shows as a new or changed line of the path; the test
(tests/master/test_round_trips.py) checks both round trips' paths by their notes, untimed.

Beside it, in the same run: a pyzmq DEALER/ROUTER echo between two fresh processes, and
each side's CPU per round trip (the wrappers add about a microsecond a note); and, where
strace can attach, the system calls a round trip costs the worker's socket thread, beside
the echo server's thread (`syscalls`: the test checks a read's and an op's bound, as each
ZeroMQ socket the thread asks costs two).

With --bytecodes: the Python bytecodes one round trip costs each side (sys.settrace opcode
events, load-independent where times are not: the yardstick of a change that takes Python off
the path), on the default two local workers with spins off, beside the pyzmq echo's client
and server (a send and a recv each).

    python benchmarks/bench_hops.py [--reps N] [--workers N] [--bytecodes]
"""

from __future__ import annotations

import collections
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np

import mwrt
from mwrt.protocol import wire
from mwrt.protocol.lane import Lane

# A local daemon's sitecustomize: notes its hops, which go to HOPS_NOTES_PATH.PID when it stops.
_WORKER = r"""
import atexit, json, os, sys, threading, time
from mwrt.protocol import wire
from mwrt.worker import daemon, executor, lanes, wakes
NOTES, clock = [], time.perf_counter_ns
def note(label, fn, when_true=False):
    def wrapped(*args, **kwargs):
        if not when_true:
            NOTES.append((clock(), label))
        got = fn(*args, **kwargs)
        if when_true and got:
            NOTES.append((clock(), label))
        return got
    return wrapped
def on_thread(fn):  # which thread runs the command: the socket's, or its stream's
    def wrapped(self, command, frames):
        where = "stream thread" if threading.get_ident() == self.thread.ident else "socket thread"
        NOTES.append((clock(), f"worker: {type(command).__name__} starts ({where})"))
        fn(self, command, frames)
        NOTES.append((clock(), f"worker: {type(command).__name__} done"))
    return wrapped
wakes.Wakes.wait = note("worker: wakes from poll", wakes.Wakes.wait, when_true=True)
wakes.Wakes.spin = note("worker: sees it while spinning", wakes.Wakes.spin, True)
on_message = daemon.Daemon._on_message
def read(self, frames):  # the frames a message took, its routing identity aside
    NOTES.append((clock(), f"worker: message read ({frames_text(len(frames) - 1)})"))
    on_message(self, frames)
def frames_text(count):
    return "1 frame" if count == 1 else f"{count} frames"
daemon.Daemon._on_message = read
daemon.Daemon._dispatch = note("worker: batch decoded and admitted", daemon.Daemon._dispatch)
daemon.Daemon._forward = note("worker: forwards a stream's reply", daemon.Daemon._forward)
executor.StreamExecutor.submit = note("worker: hands off to a stream thread",
                                      executor.StreamExecutor.submit)
executor.StreamExecutor.execute = on_thread(executor.StreamExecutor.execute)
def noted_send(send):
    def wrapped(*args, **kwargs):
        NOTES.append((clock(), "worker: reply encoded and sent"))
        got = send(*args, **kwargs)
        NOTES.append((clock(), "worker: reply send returned"))
        return got
    return wrapped
wire.send = noted_send(wire.send)  # on ZeroMQ
lanes.Lanes.send = noted_send(lanes.Lanes.send)  # on a lane (MWRT_LANES)
def dump():  # (not in the zygote that forked the daemons: it noted nothing, and outlives the folder)
    if not NOTES:
        return
    path = f"{os.environ['HOPS_NOTES_PATH']}.{os.getpid()}"
    with open(path + ".part", "w") as f:
        json.dump(NOTES, f)
    os.rename(path + ".part", path)
atexit.register(dump)
"""


def _master_notes(notes: list):
    """Wrap the master's send and read of a batch to note their times in `notes`."""
    clock = time.perf_counter_ns

    def noted_send(send):
        def wrapped(end, parts, *args):
            notes.append((clock(), f"master: batch encoded, send ({_frames(len(parts))})"))
            send(end, parts, *args)
            notes.append((clock(), "master: send returned"))
        return wrapped

    def noted_recv(recv):
        def wrapped(end, *args):
            got = recv(end, *args)
            if got is not None:  # (a lane's message(): None while a message is not whole)
                notes.append((clock(), f"master: reply read ({_frames(len(got))})"))
            return got
        return wrapped
    wire.send_parts, wire.recv_parts = noted_send(wire.send_parts), noted_recv(wire.recv_parts)
    # A lane's reply is taken by message() (its wait's, or its spin's, take()).
    Lane.send, Lane.message = noted_send(Lane.send), noted_recv(Lane.message)


def _frames(count: int) -> str:
    return "1 frame" if count == 1 else f"{count} frames"


def _start_workers(count: int, folder: str, site: str = _WORKER, env: dict | None = None) -> int:
    """init_master_worker(local_workers=count), each daemon's hops noted (a sitecustomize,
    `site`, on its path, in `folder`) under `env` too: node 0's pid."""
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(site)
    env = {"HOPS_NOTES_PATH": os.path.join(folder, "notes"), **(env or {})}
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", *env)}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, saved["PYTHONPATH"]]))
    os.environ.update(env)
    try:  # (the daemons inherit this process's environment as they start)
        mwrt.init_master_worker(local_workers=count)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    from mwrt.master.cluster import current

    return current().node(0).info.pid


def _read_notes(folder: str, pid: int, parse=lambda text: [tuple(n) for n in json.loads(text)]):
    """The notes daemon `pid` wrote (waited for: it writes them as it stops), parsed."""
    path = os.path.join(folder, f"notes.{pid}")
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(path) as f:
        return parse(f.read())


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def trace(kind: str, reps: int, count: int = 1) -> dict:
    """Run `kind` ("read" or "sum") `reps` times against fresh local daemons; its hops and
    costs."""
    notes: list = []
    with tempfile.TemporaryDirectory(prefix="mwrt-hops-") as folder:
        pid = _start_workers(count, folder)
        try:
            x = mwrt.ones(1) if kind == "read" else mwrt.dist_send(np.array([1.5, 2.0, -3.25, 4.0]))
            once = x.numpy if kind == "read" else (lambda: float(x.sum()))
            for _ in range(200):
                once()
            spans, clock = [], time.perf_counter_ns
            _master_notes(notes)
            usage, worker_cpu = resource.getrusage(resource.RUSAGE_SELF), _cpu_seconds(pid)
            for _ in range(reps):
                start = clock()
                once()
                spans.append((start, clock()))
            after = resource.getrusage(resource.RUSAGE_SELF)
            worker_cpu = _cpu_seconds(pid) - worker_cpu
        finally:
            wire.send_parts, wire.recv_parts, Lane.send, Lane.message = _ORIGINAL
            mwrt.shutdown()
        notes += _read_notes(folder, pid)
    master_cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    return dict(paths(sorted(notes), spans), master_cpu=master_cpu / reps,
                worker_cpu=worker_cpu / reps)


_ORIGINAL = (wire.send_parts, wire.recv_parts, Lane.send, Lane.message)


def paths(notes: list, spans: list) -> dict:
    """Each span's notes in time order: the most common path, each hop's p50 (us) along it.

    A note belongs to the span it was made in, except that a worker's note after it read a
    message belongs to that message's span (a worker descheduled after its send returns
    notes it inside the next round trip)."""
    by_span: list = [[("master: op called", start)] for start, _ in spans]
    k, current = 0, None
    for when, label in notes:
        while k < len(spans) and spans[k][1] < when:
            k += 1
        if label.startswith("worker: message read"):
            current = k
        owner = current if label.startswith("worker") and label not in _WAKES else k
        if owner is not None and owner < len(spans) and when >= spans[owner][0]:
            by_span[owner].append((label, when))
    for span, (_, end) in zip(by_span, spans):
        span.append(("master: value returned", end))
        span.sort(key=lambda note: note[1])
    counts = collections.Counter(tuple(label for label, _ in span) for span in by_span)
    path, seen = counts.most_common(1)[0]
    taken = [span for span in by_span if tuple(label for label, _ in span) == path]
    hops = [(path[i], statistics.median((s[i][1] - s[i - 1][1]) / 1e3 for s in taken))
            for i in range(1, len(path))]
    total = statistics.median((end - start) / 1e3 for start, end in spans)
    return {"path": path, "hops": hops, "share": seen / len(spans), "p50": total}


_WAKES = ("worker: wakes from poll", "worker: sees it while spinning")


def syscalls(kind: str, reps: int = 300) -> dict | None:
    """System calls per round trip of `kind` ("read", "sum", or "echo": the pyzmq echo's
    server) made by the serving thread alone, by name (strace -c on that one thread; the
    worker's spin off, so each round trip sleeps and wakes once), or None where strace is
    missing or cannot attach."""
    if shutil.which("strace") is None:
        return None
    saved = os.environ.get("MWRT_WORKER_SPIN_US")
    os.environ["MWRT_WORKER_SPIN_US"] = "0"
    echo = None
    try:
        if kind == "echo":
            import zmq
            from baselines import ECHO

            echo = subprocess.Popen([sys.executable, "-c", ECHO],
                                    stdout=subprocess.PIPE, text=True)
            dealer = zmq.Context.instance().socket(zmq.DEALER)
            dealer.connect(f"tcp://127.0.0.1:{int(echo.stdout.readline())}")
            pid = echo.pid

            def once():
                dealer.send(b"x" * 16)
                dealer.recv()
        else:
            mwrt.init_master_worker(local_workers=1)
            from mwrt.master.cluster import current

            pid = current().local[0].process.pid  # its main thread is the socket thread
            x = mwrt.ones(1) if kind == "read" else mwrt.ones(4)
            once = x.numpy if kind == "read" else (lambda: float(x.sum()))
        return _count_calls(pid, once, reps)
    finally:
        if echo is not None:
            dealer.send(b"stop")
            echo.wait(10)
            echo.stdout.close()
            dealer.close(0)
        else:
            mwrt.shutdown()
        if saved is None:
            del os.environ["MWRT_WORKER_SPIN_US"]
        else:
            os.environ["MWRT_WORKER_SPIN_US"] = saved


def _count_calls(pid: int, once, reps: int) -> dict | None:
    """The system calls of process `pid`'s main thread over `reps` calls of once(), from
    strace -f: every thread traced, so that each runs as slowly as the others (one thread
    traced alone falls behind the rest and finds the next request in before it sleeps)."""
    for _ in range(100):
        once()
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(["strace", "-f", "-p", str(pid), "-o", out.name],
                                  stderr=subprocess.PIPE, text=True)
        attached = tracer.stderr.readline()  # "strace: Process N attached", or why not
        if "attached" not in attached:
            tracer.wait(10)
            return None
        time.sleep(0.5)  # its other threads too
        for _ in range(reps):
            once()
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
        tracer.stderr.close()
        counts: dict = {}
        for line in out:  # "TID name(args) = result", or "TID <... name resumed>..."
            tid, _, call = line.partition(" ")
            call = call.lstrip()  # (strace pads the TID to the width of the longest)
            if tid == str(pid) and call[:1].isalpha():
                name = call.split("(", 1)[0]
                counts[name] = counts.get(name, 0) + 1
    return {name: count / reps for name, count in counts.items()}


# --bytecodes: a local daemon's sitecustomize that counts its socket thread's (the main
# thread's) opcodes from SIGUSR1 to SIGUSR2, then writes the count to HOPS_NOTES_PATH.PID.
_COUNTER = r"""
import os, signal, sys
COUNT, ON = [0], [False]
def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    if ON[0] and event == "opcode":
        COUNT[0] += 1
    return tracer
def start(*_):
    COUNT[0], ON[0] = 0, True
def stop(*_):
    ON[0] = False
    path = f"{os.environ['HOPS_NOTES_PATH']}.{os.getpid()}"
    with open(path + ".part", "w") as f:
        f.write(str(COUNT[0]))
    os.rename(path + ".part", path)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.settrace(tracer)
"""
# Spins off (a spin's count is its wait's length), heartbeats rare (each ping is a message
# the worker's count would take for a round trip's).
_QUIET_ENV = {"MWRT_MASTER_SPIN_US": "0", "MWRT_WORKER_SPIN_US": "0",
              "MWRT_HEARTBEAT_INTERVAL": "5", "MWRT_HEARTBEAT_TIMEOUT": "60"}


def bytecodes(kind: str, reps: int = 300, side: str = "master") -> float:
    """Python bytecodes per round trip of `kind` ("read" or "sum") on the default two local
    workers, on `side`: the master's thread, or node 0's socket thread, each counted in a
    session of its own (traced, the master is slow enough for the heartbeat to send an op
    it holds for its read alone, which would change what the worker runs)."""
    counted = [0]

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            counted[0] += 1
        return tracer
    with tempfile.TemporaryDirectory(prefix="mwrt-bytecodes-") as folder:
        pid = _start_workers(2, folder, _COUNTER if side == "worker" else "", _QUIET_ENV)
        try:
            x = mwrt.ones(1) if kind == "read" else mwrt.dist_send(np.array([1.5, 2.0, -3.25, 4.0]))
            once = x.numpy if kind == "read" else (lambda: float(x.sum()))
            for _ in range(200):
                once()
            if side == "worker":
                os.kill(pid, signal.SIGUSR1)
                time.sleep(0.3)  # its handler runs as its poll is interrupted
            else:
                sys.settrace(tracer)
            for _ in range(reps):
                once()
            sys.settrace(None)
            if side == "worker":
                os.kill(pid, signal.SIGUSR2)
                counted[0] = int(_read_notes(folder, pid, json.loads))
        finally:
            mwrt.shutdown()
    return counted[0] / reps


def echo_us(reps: int) -> float:
    """p50 of a pyzmq DEALER/ROUTER echo between two fresh processes (bench_ops --fresh's)."""
    from baselines import ECHO
    from fresh_figures import FRESH_ECHO, fresh_line

    return fresh_line(FRESH_ECHO, reps, ECHO)[0]


def main() -> None:
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 2000
    count = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 1
    if "--bytecodes" in sys.argv:
        print_bytecodes(min(reps, 300))
        return
    load = os.getloadavg()[0]
    for kind, what in (("read", "x.numpy(), 1 element"), ("sum", "float(t.sum()), 4 elements")):
        got = trace(kind, reps, count)
        echo = echo_us(reps)
        print(f"\n{what}, {count} local worker(s), load {load:.1f}: p50 {got['p50']:.0f} us "
              f"(echo {echo:.0f} us, {got['p50'] / echo:.2f}x); this path in "
              f"{got['share']:.0%} of round trips")
        print(f"  CPU per round trip: master {got['master_cpu'] * 1e6:.0f} us, worker "
              f"{got['worker_cpu'] * 1e6:.0f} us (processes, every thread)")
        print(f"  {'hop, ending at':58} {'p50 us':>8}")
        for label, us in got["hops"]:
            print(f"  {label:58} {us:8.1f}")
        calls, echo_calls = syscalls(kind), syscalls("echo")
        if calls is not None and echo_calls is not None:
            print(f"  system calls per round trip, the serving thread alone (spins off): worker "
                  f"{_calls_text(calls)}; echo server {_calls_text(echo_calls)}")


def print_bytecodes(reps: int) -> None:
    """--bytecodes: each side's bytecodes per round trip, beside the echo's (counted alike)."""
    client, server = _echo_bytecodes(reps)
    print(f"Python bytecodes per round trip ({reps}, the default two local workers, spins off;"
          f" load {os.getloadavg()[0]:.1f}), beside the pyzmq echo's client and server:")
    for kind, what in (("read", "x.numpy(), 1 element"), ("sum", "float(t.sum()), 4 elements")):
        master, worker = bytecodes(kind, reps, "master"), bytecodes(kind, reps, "worker")
        print(f"  {what:28} master {master:7,.0f} ({master / client:.0f}x the client's "
              f"{client:.0f}), worker {worker:7,.0f} ({worker / server:.0f}x the server's "
              f"{server:.0f})")


def _echo_bytecodes(reps: int) -> tuple[float, float]:
    """The Python bytecodes per round trip of the pyzmq DEALER/ROUTER echo bench_ops times
    (baselines.ECHO), in this process: its client's send and recv, its server's turn."""
    import zmq

    ctx = zmq.Context()
    server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client.connect(f"tcp://127.0.0.1:{port}")
    counted, message = [0], b"x" * 16

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            counted[0] += 1
        return tracer
    sides = []
    for side in ("client", "server"):
        counted[0] = 0
        for _ in range(reps):
            sys.settrace(tracer if side == "client" else None)
            client.send_multipart([message])
            sys.settrace(tracer if side == "server" else None)
            frames = server.recv_multipart()
            if frames[-1] != b"stop":
                server.send_multipart(frames)
            sys.settrace(tracer if side == "client" else None)
            client.recv_multipart()
            sys.settrace(None)
        sides.append(counted[0] / reps)
    client.close(0)
    server.close(0)
    ctx.term()
    return sides[0], sides[1]


def _calls_text(calls: dict) -> str:
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:3]
    return f"{sum(calls.values()):.1f} (" + ", ".join(f"{n} {c:.1f}" for n, c in top) + ")"


if __name__ == "__main__":
    main()
