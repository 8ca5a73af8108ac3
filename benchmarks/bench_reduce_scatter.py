"""Partial -> Shard(0) on a mesh: reduce_scatter beside the all_reduce and cut it replaced.

A Partial(sum) tensor of `--mib` MiB (float32; each node holds a whole part, as a gradient
after a local matmul does) on a mesh of `--nodes` local daemons is redistributed to
Shard(0) two ways, in turns in the same session, `--reps` times each: `P.redistribute(
shard=0)` (reduce_scatter: each node receives only its block, reduced) and the old path
(an all_reduce in place, every node then holding the whole sum, and a copy of its block).
Printed: the median wall time of each from issue to every node done, the ratio, the bytes
each node receives by the algorithms (a ring or a shared-memory reduce_scatter takes
(n-1)/n of the tensor; an all_reduce twice that), and the bytes each daemon's TCP sockets
sent meanwhile, measured (`ss`: what the tcp channel moved; the default channel reads its
peers' memory on one host, which no socket counts).

Both run on this machine's cores (local daemons; the default channel reads peers' memory
on one host, `--channel tcp` runs the ring over loopback): wall times are the CPU's, not a
network's.

    python benchmarks/bench_reduce_scatter.py [--nodes 4] [--mib 64] [--reps 5] [--channel tcp]
    python benchmarks/bench_reduce_scatter.py --hosts   # as root: workers on simulated hosts
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import mwrt  # noqa: E402  (after the path above)
from mwrt.master.mesh import moves  # noqa: E402


def sent_by_daemons() -> list[int]:
    """The bytes each local daemon's TCP sockets have sent so far (`ss -tinp`'s bytes_sent,
    per process), or [] where ss cannot say. Reads of a peer's memory (the default channel
    on one host) are not counted: only what the tcp channel moves."""
    pids = [w.process.pid for w in mwrt.master.cluster.current().local]
    try:
        lines = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30,
                               check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []
    sent = dict.fromkeys(pids, 0)
    for line, info in itertools.pairwise(lines):  # a socket's line, then its tcp_info line
        pid = next((p for p in pids if f"pid={p}," in line), None)
        if pid is not None and "bytes_sent:" in info:
            sent[pid] += int(info.split("bytes_sent:")[1].split()[0])
    return list(sent.values())


def timed(P, how) -> tuple[float, float | None, object]:
    """Seconds from issuing `how(P)` until every node has run it, the MiB each daemon sent
    over TCP meanwhile (mean), and the result."""
    mwrt.synchronize()
    before = sent_by_daemons()
    start = time.perf_counter()
    out = how(P)
    mwrt.synchronize()
    seconds, after = time.perf_counter() - start, sent_by_daemons()
    if not before or len(after) != len(before) or not any(after):
        return seconds, None, out
    return seconds, sum(a - b for a, b in zip(after, before)) / len(before) / 2**20, out


def scatter(P):
    return P.redistribute(shard=0)


def all_reduce_and_cut(P):
    moves.resolve(P)  # the old path: every node ends with the whole sum, then cuts its block
    return P.redistribute(shard=0)


def measure(n: int, mib: int, reps: int, channel: str | None, remote: bool) -> tuple:
    """Each path's wall times and MiB sent per node, in turns on one session of n nodes
    (local daemons, or the workers MWRT_WORKERS names when `remote`)."""
    length = mib * (1 << 20) // 4
    if remote:
        mwrt.init_master_worker(timeout=120, channel=channel)
    else:
        mwrt.init_master_worker(local_workers=n, timeout=120, channel=channel)
    try:
        mesh = mwrt.mesh()
        X = mwrt.ones((len(mesh), length), dtype=np.float32, mesh=mesh, shard=0)
        times: dict = {"reduce_scatter": [], "all_reduce + cut": []}
        sent: dict = {name: [] for name in times}
        for how in (scatter, all_reduce_and_cut):  # warm: groups, connections, buffers
            timed(X.sum(axis=0), how)
        for _ in range(reps):
            for name, how in (("reduce_scatter", scatter),
                              ("all_reduce + cut", all_reduce_and_cut)):
                P = X.sum(axis=0)  # a fresh Partial(sum) each time: (length,), one row a node
                seconds, mib_sent, out = timed(P, how)
                times[name].append(seconds)
                if mib_sent is not None and channel == "tcp":  # others read peers' memory
                    sent[name].append(mib_sent)
                del P, out
        check = X.sum(axis=0).redistribute(shard=0)
        np.testing.assert_array_equal(check.shards()[-1].numpy()[:4],
                                      np.full(4, len(mesh), np.float32))
    finally:
        mwrt.shutdown()
    return times, sent


def on_hosts(args) -> tuple:
    """measure() run by a master on one simulated host (tests/support/hosts.py, root) over keyed
    workers on `--nodes` others: the bytes cross veth pairs and a bridge, as between
    machines (the channel between hosts is tcp)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bench_hosts import WORKER_PORT, start_workers
    from tests.support.hosts import make_hosts, unavailable

    reason = unavailable()
    if reason:
        raise SystemExit(f"bench_reduce_scatter --hosts: {reason}")
    with tempfile.TemporaryDirectory(prefix="mwrt-bench-rs-") as home, \
            make_hosts(args.nodes + 1) as hosts:
        keys = os.path.join(home, "keys")
        start_workers(hosts, keys, home)
        env = {"MWRT_KEY_FILE": os.path.join(keys, "master.key"), "PYTHONPATH": ROOT,
               "MWRT_WORKERS": ",".join(f"{h.addr}:{WORKER_PORT}" for h in hosts[1:])}
        cmd = [sys.executable, os.path.abspath(__file__), "--remote", "--nodes",
               str(args.nodes), "--mib", str(args.mib), "--reps", str(args.reps)]
        res = hosts[0].run(cmd, env=env, timeout=600)
        if res.returncode != 0:
            raise SystemExit(f"bench_reduce_scatter --hosts: the master failed:\n"
                             f"{res.stderr[-3000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--channel", default=None, help="the data channel (default: the "
                        "session's, MWRT_CHANNEL); tcp runs the ring algorithms")
    parser.add_argument("--hosts", action="store_true", help="workers on simulated hosts")
    parser.add_argument("--remote", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.remote:  # the master on a simulated host: its figures to the parent, as JSON
        print(json.dumps(measure(args.nodes, args.mib, args.reps, args.channel, True)))
        return
    if args.hosts:
        times, sent = on_hosts(args)
        where = f"{args.nodes} simulated hosts (the master on another)"
    else:
        times, sent = measure(args.nodes, args.mib, args.reps, args.channel, False)
        where = f"{args.nodes} local daemons, channel {args.channel or 'default'}"
    n, size = args.nodes, args.mib
    received = {"reduce_scatter": (n - 1) / n * size, "all_reduce + cut": 2 * (n - 1) / n * size}
    print(f"Partial(sum) -> Shard(0) of {size} MiB float32 on {where}, median of {args.reps} "
          "in turns")
    print(f"{'path':<18} {'wall ms':>9} {'MiB in/node':>12} {'MiB sent/node':>14}")
    for name, values in times.items():
        wrote = f"{statistics.median(sent[name]):14.1f}" if sent[name] else f"{'-':>14}"
        print(f"{name:<18} {statistics.median(values) * 1e3:9.1f} {received[name]:12.1f} "
              f"{wrote}")
    ratio = statistics.median(times["reduce_scatter"]) / statistics.median(
        times["all_reduce + cut"])
    print(f"reduce_scatter / all_reduce + cut: {ratio:.2f}x wall time, "
          f"{received['reduce_scatter'] / received['all_reduce + cut']:.2f}x bytes received")


if __name__ == "__main__":
    main()
