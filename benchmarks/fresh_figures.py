"""bench_ops.py --fresh: the figures as a user measures them, each in fresh processes beside a
baseline also in fresh processes: the sync round trips (a read, and an op then its read: p50
and p99, in rounds with an echo between any two runs), the eager issue rate, the first 64 MiB
.numpy() of a session (and its copy=False view), and scikit-learn on mwrt tensors vs NumPy
with the round trips counted. --round-trips, --read and --sklearn run those rows alone
(the first two beside another tree's with --against DIR, in the same rounds)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

from baselines import ECHO, ECHO_IPC, SINK

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

FRESH_ECHO = """
import subprocess, sys, time, zmq
echo = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, text=True)
ctx = zmq.Context(); dealer = ctx.socket(zmq.DEALER)
line = echo.stdout.readline().strip()  # a port, or a whole address (ECHO_IPC)
dealer.connect(line if "://" in line else f"tcp://127.0.0.1:{int(line)}")
times = []
for i in range(200 + int(sys.argv[1])):
    t = time.perf_counter(); dealer.send_multipart([b"x" * 16]); dealer.recv_multipart()
    times.append(time.perf_counter() - t)
dealer.send_multipart([b"stop"]); echo.wait(10)
times = sorted(times[200:])
print(times[len(times) // 2] * 1e6, times[len(times) * 99 // 100] * 1e6)
"""

# The floor of a local round trip: 16 bytes each way on a Unix stream socket between two
# fresh processes, no ZeroMQ (the path a lane takes, protocol/lane.py).
FRESH_UNIX_ECHO = """
import os, socket, subprocess, sys, tempfile, time
folder = tempfile.mkdtemp(); path = os.path.join(folder, "echo")
server = (f"import socket; s = socket.socket(socket.AF_UNIX); s.bind({path!r}); s.listen(1); "
          "print(1, flush=True); c, _ = s.accept()\\nwhile (d := c.recv(65536)): c.sendall(d)")
echo = subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
echo.stdout.readline()
client = socket.socket(socket.AF_UNIX); client.connect(path)
times = []
for i in range(200 + int(sys.argv[1])):
    t = time.perf_counter(); client.sendall(b"x" * 16); client.recv(65536)
    times.append(time.perf_counter() - t)
client.close(); echo.wait(10); os.unlink(path); os.rmdir(folder)
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
    return fresh_line(script, *args)[-1]


_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def fresh_line(script: str, *args, root: str = _ROOT) -> list[float]:
    """Run `script` in a fresh Python process (mwrt imported from `root`); the numbers of the
    last line it prints."""
    env = dict(os.environ, PYTHONPATH=root)
    # In `root`: `python -c` and the local workers' `python -m` put the working directory
    # first on sys.path, where another tree's mwrt would shadow root's.
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, timeout=300,
                          capture_output=True, text=True, check=False, cwd=root)
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
    Each run's (p50, p99, p50 ratio, p99 ratio, p50 ratios to the Unix socket's echo and to
    a bare Unix stream socket's, the floor), its
    ratios to the mean of the echoes just before and after it, so the machine's drift
    between runs hits both alike; and every tcp echo's (p50, p99)."""
    runs: dict = {(root, kind): [] for root in roots for kind in ROUND_TRIPS}
    order = list(runs)
    echoes = [fresh_line(FRESH_ECHO, reps, ECHO)]
    ipc = [fresh_line(FRESH_ECHO, reps, ECHO_IPC)]
    unix = [fresh_line(FRESH_UNIX_ECHO, reps)]
    for _ in range(tries):
        for root, kind in order:
            got = fresh_line(_FRESH_SYNC, reps, kind[1], kind[2], root=root)
            before, after = echoes[-1], fresh_line(FRESH_ECHO, reps, ECHO)
            echoes.append(after)
            ipc.append(fresh_line(FRESH_ECHO, reps, ECHO_IPC))
            unix.append(fresh_line(FRESH_UNIX_ECHO, reps))
            runs[root, kind].append((got[0], got[1], 2 * got[0] / (before[0] + after[0]),
                                     2 * got[1] / (before[1] + after[1]),
                                     2 * got[0] / (ipc[-2][0] + ipc[-1][0]),
                                     2 * got[0] / (unix[-2][0] + unix[-1][0])))
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
        ipc = statistics.median(run[4] for run in got)  # local workers' path: a Unix socket
        rows.append(("  p50 beside the same echo on a Unix socket", "", "", f"{ipc:.2f}x", ""))
        floor = statistics.median(run[5] for run in got)
        rows.append(("  p50 beside a bare Unix stream socket's echo (the floor)", "", "",
                     f"{floor:.2f}x", ""))
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
        push.append(_fresh(_FRESH_PUSH, 200_000, SINK))
    nbytes = 64 << 20
    runs = read_runs(2 * tries, (_ROOT,), views=True)
    got, views, pages = runs[_ROOT], runs["view"], runs["pages"]
    rows += [("eager issue rate, x += 1 (fresh sessions)", f"{statistics.median(issue):,.0f}/s",
              f"bare PUSH loop {statistics.median(push):,.0f}/s",
              f"{statistics.median(issue) / statistics.median(push):.2f}x", ">= 0.25x"),
             *read_rows(runs, (_ROOT,)),
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


def read_runs(runs: int, roots: tuple, views: bool = False, nbytes: int = 64 << 20) -> dict:
    """The first `nbytes` .numpy() of `runs` fresh sessions of each tree of `roots` (with
    `views`, of the copy=False view too, from the first tree), each round's sessions and a
    memcpy into fresh pages ("pages") in turns, a round's order the last one's reversed, so
    the load is the same for each; GB/s per run, by root."""
    kinds = [*roots, *(["view"] if views else []), "pages"]
    got: dict = {kind: [] for kind in kinds}
    for _ in range(runs):
        for kind in kinds:
            if kind == "pages":
                got[kind].append(_fresh(_FRESH_PAGES, nbytes))
            elif kind == "view":
                got[kind].append(fresh_line(_FRESH_NUMPY, nbytes, "view")[-1])
            else:
                got[kind].append(fresh_line(_FRESH_NUMPY, nbytes, root=kind)[-1])
        kinds.reverse()
    return got


def read_rows(runs: dict, roots: tuple) -> list:
    """read_runs()' medians, each tree's beside the memcpy's of the same rounds, with the
    spreads."""
    pages = runs["pages"]
    rows = []
    for root in roots:
        where = f" [{root}]" if root != _ROOT else ""
        got = runs[root]
        rows += [(f".numpy() 64 MiB, first of a session{where}", f"{statistics.median(got):.2f} "
                  "GB/s", f"copy into new pages {statistics.median(pages):.2f} GB/s",
                  f"{statistics.median(got) / statistics.median(pages):.2f}x", ">= 0.8x"),
                 ("  spread over the runs", _spread(got), _spread(pages), "", "")]
    return rows


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
    elif "--read" in sys.argv[1:]:  # the first 64 MiB .numpy(), alone (beside another tree)
        against = _option("--against", None)
        roots = (_ROOT,) if against is None else (_ROOT, against)
        rows = read_rows(read_runs(int(_option("--tries", 10)), roots), roots)
    else:
        rows = fresh_rows()
    for row in rows:
        print(f"{row[0]:46} {row[1]:>16}   {row[2]:32} {row[3]:>6}   {row[4]}")
