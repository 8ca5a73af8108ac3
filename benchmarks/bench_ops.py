"""Op overheads against local workers, beside raw pyzmq, sockets and memory measured in the same run.

Prints every row of issue 15's table, each with its same-run baseline, the ratio and the
goal: sync round trip on a tiny tensor vs a pyzmq DEALER/ROUTER echo between two
processes; the master's issue rate of a small in-place op and the rate they complete;
a 64 MiB dist_send, .numpy() and worker-to-worker .to(node=) over tcp (vs a raw loopback
socket) and shm (vs a multiprocessing.shared_memory handoff between two processes, and
np.copyto into a fresh array, the floor of .numpy(), and into a warm one, the ceiling of
one same-host copy). With --fresh: the sync round trips (a read, and an op then its read:
p50 and p99), the eager issue rate, the first 64 MiB .numpy() of a session (and its
copy=False view) as a user measures them, each in fresh processes beside a baseline also
in fresh processes (`fresh_rows`), and scikit-learn on mwrt tensors vs NumPy with the
round trips counted. --round-trips and --sklearn run those rows alone. --quick: the default
rows with 8 MiB and a tenth of the repetitions, for a test that the script still runs.

The round trips run in rounds, with an echo between any two runs, and each run's ratio is
to the echoes around it (round_trip_runs): on a shared machine whose speed drifts between
runs, drift hits mwrt and its baseline alike. `--round-trips --tries N --reps N` sets the
rounds and the round trips per run; `--against DIR` runs another tree's mwrt (a checkout of
the code before a change) in the same rounds, its rows after each of this tree's.
"""

from __future__ import annotations

import mmap
import os
import socket
import statistics
import multiprocessing
import subprocess
import sys
import threading
import time

import numpy as np
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mwrt  # noqa: E402


def median_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


_ECHO = """
import sys, zmq
ctx = zmq.Context(); router = ctx.socket(zmq.ROUTER)
port = router.bind_to_random_port("tcp://127.0.0.1"); print(port, flush=True)
while True:
    frames = router.recv_multipart()
    if frames[-1] == b"stop":
        break
    router.send_multipart(frames)
"""


def zmq_round_trip(reps: int) -> float:
    """Raw DEALER/ROUTER echo over loopback tcp; the echo is another process, like a worker."""
    echo = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    port = int(echo.stdout.readline())
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    msg = [b"x" * 16]

    def once():
        dealer.send_multipart(msg)
        dealer.recv_multipart()
    for _ in range(100):
        once()
    result = median_us(once, reps)
    dealer.send_multipart([b"stop"])
    echo.wait(10)
    echo.stdout.close()
    dealer.close(0)
    ctx.term()
    return result


_SINK = """
import sys, zmq
ctx = zmq.Context(); pull = ctx.socket(zmq.PULL)
port = pull.bind_to_random_port("tcp://127.0.0.1"); print(port, flush=True)
while pull.recv() != b"stop":
    pass
"""


