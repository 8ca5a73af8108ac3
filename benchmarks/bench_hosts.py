"""mwrt across simulated hosts, beside raw sockets over the same link, measured in the same run.

The hosts are tests/support/hosts.py's: network namespaces hosta, hostb, hostc, each with one veth
into a bridge in a namespace of their own, so every byte crosses a veth pair and the bridge,
as between machines, and nothing leaves the namespaces made here (it needs root). Every
timed program runs on a host, as this file run with `--role` (a sender, a receiver, the
master, an SPMD rank); each prints its figures as JSON and this process prints the table.

Every raw socket gets the tcp channel's own settings (`mwrt.channels.tcp.tune`: no Nagle,
4 MiB kernel buffers), so the baseline is the best plain sockets do, not a default socket.

- Transfers (master on hosta, keyed workers on hostb = node 0 and hostc = node 1, set up as
  the README's recipe): `mwrt.dist_send(a, node=0)` then a tiny sync (`float(t[:1].sum())`),
  A -> B; `t.numpy()`, B -> A; `t.to(node=1)` then the same tiny sync, B -> C. Baseline: one
  plain TCP connection between the same two hosts, sendall / recv_into of the same bytes
  into a reused buffer, then a 1-byte ack, timed by the sender; run once before and once
  after the mwrt program, the repetitions pooled, so both see the same machine.
- The sync round trip: a 4-element `.numpy()` from the master on hosta to node 0 on hostb,
  median of 2,000 after 100 warm-ups, beside a bare pyzmq DEALER/ROUTER echo between the
  same two hosts (run before and after the master; the faster of the two kept).
- all_reduce SUM of float32, rank 0 on hosta and rank 1 on hostb,
  `init_process_group("tcp", init_method="tcp://hosta:PORT")`, then the same with the
  `auto` backend (init_process_group(None, ...)), which should pick tcp between hosts.
  Beside it, in the same processes and taking turns every iteration, the raw-socket swap
  floor: both ranks send the whole buffer at once over plain sockets (one per direction, a
  sending thread and recv_into), the bytes a two-rank all_reduce must move.
- all_reduce on 2 hosts x 2 ranks (auto): the two-level path beside the flat ring, two groups
  of the same four processes taking turns (target: two-level faster from 1 MiB up).
  Per iteration (after a barrier) the slower rank's time, then the median; bus bandwidth is
  2(n-1)/n * bytes / time for both (n = 2).

Medians of several repetitions after one warm-up. On a 2-core machine every host shares
the same two cores, so the veth link's ceiling is the kernel's copy and TCP cost, not a wire.

    python benchmarks/bench_hosts.py [--quick]    # as root; --quick: 16 MiB, 2 reps, baselines once
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from mwrt.channels.tcp import tune  # noqa: E402  (the baselines' sockets get the channel's settings)
import hostkit  # noqa: E402
from baselines import timed  # noqa: E402
from hostkit import (  # noqa: E402
    MIB, connect_retrying, recv_exactly, role_raw_recv, role_raw_send, send_in_pieces)

WORKER_PORT = 7070
RENDEZVOUS_PORT = 29500
RAW_PORT = 29600  # each namespace is fresh, so fixed ports are free
ECHO_PORT = 29700
ROUND_TRIPS = 2000
TRANSFER_TARGET, ALL_REDUCE_TARGET, TWO_LEVEL_TARGET = 0.9, 0.85, 1.0
START_TIMEOUT = 60.0


# -- programs run on a simulated host (this file with --role) -------------------------------


def role_master(nbytes: int, reps: int) -> dict:
    """On hosta: dist_send to node 0, .numpy() from it, .to(node=1), each warmed up once."""
    import mwrt

    mwrt.init_master_worker()  # MWRT_WORKERS and MWRT_KEY_FILE come from the environment
    try:
        array = np.ones(nbytes // 4, np.float32)
        nodes = [float(mwrt.ones(1, node=i).sum()) for i in (0, 1)]  # both sessions are up

        def send():
            t = mwrt.dist_send(array, node=0)
            float(t[:1].sum())  # a tiny sync: the worker has all the bytes

        def move():
            u = held.to(node=1)
            float(u[:1].sum())

        held = mwrt.dist_send(array, node=0)
        tiny = mwrt.ones(4, node=0)
        out = {"round_trip": _round_trip(tiny.numpy)}
        for name, fn in (("dist_send", send), ("numpy", held.numpy), ("to", move)):
            fn()  # warm-up: connects the channel pair, faults in the buffers
            out[name] = [timed(fn) for _ in range(reps)]
        if float(held.to(node=1).sum()) != array.size or held.numpy().sum() != array.size:
            raise SystemExit("bench_hosts: a transfer delivered wrong bytes")
        out["nodes"] = nodes
        return out
    finally:
        mwrt.shutdown()


class RawPair:
    """Two plain TCP sockets between ranks 0 and 1, one per direction (as the channel has:
    one socket for both directions would serialize them on its lock)."""

    def __init__(self, rank: int, addr0: str, port: int):
        if rank == 0:
            with socket.create_server((addr0, port)) as server:
                self.inbound, self.outbound = server.accept()[0], server.accept()[0]
        else:  # connect returns after the handshake, so rank 0 accepts them in this order
            self.outbound = connect_retrying((addr0, port))
            self.inbound = connect_retrying((addr0, port))
        for sock in (self.inbound, self.outbound):
            tune(sock)
        self.spare: dict[int, np.ndarray] = {}

    def swap(self, buf: np.ndarray) -> None:
        """Send all of `buf` on a thread while receiving the peer's into a spare buffer."""
        into = self.spare.setdefault(buf.nbytes, np.zeros_like(buf))
        sender = threading.Thread(target=send_in_pieces, args=(self.outbound, buf))
        sender.start()
        recv_exactly(self.inbound, memoryview(into).cast("B"))
        sender.join()

    def close(self) -> None:
        self.inbound.close()
        self.outbound.close()


