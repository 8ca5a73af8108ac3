"""How mwrt's costs grow with the number of nodes, each beside a baseline measured in the same run.

0. A session's start and stop, each in a fresh process: `import mwrt` with its API,
   `init_master_worker()` (2 local daemons) and its CPU, the daemons' CPU from start to exit,
   and `shutdown()` (baseline: a bare `python -c "import numpy, zmq"`'s start, CPU, and
   stop by SIGTERM, in the same rounds).
1. Master-worker, N local daemons (N = 1, 2, 4, 8, 16, 32), `init_master_worker(
   local_workers=N)`: time to init, split into starting the daemons (baseline: N plain
   `python -c "import numpy, zmq"` started one after another, as init starts daemons), the
   sessions and the data-channel join; the fan-out round, one tiny op on every node then
   `mwrt.synchronize()`, and the same with every node's batch sent before the first wait
   (baseline: one 16-byte pyzmq DEALER/ROUTER echo to each of N echo processes, all sent
   then all received), and `float(t.sum())` node after node; ops issued/s across the N
   nodes (`x += 1.0` round robin) and the master's CPU per op; what the master gained in
   fds, TCP sockets and threads; each daemon's RSS, threads and fds; heartbeats per second,
   computed (N / MWRT_HEARTBEAT_INTERVAL pings, as many pongs) and counted on the master's
   heartbeat thread over idle seconds.
2. SPMD over simulated hosts (tests/support/hosts.py, root only; scale_spmd.py), k = 2, 4, 8,
   16, one rank each:
   `init_process_group("tcp", init_method="tcp://<host0>:PORT")` with a job secret, timed
   from a common start (every rank imported mwrt and waits on a go file); a 4 KiB all_reduce
   (baseline: one 4 KiB hop to the next rank over a plain socket, the cost of one of the
   log2(k) steps of recursive doubling) and a 16 MiB all_reduce's bus bandwidth (baseline:
   a plain-socket ring moving the same 2(k-1)/k bytes, nothing reduced); each rank's TCP
   sockets after init and after each size (from /proc/self/fd and /proc/self/net/tcp); the
   store requests of init, counted by wrapping TCPStore's client call and rank 0's server
   handler in the rank's process (the store keeps no count itself); threads per rank.

Everything runs on this machine's cores: absolute times are the CPU's, not a network's.

    python benchmarks/bench_scale.py [--quick]   # --quick: N <= 2, k = 2, few reps
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import mwrt  # noqa: E402
from mwrt import config  # noqa: E402
from baselines import EchoFarm, timed  # noqa: E402
from hostkit import KIB, MIB, fd_count, status_field, tcp_sockets  # noqa: E402
from scale_spmd import ROLES, spmd_table  # noqa: E402



# -- table 0: a session's start and stop, each in a fresh process --------------------------

_SESSION = """
import json, os, time
t, c = time.perf_counter(), time.process_time()
import mwrt
mwrt.init_master_worker  # the package and its API, loaded on first use
imported, t, c = time.perf_counter() - t, time.perf_counter(), time.process_time()
mwrt.init_master_worker()
init, init_cpu = time.perf_counter() - t, time.process_time() - c
daemons = 0.0  # the CPU of this master's daemons (and their zygote) once they listen
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            mine = f"--parent-pid\\0{os.getpid()}\\0".encode() in f.read()
        with open(f"/proc/{pid}/stat") as f:
            ticks = f.read().rpartition(")")[2].split()[11:13]
    except OSError:
        continue
    daemons += mine * sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")
t = time.perf_counter()
mwrt.shutdown()
print(json.dumps([imported, init, init_cpu, time.perf_counter() - t, daemons]))
"""
_BARE = "import numpy, zmq, sys; print(1, flush=True); sys.stdin.read()"


def bare_python() -> tuple[float, float, float]:
    """One plain Python importing numpy and zmq: its start (s), CPU (s) and stop by SIGTERM (s)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _BARE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    proc.stdout.readline()
    started, stop = time.perf_counter() - start, time.perf_counter()
    proc.terminate()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped above
    return started, usage.ru_utime + usage.ru_stime, time.perf_counter() - stop


def session(fork: str) -> list[float]:
    """_SESSION's figures in a fresh process, its daemons forked by a zygote or not."""
    out = subprocess.run([sys.executable, "-c", _SESSION], capture_output=True, text=True,
                         check=True, timeout=120,
                         env=dict(os.environ, MWRT_FORK_LOCAL_WORKERS=fork)).stdout
    return json.loads(out.splitlines()[-1])