def zmq_push_rate(n: int) -> float:
    """Messages per second a bare pyzmq PUSH loop sends to a PULL in another process: the
    floor under the master's issue rate (one small command per op, none of mwrt's work)."""
    sink = subprocess.Popen([sys.executable, "-c", _SINK], stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    msg = b"x" * 48  # about one encoded Call of `x += 1.0`
    t0 = time.perf_counter()
    for _ in range(n):
        push.send(msg)
    rate = n / (time.perf_counter() - t0)
    push.send(b"stop")
    sink.wait(30)
    sink.stdout.close()
    push.close(0)
    ctx.term()
    return rate


def raw_socket_gbps(nbytes: int, reps: int = 5) -> float:
    """sendall/recv_into over a loopback TCP socket between two threads."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    src = np.ones(nbytes, np.uint8)
    dst = np.empty(nbytes, np.uint8)

    def sender():
        conn, _ = server.accept()
        for _ in range(reps):
            conn.sendall(src)
            conn.recv(1)
        conn.close()

    thread = threading.Thread(target=sender)
    thread.start()
    client = socket.create_connection(("127.0.0.1", port))
    times = []
    view = memoryview(dst)
    for _ in range(reps):
        t = time.perf_counter()
        got = 0
        while got < nbytes:
            got += client.recv_into(view[got:])
        times.append(time.perf_counter() - t)
        client.sendall(b"k")
    thread.join()
    client.close()
    server.close()
    return nbytes / statistics.median(times) / 1e9


def memcpy_gbps(nbytes: int, reps: int = 5, fresh: bool = False) -> float:
    """np.copyto into a prefaulted array (the ceiling of a same-host copy), or into a fresh
    np.empty each time (what .numpy() does, as it must return a new array; after the first
    free, malloc mostly hands back pages it already has)."""
    src, warm = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)

    def once():
        np.copyto(np.empty(nbytes, np.uint8) if fresh else warm, src)
    return nbytes / statistics.median(_timed(once) for _ in range(reps)) / 1e9


def new_pages_gbps(nbytes: int, reps: int = 5) -> float:
    """np.copyto into pages the process never touched (a fresh mmap each time): what a
    .numpy() costs when malloc has just given its memory back to the kernel."""
    src = np.ones(nbytes, np.uint8)

    def once():
        pages = mmap.mmap(-1, nbytes)
        view = np.frombuffer(pages, np.uint8)
        np.copyto(view, src)
        del view
        pages.close()
    return nbytes / statistics.median(_timed(once) for _ in range(reps)) / 1e9


def _shm_reader(name: str, nbytes: int, conn) -> None:
    """The handoff's receiver: on each word, copy the segment into its own array."""
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(name=name)
    src = np.ndarray(nbytes, np.uint8, buffer=shm.buf)
    dst = np.zeros(nbytes, np.uint8)
    while conn.recv():
        np.copyto(dst, src)
        conn.send(True)
    del src
    shm.close()


def shm_handoff_gbps(nbytes: int, reps: int = 5) -> float:
    """multiprocessing.shared_memory handoff: copy into a segment, another process copies out."""
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=nbytes)
    try:
        ctx = multiprocessing.get_context("fork")  # before any mwrt thread starts
        ours, theirs = ctx.Pipe()
        reader = ctx.Process(target=_shm_reader, args=(shm.name, nbytes, theirs))
        reader.start()
        seg, src = np.ndarray(nbytes, np.uint8, buffer=shm.buf), np.ones(nbytes, np.uint8)

        def once():
            np.copyto(seg, src)
            ours.send(True)
            if not ours.poll(30):
                raise SystemExit("bench_ops: the shared-memory reader did not answer in 30 s")
            ours.recv()
        once()
        seconds = statistics.median(_timed(once) for _ in range(reps))
        ours.send(False)
        reader.join(10)
        del seg
    finally:
        shm.close()
        shm.unlink()
    return nbytes / seconds / 1e9


