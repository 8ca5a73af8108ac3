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

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mwrt  # noqa: E402
import fresh_figures  # noqa: E402
from baselines import (  # noqa: E402
    median_us, memcpy_gbps, new_pages_gbps, raw_socket_gbps, shm_handoff_gbps, timed,
    zmq_push_rate, zmq_round_trip)


def bulk_rows(channel: str, baselines: list, nbytes: int = 64 << 20) -> list:
    """dist_send, .numpy() and worker-to-worker .to(node=) of `nbytes` over `channel`, each
    beside `baselines`: (name, GB/s) pairs measured in this run."""
    os.environ["MWRT_CHANNEL"] = channel
    mwrt.init_master_worker(local_workers=2)
    big = np.random.rand(nbytes >> 3)
    mib = f"{nbytes >> 20} MiB"
    mwrt.dist_send(big)  # connects the channel
    send_s = statistics.median([timed(lambda: (mwrt.dist_send(big), mwrt.synchronize()))
                                for _ in range(5)])
    t = mwrt.dist_send(big)
    gets = sorted(timed(t.numpy) for _ in range(5))
    get_s = statistics.median(gets)
    t.to(node=1).numpy()
    move_s = statistics.median([timed(lambda: (t.to(node=1), mwrt.synchronize()))
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
    where_rows = issued_where_rows(x, n // 10)
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
    return rows + where_rows


# x += 1.0 in a loop at the top of a script, and after 400 lines of it (a long script or
# notebook cell): the op's issue site is the loop's line, found on every op.
_LOOP = "for _ in range(n):\n    x += 1.0\n"
_LONG = "".join(f"v{i} = {i}\n" for i in range(400)) + _LOOP


def issued_where_rows(x, n: int) -> list:
    """Master CPU per `x += 1.0` where users write it and benchmarks seldom do: at line 400
    of a script, and inside an np.errstate block; each beside the same loop at line 1 and
    outside any block, in this run (the ratio's goal is 1x)."""
    def cpu_us(source: str, errstate: bool = False) -> float:
        code, scope = compile(source, "<a user's script>", "exec"), {"x": x, "n": n}
        mwrt.synchronize()
        c0 = time.thread_time()  # this thread's: the heartbeat's would blur a few us
        if errstate:
            with np.errstate(divide="ignore", invalid="ignore"):
                exec(code, scope)
        else:
            exec(code, scope)
        cpu = time.thread_time() - c0
        mwrt.synchronize()
        return cpu / n * 1e6

    short = min(cpu_us(_LOOP) for _ in range(3))
    long = min(cpu_us(_LONG) for _ in range(3))
    blocked = min(cpu_us(_LOOP, errstate=True) for _ in range(3))
    return [("  master CPU per op, issued at line 401", f"{long:.1f} µs",
             f"the same at line 1 {short:.1f} µs", f"{long / short:.2f}x", "1x"),
            ("  master CPU per op, in an np.errstate block", f"{blocked:.1f} µs",
             f"the same outside one {short:.1f} µs", f"{blocked / short:.2f}x", "1x")]


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


if __name__ == "__main__":
    if {"--fresh", "--round-trips", "--read", "--sklearn"} & set(sys.argv[1:]):
        fresh_figures.print_fresh()
        raise SystemExit
    main(shm_only="--shm" in sys.argv[1:], quick="--quick" in sys.argv[1:])
    if "--shm" not in sys.argv[1:]:
        print_graph_replay(200 if "--quick" in sys.argv[1:] else 2000)