def role_rank(rank: int, backend: str, addr0: str, port: int, raw_port: int, sizes: list,
              reps: dict) -> dict:
    """One SPMD rank: all_reduce and the raw swap in turns, per-iteration seconds of each."""
    import mwrt.distributed as dist

    dist.init_process_group(backend or None, init_method=f"tcp://{addr0}:{port}", rank=rank,
                            world_size=2, timeout=60)
    pair = RawPair(rank, addr0, raw_port)
    try:
        impls = {"mwrt": dist.all_reduce, "raw": pair.swap}
        out = {name: {} for name in impls}
        for nbytes in sizes:
            buf = np.zeros(nbytes // 4, np.float32)  # zeros: the sums stay exact
            for fn in impls.values():
                fn(buf)  # warm-up
            times = {name: [] for name in impls}
            for _ in range(reps[str(nbytes)]):
                for name, fn in impls.items():
                    dist.barrier()  # both ranks start together: the slower one's time counts
                    times[name].append(timed(lambda: fn(buf)))
            for name in impls:
                out[name][str(nbytes)] = times[name]
        channel = dist.process_groups._state.channel  # which path auto took: tcp, between hosts
        out["path"] = "shm" if channel.shares_host(1 - rank) else "tcp"
        return out
    finally:
        pair.close()
        dist.destroy_process_group()


def role_rank_of_four(rank: int, addr0: str, port: int, sizes: list, reps: dict) -> dict:
    """One of 2 hosts x 2 ranks: two-level all_reduce and the flat one, taking turns."""
    import mwrt.distributed as dist
    from mwrt.collective import hierarchy

    dist.init_process_group(None, init_method=f"tcp://{addr0}:{port}", rank=rank,
                            world_size=4, timeout=60)
    try:
        two_level = dist.new_group(list(range(4)))
        os.environ["MWRT_TWO_LEVEL"] = "0"  # read once per group, at its first collective
        flat = dist.new_group(list(range(4)))
        dist.all_reduce(np.zeros(1, np.float32), group=flat)
        os.environ["MWRT_TWO_LEVEL"] = "1"
        dist.all_reduce(np.zeros(1, np.float32), group=two_level)
        if hierarchy.levels(two_level) is None or hierarchy.levels(flat) is not None:
            raise SystemExit("bench_hosts: the 2x2 groups did not take the paths asked for")
        impls = {"two-level": lambda b: dist.all_reduce(b, group=two_level),
                 "flat": lambda b: dist.all_reduce(b, group=flat)}
        out = {name: {} for name in impls}
        for nbytes in sizes:
            buf = np.zeros(nbytes // 4, np.float32)
            for fn in impls.values():
                fn(buf)
            times = {name: [] for name in impls}
            for _ in range(reps[str(nbytes)]):
                for name, fn in impls.items():
                    dist.barrier()
                    times[name].append(timed(lambda: fn(buf)))
            for name in impls:
                out[name][str(nbytes)] = times[name]
        return out
    finally:
        dist.destroy_process_group()


def _round_trip(fn, reps: int = ROUND_TRIPS) -> float:
    """Median seconds of fn() after 100 warm-up calls."""
    for _ in range(100):
        fn()
    return statistics.median(timed(fn) for _ in range(reps))


def role_echo(addr: str, port: int) -> dict:
    """A bare pyzmq ROUTER that sends every message back, until one says stop."""
    import zmq

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(f"tcp://{addr}:{port}")
    while (frames := router.recv_multipart())[-1] != b"stop":
        router.send_multipart(frames)
    router.close(0)
    context.term()
    return {}


def role_echo_client(addr: str, port: int) -> dict:
    """The DEALER side of the echo: the round trip a bare pyzmq request costs on this link."""
    import zmq

    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://{addr}:{port}")  # messages wait for the connection
    message = [b"x" * 16]
    seconds = _round_trip(lambda: (dealer.send_multipart(message), dealer.recv_multipart()))
    dealer.send_multipart([b"stop"])
    dealer.close(0)
    context.term()
    return {"round_trip": seconds}


ROLES = {"raw-recv": role_raw_recv, "raw-send": role_raw_send, "master": role_master,
         "rank": role_rank, "rank-of-four": role_rank_of_four, "echo": role_echo,
         "echo-client": role_echo_client}


# -- the parent: hosts, processes, table ----------------------------------------------------


def launch(host, role: str, args: dict, env: dict | None = None, log: str | None = None):
    """This file with `--role role` on `host` (hostkit.launch)."""
    return hostkit.launch(__file__, host, role, args, env, log)


def result(proc, what: str) -> dict:
    """The JSON a role printed last (hostkit.result, naming this benchmark)."""
    return hostkit.result(proc, what, "bench_hosts")


def raw_times(src, dst, nbytes: int, reps: int, port: int) -> list[float]:
    """Seconds per message of the raw-socket baseline src -> dst."""
    receiver = launch(dst, "raw-recv", {"addr": dst.addr, "port": port, "nbytes": nbytes,
                                        "reps": reps})
    sender = launch(src, "raw-send", {"addr": dst.addr, "port": port, "nbytes": nbytes,
                                      "reps": reps})
    times = result(sender, f"raw socket {src.name} -> {dst.name}")["times"]
    result(receiver, f"raw receiver on {dst.name}")
    return times


def start_workers(hosts, keys: str, logs: str) -> None:
    """Keys as the README makes them, a keyed daemon on hostb and hostc; waits until both
    listen."""
    hosts[0].run([sys.executable, "-m", "mwrt.worker", "keygen", keys], check=True)
    started = []
    for host in hosts[1:]:
        log = os.path.join(logs, f"worker-{host.name}.log")
        cmd = [sys.executable, "-m", "mwrt.worker", "--listen", f"{host.addr}:{WORKER_PORT}",
               "--key-file", os.path.join(keys, "worker.key")]
        with open(log, "w") as out:
            started.append((host.popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL), log))
    deadline = time.monotonic() + START_TIMEOUT
    for proc, log in started:  # they start in parallel; wait for each 'listening on'
        while "listening on" not in open(log).read():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench_hosts: worker did not start: {open(log).read()[-2000:]}")
            time.sleep(0.05)


def echo_round_trip(client, server, port: int) -> float:
    """Median seconds of a bare pyzmq DEALER/ROUTER round trip from client to server."""
    echo = launch(server, "echo", {"addr": server.addr, "port": port})
    seconds = result(launch(client, "echo-client", {"addr": server.addr, "port": port}),
                     f"pyzmq echo {client.name} -> {server.name}")["round_trip"]
    result(echo, f"pyzmq echo on {server.name}")
    return seconds


def transfer_rows(hosts, home: str, nbytes: int, reps: int,
                  again: bool = True) -> tuple[list, tuple]:
    """dist_send A->B, .numpy() B->A, .to B->C: mwrt's seconds and the raw socket's; and
    the sync round trip A->B beside a pyzmq echo's (the baselines run before mwrt and, if
    `again`, after it too, the lower echo kept)."""
    a, b, c = hosts
    pairs = {"dist_send": (a, b), "numpy": (b, a), "to": (b, c)}
    raw = {name: raw_times(src, dst, nbytes, reps, RAW_PORT + i)
           for i, (name, (src, dst)) in enumerate(pairs.items())}
    echo = [echo_round_trip(a, b, ECHO_PORT)]
    start_workers(hosts, os.path.join(home, "keys"), home)
    env = {"MWRT_WORKERS": ",".join(f"{h.addr}:{WORKER_PORT}" for h in (b, c)),
           "MWRT_KEY_FILE": os.path.join(home, "keys", "master.key")}
    ours = result(launch(a, "master", {"nbytes": nbytes, "reps": reps}, env=env), "the master")
    for i, (name, (src, dst)) in enumerate(pairs.items() if again else ()):
        raw[name] += raw_times(src, dst, nbytes, reps, RAW_PORT + 10 + i)  # the same load pooled
    if again:
        echo.append(echo_round_trip(a, b, ECHO_PORT + 1))
    size = f"{nbytes // MIB} MiB"
    labels = {"dist_send": f"dist_send {size}, {a.name} -> {b.name}",
              "numpy": f".numpy() {size}, {b.name} -> {a.name}",
              "to": f".to(node=1) {size}, {b.name} -> {c.name}"}
    rows = []
    for name, (src, dst) in pairs.items():
        rows.append((labels[name], nbytes / statistics.median(ours[name]) / 1e9,
                     f"raw socket {src.name} -> {dst.name}",
                     nbytes / statistics.median(raw[name]) / 1e9, TRANSFER_TARGET))
    latency = (f"sync round trip, 4-element .numpy(), {a.name} -> {b.name}", ours["round_trip"],
               f"pyzmq DEALER/ROUTER echo {a.name} -> {b.name}", min(echo))
    return rows, latency


def all_reduce_rows(hosts, backend: str, sizes: list, reps: dict, port: int) -> list[tuple]:
    """Two ranks (hosta, hostb): all_reduce bus bandwidth beside the raw swap floor's."""
    env = {"MWRT_JOB_SECRET": secrets.token_hex(16)}  # the same secret on both ranks
    args = {"backend": backend, "addr0": hosts[0].addr, "port": port, "raw_port": port + 1,
            "sizes": sizes, "reps": {str(n): reps[n] for n in sizes}}
    procs = [launch(host, "rank", dict(args, rank=r), env=env) for r, host in
             enumerate(hosts[:2])]
    res = [result(p, f"all_reduce rank {r}") for r, p in enumerate(procs)]
    name = backend or f"auto (went {res[0]['path']})"
    rows = []
    for nbytes in sizes:
        seconds = {name: float(np.median(np.max([r[name][str(nbytes)] for r in res], axis=0)))
                   for name in ("mwrt", "raw")}
        busbw = {name: 2 * (2 - 1) / 2 * nbytes / t / 1e9 for name, t in seconds.items()}
        rows.append((f"all_reduce {name} {nbytes // MIB} MiB, busbw",
                     busbw["mwrt"], "raw-socket swap floor", busbw["raw"],
                     ALL_REDUCE_TARGET if nbytes >= 16 * MIB else None))
    return rows


def two_level_rows(hosts, sizes: list, reps: dict, port: int) -> list[tuple]:
    """2 hosts x 2 ranks: the two-level all_reduce's bus bandwidth beside the flat one's."""
    env = {"MWRT_JOB_SECRET": secrets.token_hex(16)}
    args = {"addr0": hosts[0].addr, "port": port, "sizes": sizes,
            "reps": {str(n): reps[n] for n in sizes}}
    procs = [launch(hosts[r // 2], "rank-of-four", dict(args, rank=r), env=env)
             for r in range(4)]
    res = [result(p, f"2x2 rank {r}") for r, p in enumerate(procs)]
    rows = []
    for nbytes in sizes:
        busbw = {name: 2 * 3 / 4 * nbytes / float(np.median(np.max(
            [r[name][str(nbytes)] for r in res], axis=0))) / 1e9 for name in ("two-level", "flat")}
        rows.append((f"all_reduce 2 hosts x 2 ranks, two-level, {nbytes // MIB} MiB, busbw",
                     busbw["two-level"], "flat ring, in turns", busbw["flat"],
                     TWO_LEVEL_TARGET if nbytes >= MIB else None))
    return rows


def print_table(rows: list[tuple], reps: int, again: bool = True) -> None:
    """One markdown table: what, mwrt, baseline, ratio, target."""
    print(f"# targets: transfers >= {TRANSFER_TARGET}x the raw socket; all_reduce busbw >= "
          f"{ALL_REDUCE_TARGET}x the raw-socket swap floor from 16 MiB up")
    raw = f"{2 * reps}, before and after mwrt" if again else f"{reps}, before mwrt"
    print(f"# medians of {reps} repetitions (raw transfer baselines: {raw}); "
          "GB/s = 1e9 bytes/s")
    print("| what | mwrt GB/s | baseline (same run) | GB/s | ratio | target |")
    print("|---|---|---|---|---|---|")
    for what, ours, base_name, base, target in rows:
        ratio = ours / base
        flag = "" if target is None else f">= {target}x" + (" BELOW" if ratio < target else "")
        print(f"| {what} | {ours:.2f} | {base_name} | {base:.2f} | {ratio:.2f}x | {flag} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 MiB only, 2 repetitions")
    ap.add_argument("--no-auto", action="store_true", help="skip the auto backend's all_reduce")
    ap.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    ap.add_argument("--args", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:  # a program on a simulated host
        print(json.dumps(ROLES[args.role](**json.loads(args.args))), flush=True)
        return
    from tests.support.hosts import make_hosts, unavailable

    reason = unavailable()
    if reason:
        raise SystemExit(f"bench_hosts: {reason}")
    if args.quick:
        size, sizes, reps = 16 * MIB, [16 * MIB], {16 * MIB: 2}
    else:
        size, sizes, reps = 64 * MIB, [MIB, 16 * MIB, 64 * MIB], {MIB: 30, 16 * MIB: 10,
                                                                  64 * MIB: 5}
    backends = ["tcp"] if args.no_auto or args.quick else ["tcp", ""]
    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mwrt-bench-hosts-") as home, \
            make_hosts(3) as hosts:
        stage = time.monotonic()
        transfers, latency = transfer_rows(hosts, home, size, reps[size], not args.quick)
        rows += transfers
        print(f"# transfers: {time.monotonic() - stage:.1f} s", file=sys.stderr)
        for i, backend in enumerate(backends):
            stage = time.monotonic()
            rows += all_reduce_rows(hosts, backend, sizes, reps, RENDEZVOUS_PORT + 10 * i)
            print(f"# all_reduce {backend or 'auto'}: {time.monotonic() - stage:.1f} s",
                  file=sys.stderr)
        stage = time.monotonic()
        rows += two_level_rows(hosts, sizes, reps, RENDEZVOUS_PORT + 50)
        print(f"# all_reduce 2x2: {time.monotonic() - stage:.1f} s", file=sys.stderr)
    print_table(rows, reps[size], not args.quick)
    what, ours, base_name, base = latency
    print(f"\n| what | mwrt | baseline (same run) | | ratio | target |\n|---|---|---|---|---|---|\n"
          f"| {what} | {ours * 1e6:.0f} µs | {base_name} | {base * 1e6:.0f} µs | "
          f"{ours / base:.2f}x | <= 1.2x |")
    print(f"# {time.monotonic() - started:.1f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