def bulk_rows(channel: str, baselines: list, nbytes: int = 64 << 20) -> list:
    """dist_send, .numpy() and worker-to-worker .to(node=) of `nbytes` over `channel`, each
    beside `baselines`: (name, GB/s) pairs measured in this run."""
    os.environ["MWRT_CHANNEL"] = channel
    mwrt.init_master_worker(local_workers=2)
    big = np.random.rand(nbytes >> 3)
    mib = f"{nbytes >> 20} MiB"
    mwrt.dist_send(big)  # connects the channel
    send_s = statistics.median([_timed(lambda: (mwrt.dist_send(big), mwrt.synchronize()))
                                for _ in range(5)])
    t = mwrt.dist_send(big)
    gets = sorted(_timed(t.numpy) for _ in range(5))
    get_s = statistics.median(gets)
    t.to(node=1).numpy()
    move_s = statistics.median([_timed(lambda: (t.to(node=1), mwrt.synchronize()))
                                for _ in range(5)])
    mwrt.shutdown()
    goal = "≥ 5 GB/s" if channel == "shm" else ""
    rows = []
    for what, seconds in ((f"dist_send {mib} ({channel})", send_s),
                          (f".numpy() {mib} ({channel})", get_s),
                          (f"node 0 -> node 1 .to(node=1) {mib} ({channel})", move_s)):
        gbps = big.nbytes / seconds / 1e9
        for i, (name, base) in enumerate(baselines):
            rows.append((what if i == 0 else "", f"{gbps:.2f} GB/s" if i == 0 else "",
                         f"{name} {base:.2f} GB/s", f"{gbps / base:.2f}x",
                         goal if i == 0 else ""))
        if what.startswith(".numpy()"):  # new pages or reused ones: the spread says which
            rows.append(("  its five, slowest to fastest", f"{big.nbytes / gets[-1] / 1e9:.2f}-"
                         f"{big.nbytes / gets[0] / 1e9:.2f} GB/s", "", "", ""))
    return rows