def start_stop_table(reps: int) -> None:
    """`import mwrt`, init_master_worker() (2 local daemons) and shutdown() in fresh
    processes, with daemons forked and fresh, beside a bare Python's start, CPU and stop in
    the same rounds."""
    forked, fresh, bare = [], [], []
    for _ in range(reps):
        bare.append(bare_python())
        forked.append(session("1"))
        fresh.append(session("0"))
    imp, init, init_cpu, down, daemons = (statistics.median(r[i] for r in forked)
                                          for i in range(5))
    init_fresh, daemons_fresh = (statistics.median(r[i] for r in fresh) for i in (1, 4))
    start, cpu, stop = (statistics.median(b[i] for b in bare) for i in range(3))
    cached = "not written (PYTHONDONTWRITEBYTECODE)" if sys.dont_write_bytecode else "cached"
    print(f"\n## a session's start and stop, fresh processes (medians of {reps}; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; bytecode {cached})\n")
    print("| what | mwrt | baseline, same rounds | ratio |\n|---|---|---|---|")
    for what, mine, base, name in [
            ("`import mwrt` and its API s", imp, start, "a bare Python's start (numpy, zmq)"),
            ("init_master_worker() s, 2 local daemons", init, start, "the same"),
            ("the same, each daemon a fresh process", init_fresh, start, "the same"),
            ("CPU s per daemon to listening, its zygote's imports included", daemons / 2, cpu,
             "a bare Python's CPU"),
            ("the same, each daemon a fresh process", daemons_fresh / 2, cpu, "the same"),
            ("the master's CPU s in init", init_cpu, cpu, "the same"),
            ("shutdown() s", down, stop, "a bare Python stopped by SIGTERM")]:
        print(f"| {what} | {mine:.3f} | {base:.3f} ({name}) | {mine / base:.2f}x |")


# -- table 1: master-worker with N local daemons -------------------------------------------

def bare_starts(n: int) -> float:
    """Seconds to start n plain Pythons importing numpy and zmq, one after another."""
    start = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-c", "import numpy, zmq"], check=True, timeout=60)
    return time.perf_counter() - start


def timed_init(n: int) -> dict:
    """init_master_worker(local_workers=n), its phases timed by wrapping two of its steps."""
    from mwrt.master import cluster as cluster_mod

    phases = {}
    start_workers, join = cluster_mod.start_local_workers, cluster_mod.Cluster._join_data_channel

    def start_timed(*args):
        t = time.perf_counter()
        try:
            return start_workers(*args)
        finally:
            phases["daemons"] = time.perf_counter() - t

    def join_timed(self, *args):
        t = time.perf_counter()
        try:
            return join(self, *args)
        finally:
            phases["join"] = time.perf_counter() - t

    Cluster = cluster_mod.Cluster
    cluster_mod.start_local_workers, Cluster._join_data_channel = start_timed, join_timed
    try:
        phases["init"] = timed(lambda: mwrt.init_master_worker(local_workers=n))
    finally:
        cluster_mod.start_local_workers, Cluster._join_data_channel = start_workers, join
    phases["sessions"] = phases["init"] - phases["daemons"] - phases["join"]
    return phases


def heartbeat_rate(window: float) -> tuple[float, float]:
    """Pings sent and pongs received per second by the master's heartbeat thread, idle."""
    from mwrt.master.cluster import current
    from mwrt.protocol import wire

    beat = current().heartbeat
    counts = {"ping": 0, "pong": 0}
    send, on_message = beat._send, beat._on_message

    def counting_send(index, message):
        counts["ping"] += isinstance(message, wire.Ping)
        send(index, message)

    def counting_on_message(index, message):
        counts["pong"] += isinstance(message, wire.Pong)
        on_message(index, message)

    beat._send, beat._on_message = counting_send, counting_on_message  # this instance only
    time.sleep(window)
    del beat._send, beat._on_message
    return counts["ping"] / window, counts["pong"] / window


def synchronize_flushed() -> None:
    """mwrt.synchronize() with every node's batch sent before the first wait: what the fan-out
    would cost if synchronize() did that (today a node's Sync waits in its batch until the
    master waits on that node, or the heartbeat thread sends it after 2 ms)."""
    from mwrt.master.cluster import current
    from mwrt.protocol import wire

    pending = []
    for node in current().nodes:
        for stream in node.known_streams():
            sync = wire.Sync(id=next(node.ids), stream=stream, token=next(node.tokens))
            node.issue(sync)
            pending.append((node, sync.token))
    for node in current().nodes:
        node.flush()
    for node, token in pending:
        node.wait(token, "synchronize_flushed()")


def fan_out(ones: list, reps: int) -> dict:
    """Median seconds of a round: `t += 1` on every node then a sync of all of them, by
    synchronize(), by synchronize_flushed(), and by float(t.sum()) node after node."""
    def round_with(sync):
        for t in ones:
            t += 1.0
        sync()

    def one_by_one():
        for t in ones:
            float(t.sum())

    rounds = {"sync": lambda: round_with(mwrt.synchronize),
              "flushed": lambda: round_with(synchronize_flushed), "serial": one_by_one}
    times = {name: [] for name in rounds}
    for rep in range(reps + 1):
        for name, fn in rounds.items():  # in turns: the same load for each
            seconds = timed(fn)
            if rep:  # the first is a warm-up
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def issue_rate(xs: list, ops: int) -> tuple[float, float]:
    """Ops issued per second, `x += 1.0` round robin over every node's x, and the master's
    CPU seconds per op (all its threads): the rate falls where daemons take the CPU."""
    mwrt.synchronize()
    n = len(xs)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(ops):
        xs[i % n] += 1.0
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    mwrt.synchronize()
    got = sum(float(x[0]) for x in xs)
    if got != ops:
        raise SystemExit(f"bench_scale: round robin lost ops (got {got}, expected {ops})")
    return ops / seconds, cpu / ops


def mw_row(n: int, echoes: EchoFarm, reps: int, ops: int, window: float) -> dict:
    """Every figure of table 1 for n local daemons."""
    from mwrt.master.cluster import current

    before = (fd_count(), tcp_sockets()["established"], status_field("self", "Threads"))
    row = timed_init(n)
    try:
        workers = [w.process.pid for w in current().local]
        row.update(fan_out([mwrt.zeros(4, node=i) for i in range(n)], reps))
        echoes.round(n)
        row["echo"] = statistics.median(timed(lambda: echoes.round(n)) for _ in range(reps))
        row["issue"], row["cpu_op"] = issue_rate([mwrt.zeros(16, node=i) for i in range(n)], ops)
        row["pings"], row["pongs"] = heartbeat_rate(window)
        after = (fd_count(), tcp_sockets()["established"], status_field("self", "Threads"))
        row["fds"], row["tcp"], row["threads"] = (a - b for a, b in zip(after, before))
        rss = [status_field(pid, "VmRSS") / 1024 for pid in workers]
        row["rss"] = (statistics.median(rss), max(rss))
        row["worker_threads"] = statistics.median(status_field(p, "Threads") for p in workers)
        row["worker_fds"] = statistics.median(fd_count(p) for p in workers)
    finally:
        mwrt.shutdown()
    row["bare"] = bare_starts(n)
    return row


def mw_table(sizes: list, reps: int, ops: int, window: float) -> None:
    """Table 1, printed as markdown."""
    interval = config.get("heartbeat_interval")
    echoes = EchoFarm(max(sizes))
    try:
        rows = []
        for n in sizes:
            rows.append((n, mw_row(n, echoes, reps, ops, window)))
            print(f"# master-worker N={n}: done", file=sys.stderr)
    finally:
        echoes.close()
    print(f"\n## master-worker, N local daemons (medians of {reps} rounds; {ops} ops issued; "
          f"heartbeat interval {interval} s, counted over {window} s)\n")
    print("| N | init s (daemons + sessions + join) | baseline: N bare Python starts s | "
          "fan-out: op on each + synchronize() ms | same, all batches sent first ms | "
          "baseline: N pyzmq echoes ms | float(t.sum()) node by node ms | ops issued/s | "
          "master CPU µs/op | "
          "master fds / TCP / threads added | "
          "worker RSS MiB median, max | worker threads, fds | heartbeats/s computed | "
          "pings, pongs/s counted |")
    print("|" + "---|" * 14)
    for n, r in rows:
        print(f"| {n} | {r['init']:.2f} ({r['daemons']:.2f} + {r['sessions']:.2f} + "
              f"{r['join']:.2f}) | {r['bare']:.2f} | {r['sync'] * 1e3:.2f} | "
              f"{r['flushed'] * 1e3:.2f} | "
              f"{r['echo'] * 1e3:.2f} | {r['serial'] * 1e3:.2f} | {r['issue']:,.0f} | "
              f"{r['cpu_op'] * 1e6:.1f} | "
              f"{r['fds']} / {r['tcp']} / {r['threads']} | {r['rss'][0]:.0f}, {r['rss'][1]:.0f} "
              f"| {r['worker_threads']:.0f}, {r['worker_fds']:.0f} | {n / interval:.0f} + "
              f"{n / interval:.0f} | {r['pings']:.0f}, {r['pongs']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N <= 2, k = 2, few repetitions")
    ap.add_argument("--skip-hosts", action="store_true", help="table 1 only")
    ap.add_argument("--skip-workers", action="store_true", help="table 2 only")
    ap.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    ap.add_argument("--args", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:  # a program on a simulated host
        given = json.loads(args.args)
        given["reps"] = {int(n): r for n, r in given["reps"].items()}
        print(json.dumps(ROLES[args.role](**given)), flush=True)
        return
    started = time.monotonic()
    if not args.skip_workers:
        start_stop_table(3 if args.quick else 10)
        if args.quick:
            mw_table([1, 2], reps=5, ops=2000, window=1.0)
        else:
            mw_table([1, 2, 4, 8, 16, 32], reps=20, ops=20000, window=3.0)
    if not args.skip_hosts:
        if args.quick:
            spmd_table([2], {4 * KIB: 10, 16 * MIB: 2})
        else:
            spmd_table([2, 4, 8, 16], {4 * KIB: 50, 16 * MIB: 5})
    print(f"# {time.monotonic() - started:.1f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