def overhead_rows(reps: int = 2000, n: int = 200_000) -> list:
    """Sync round trip and async issue/completion rates against one local worker."""
    mwrt.init_master_worker(local_workers=1)
    tiny = mwrt.ones(4)
    tiny.numpy()
    mwrt_rt = median_us(tiny.numpy, reps)
    zmq_rt = zmq_round_trip(reps)
    rows = [("sync round trip, 4-element .numpy()", f"{mwrt_rt:.0f} µs",
             f"pyzmq DEALER/ROUTER {zmq_rt:.0f} µs", f"{mwrt_rt / zmq_rt:.2f}x", "≤ 1.2x")]
    x = mwrt.zeros(16)
    mwrt.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        x += 1.0
    t_issue, cpu = time.perf_counter() - t0, time.process_time() - c0
    mwrt.synchronize()
    t_done = time.perf_counter() - t0
    if x.numpy()[0] != n:
        raise SystemExit(f"bench_ops: wrong result {x.numpy()[0]} (expected {n})")
    event_cpu = event_pair_cpu_us(n // 10)
    mwrt.shutdown()
    push = zmq_push_rate(n)
    rows.append(("ops issued per second, x += 1.0 (16 floats)", f"{n / t_issue:,.0f} /s",
                 f"pyzmq PUSH loop {push:,.0f} /s", f"{n / t_issue / push:.2f}x",
                 "≥ 250,000 /s"))
    rows.append(("  master CPU per issued op", f"{cpu / n * 1e6:.1f} µs", "", "", ""))
    rows.append(("ops completed per second, same ops", f"{n / t_done:,.0f} /s", "", "",
                 "≥ 150,000 /s"))
    rows.append(("event record + wait_event pair, master CPU", f"{event_cpu:.1f} µs", "", "",
                 "≤ 10 µs"))
    return rows


def event_pair_cpu_us(n: int = 20_000) -> float:
    """Master CPU per `b.wait_event(a.record_event())` (the worker's side runs meanwhile)."""
    a, b = mwrt.Stream(), mwrt.Stream()
    with mwrt.stream(a):
        mwrt.zeros(16)
    mwrt.synchronize()
    c0 = time.process_time()
    for _ in range(n):
        b.wait_event(a.record_event())
    cpu = time.process_time() - c0
    mwrt.synchronize()
    return cpu / n * 1e6


def main(shm_only: bool = False, quick: bool = False) -> None:
    """Every row; with `shm_only` (--shm), the same-host transfer rows alone; with `quick`
    (--quick), 8 MiB and a tenth of the repetitions."""
    nbytes = 8 << 20 if quick else 64 << 20
    handoff = shm_handoff_gbps(nbytes)  # before any mwrt thread
    fresh, warm = memcpy_gbps(nbytes, fresh=True), memcpy_gbps(nbytes)
    new_pages = new_pages_gbps(nbytes)
    rows = [] if shm_only else overhead_rows(200, 20_000) if quick else overhead_rows()
    if not shm_only:
        rows += bulk_rows("tcp", [("raw socket", raw_socket_gbps(nbytes))], nbytes)
    rows += bulk_rows("shm", [("shared_memory handoff", handoff),
                              ("memcpy into np.empty", fresh), ("memcpy into warm", warm),
                              ("memcpy into new pages", new_pages)], nbytes)
    print(f"{'what':46} {'mwrt':>16}   {'baseline (same run)':32} {'ratio':>6}   goal")
    for row in rows:
        print(f"{row[0]:46} {row[1]:>16}   {row[2]:32} {row[3]:>6}   {row[4]}")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def graph_replay_rows(steps: int = 2000, width: int = 100) -> list:
    """A 100-op step issued eagerly, then captured once and replayed (issue 15)."""
    mwrt.init_master_worker(local_workers=1)
    x = mwrt.zeros(16)

    def step():
        for _ in range(width // 2):
            x.mul_(0.5)
            x.add_(1.0)

    def rates(run) -> tuple:
        mwrt.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            run()
        issued = time.perf_counter() - t0
        mwrt.synchronize()
        return steps * width / issued, steps * width / (time.perf_counter() - t0)

    eager = rates(step)
    with mwrt.graph() as g:
        step()
    replay = rates(g.replay)
    if abs(x.numpy()[0] - 2.0) > 1e-3:  # 0.5x + 1 converges to 2
        raise SystemExit(f"bench_ops: graph replay gave {x.numpy()[0]} (expected 2.0)")
    mwrt.shutdown()
    return [(f"graph replay, {width}-op step: issue", f"{replay[0]:,.0f} ops/s",
             f"eager issue {eager[0]:,.0f} ops/s", f"{replay[0] / eager[0]:.2f}x"),
            ("graph replay: completed", f"{replay[1]:,.0f} ops/s",
             f"eager completed {eager[1]:,.0f} ops/s", f"{replay[1] / eager[1]:.2f}x"),
            ("  target (effective, completed)", "1,000,000 ops/s", "",
             f"{replay[1] / 1e6:.2f}x")]


def print_graph_replay(steps: int = 2000) -> None:
    for row in graph_replay_rows(steps):
        print(f"{row[0]:46} {row[1]:>16}   {row[2]:30} {row[3]:>6}")


# -- as a user measures it: every figure in fresh processes (--fresh) -------------------------

_FRESH_SYNC = """
import sys, time, mwrt
reps, workers, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
mwrt.init_master_worker(local_workers=workers)
x = mwrt.ones(1 if kind == "read" else 4)
once = x.numpy if kind == "read" else (lambda: float(x.sum()))
for _ in range(200):
    once()
times = []
for _ in range(reps):
    t = time.perf_counter(); once(); times.append(time.perf_counter() - t)
times.sort()
print(times[len(times) // 2] * 1e6, times[len(times) * 99 // 100] * 1e6)
mwrt.shutdown()
"""

_FRESH_ECHO = """
import subprocess, sys, time, zmq
echo = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, text=True)
ctx = zmq.Context(); dealer = ctx.socket(zmq.DEALER)
dealer.connect(f"tcp://127.0.0.1:{int(echo.stdout.readline())}")
times = []
for i in range(200 + int(sys.argv[1])):
    t = time.perf_counter(); dealer.send_multipart([b"x" * 16]); dealer.recv_multipart()
    times.append(time.perf_counter() - t)
dealer.send_multipart([b"stop"]); echo.wait(10)
times = sorted(times[200:])
print(times[len(times) // 2] * 1e6, times[len(times) * 99 // 100] * 1e6)
"""

_FRESH_ISSUE = """
import sys, time, mwrt
mwrt.init_master_worker(local_workers=1)
x = mwrt.zeros(16)
x.numpy()
n = int(sys.argv[1])
t = time.perf_counter()
for _ in range(n):
    x += 1
print(n / (time.perf_counter() - t))
x.numpy()
mwrt.shutdown()
"""

_FRESH_PUSH = """
import subprocess, sys, time, zmq
sink = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, text=True)
ctx = zmq.Context(); push = ctx.socket(zmq.PUSH)
push.connect(f"tcp://127.0.0.1:{int(sink.stdout.readline())}")
n, msg = int(sys.argv[1]), b"x" * 64
t = time.perf_counter()
for _ in range(n):
    push.send(msg)
print(n / (time.perf_counter() - t))
push.send(b"stop"); sink.wait(30)
"""

_FRESH_NUMPY = """
import sys, time, numpy as np, mwrt
mwrt.init_master_worker(local_workers=1)
t = mwrt.ones(int(sys.argv[1]) // 4)
float(t[0])
start = time.perf_counter()
got = t.numpy(copy=False) if sys.argv[2:] == ["view"] else t.numpy()
print(int(sys.argv[1]) / (time.perf_counter() - start) / 1e9)
mwrt.shutdown()
"""

_FRESH_PAGES = """
import sys, time, numpy as np
src = np.ones(int(sys.argv[1]) // 4, np.float32)
start = time.perf_counter()
out = np.empty_like(src); np.copyto(out, src)
print(int(sys.argv[1]) / (time.perf_counter() - start) / 1e9)
"""

_FRESH_RAY = """
import sys, time, numpy as np, ray
ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
ref = ray.put(np.ones(int(sys.argv[1]) // 4, np.float32))
start = time.perf_counter()
ray.get(ref)
print(int(sys.argv[1]) / (time.perf_counter() - start) / 1e9)
ray.shutdown()
"""


_FRESH_SKLEARN = """
import statistics, sys, time, numpy as np, mwrt, sklearn
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from mwrt.master.client import Node
WAITS = [0]
def counted(wait):  # counts round trips the same way on any version of mwrt
    def run(*args, **kwargs):
        WAITS[0] += 1
        return wait(*args, **kwargs)
    return run
Node.wait = counted(Node.wait)
mwrt.init_master_worker()
CALLS = {"StandardScaler().fit_transform": lambda X, y: StandardScaler().fit_transform(X),
         "Ridge().fit": lambda X, y: Ridge(solver="svd").fit(X, y).coef_}
for n, d in ((1000, 20), (20000, 50)):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d)); y = X @ rng.standard_normal(d)
    Xt, yt = mwrt.dist_send(X), mwrt.dist_send(y)
    for name, call in CALLS.items():
        with sklearn.config_context(array_api_dispatch=True):
            call(Xt, yt)
            ours, waits = [], 0
            for _ in range(int(sys.argv[1])):
                w, t = WAITS[0], time.perf_counter()
                got = np.asarray(call(Xt, yt))
                ours.append(time.perf_counter() - t)
                waits = WAITS[0] - w
        theirs = []
        for _ in range(int(sys.argv[1])):
            t = time.perf_counter(); want = call(X, y); theirs.append(time.perf_counter() - t)
        if not np.allclose(got, want):
            raise SystemExit(f"bench_ops: {name} on mwrt differs from NumPy's")
        print(f"{name}@{n}x{d}", statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3,
              waits, flush=True)
mwrt.shutdown()
"""


def sync_bound_rows(reps: int = 5) -> list:
    """scikit-learn on mwrt tensors (array_api_dispatch=True) vs on NumPy arrays, in a fresh
    session: a library that reads values pays a round trip for each (counted by mwrt.stats)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."),
               SCIPY_ARRAY_API="1")
    done = subprocess.run([sys.executable, "-c", _FRESH_SKLEARN, str(reps)], env=env,
                          timeout=600, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench_ops --sklearn: a run failed: {done.stderr[-2000:]}")
    rows = []
    for line in done.stdout.strip().splitlines():
        what, ours, theirs, waits = line.split()
        rows.append((f"{what.replace('@', ' on ')}", f"{float(ours):.2f} ms",
                     f"NumPy {float(theirs):.2f} ms", f"{float(ours) / float(theirs):.2f}x",
                     f"{waits} round trips"))
    return rows


def _fresh(script: str, *args) -> float:
    """Run `script` in a fresh Python process; the number it prints last."""
    return _fresh_line(script, *args)[-1]


_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _fresh_line(script: str, *args, root: str = _ROOT) -> list[float]:
    """Run `script` in a fresh Python process (mwrt imported from `root`); the numbers of the
    last line it prints."""
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, timeout=300,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench_ops --fresh: a run failed: {done.stderr[-2000:]}")
    return [float(word) for word in done.stdout.strip().splitlines()[-1].split()]


def _spread(values: list) -> str:
    return f"{min(values):,.2f}-{max(values):,.2f}"


# The round trips a user feels, each (label, local workers, what is timed).
ROUND_TRIPS = (("x.numpy(), 1 element, 1 local worker", 1, "read"),
               ("x.numpy(), 1 element, 2 local workers", 2, "read"),
               ("float(t.sum()), 4 elements, 2 local workers", 2, "sum"))


def round_trip_runs(tries: int, reps: int, roots: tuple) -> tuple[dict, list]:
    """Each of ROUND_TRIPS from each tree of `roots` in fresh sessions, `tries` rounds, with
    a pyzmq DEALER/ROUTER echo in fresh processes before the first run and after every run
    (unpinned, never beside a live session); a round's order is the last one's reversed.
    Each run's (p50, p99, p50 ratio, p99 ratio), its ratios to the mean of the echoes just
    before and after it, so the machine's drift between runs hits both alike; and every
    echo's (p50, p99)."""
    runs: dict = {(root, kind): [] for root in roots for kind in ROUND_TRIPS}
    order = list(runs)
    echoes = [_fresh_line(_FRESH_ECHO, reps, _ECHO)]
    for _ in range(tries):
        for root, kind in order:
            got = _fresh_line(_FRESH_SYNC, reps, kind[1], kind[2], root=root)
            before, after = echoes[-1], _fresh_line(_FRESH_ECHO, reps, _ECHO)
            echoes.append(after)
            runs[root, kind].append((got[0], got[1], 2 * got[0] / (before[0] + after[0]),
                                     2 * got[1] / (before[1] + after[1])))
        order.reverse()
    return runs, echoes


def round_trip_rows(tries: int = 5, reps: int = 2000, roots: tuple = (_ROOT,)) -> list:
    """ROUND_TRIPS as round_trip_runs() measures them: medians over the rounds of each p50
    and p99 and of their ratios to the echoes around each run, and the ratios' spread. With
    a second tree in `roots` (--against DIR), its rows follow each of this tree's."""
    runs, echoes = round_trip_runs(tries, reps, roots)
    e50 = statistics.median(e[0] for e in echoes)
    e99 = statistics.median(e[1] for e in echoes)
    rows = []
    for kind, root in ((kind, root) for kind in ROUND_TRIPS for root in roots):
        got = runs[root, kind]
        p50, p99, r50, r99 = (statistics.median(run[i] for run in got) for i in range(4))
        where = f" [{root}]" if root != _ROOT else ""
        rows.append((f"{kind[0]}{where}: p50", f"{p50:.0f} us", f"DEALER/ROUTER echo {e50:.0f} us",
                     f"{r50:.2f}x", "<= 1.5x, then 1.2x"))
        rows.append(("  p99", f"{p99:.0f} us", f"echo p99 {e99:.0f} us", f"{r99:.2f}x", "<= 2x"))
        rows.append(("  ratio's spread over the rounds", f"p50 {_spread([r[2] for r in got])}x",
                     f"p99 {_spread([r[3] for r in got])}x", "", ""))
    rows.append(("  echo's spread over the runs", "", f"p50 {_spread([e[0] for e in echoes])} "
                 "us", "", f"load {os.getloadavg()[0]:.1f}"))
    return rows


def fresh_rows(tries: int = 5) -> list:
    """The sync round trips, the eager issue rate and a 64 MiB .numpy() as a user measures
    them: each figure from fresh processes, its baseline from fresh processes run right
    after it (never beside a live session), medians of `tries` alternating pairs."""
    rows = round_trip_rows(tries)
    issue, push = [], []
    for _ in range(tries):
        issue.append(_fresh(_FRESH_ISSUE, 100_000))
        push.append(_fresh(_FRESH_PUSH, 200_000, _SINK))
    nbytes = 64 << 20
    got, views, pages = [], [], []
    for _ in range(2 * tries):  # in turns, so the load is the same for each
        got.append(_fresh(_FRESH_NUMPY, nbytes))
        views.append(_fresh(_FRESH_NUMPY, nbytes, "view"))
        pages.append(_fresh(_FRESH_PAGES, nbytes))
    rows += [("eager issue rate, x += 1 (fresh sessions)", f"{statistics.median(issue):,.0f}/s",
              f"bare PUSH loop {statistics.median(push):,.0f}/s",
              f"{statistics.median(issue) / statistics.median(push):.2f}x", ">= 0.25x"),
             (".numpy() 64 MiB, first of a session", f"{statistics.median(got):.2f} GB/s",
              f"copy into new pages {statistics.median(pages):.2f} GB/s",
              f"{statistics.median(got) / statistics.median(pages):.2f}x", ">= 0.8x"),
             ("  spread over the runs", _spread(got), _spread(pages), "", ""),
             (".numpy(copy=False) 64 MiB, first of a session", f"{statistics.median(views):.2f} "
              "GB/s", f"copy into new pages {statistics.median(pages):.2f} GB/s",
              f"{statistics.median(views) / statistics.median(pages):.2f}x", ">= 0.8x"),
             ("  spread over the runs", _spread(views), "", "", "")]
    try:
        import ray  # noqa: F401
    except ImportError:
        rows.append(("  Ray's ray.get of 64 MiB", "", "(ray not installed)", "", ""))
    else:
        ray_gbps = [_fresh(_FRESH_RAY, nbytes) for _ in range(tries)]
        ray_median = statistics.median(ray_gbps)
        rows.append(("  Ray's ray.get of 64 MiB (fresh)", "", f"{ray_median:.2f} GB/s",
                     f"{statistics.median(got) / ray_median:.2f}x", ""))
    return rows + sync_bound_rows()


def _option(name: str, default):
    """The value after `name` on the command line, else `default`."""
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args[:-1] else default


def print_fresh() -> None:
    print(f"{'what (fresh processes)':46} {'mwrt':>16}   {'baseline (same run)':32} {'ratio':>6}"
          "   goal")
    if "--round-trips" in sys.argv[1:]:
        against = _option("--against", None)
        rows = round_trip_rows(int(_option("--tries", 5)), int(_option("--reps", 2000)),
                               (_ROOT,) if against is None else (_ROOT, against))
    elif "--sklearn" in sys.argv[1:]:
        rows = sync_bound_rows()
    else:
        rows = fresh_rows()
    for row in rows:
        print(f"{row[0]:46} {row[1]:>16}   {row[2]:32} {row[3]:>6}   {row[4]}")


if __name__ == "__main__":
    if {"--fresh", "--round-trips", "--sklearn"} & set(sys.argv[1:]):
        print_fresh()
        raise SystemExit
    main(shm_only="--shm" in sys.argv[1:], quick="--quick" in sys.argv[1:])
    if "--shm" not in sys.argv[1:]:
        print_graph_replay(200 if "--quick" in sys.argv[1:] else 2000)
