"""bench_scale.py's table 2: SPMD over k simulated hosts (tests/support/hosts.py, root only),
one rank each, every rank's program run as `bench_scale.py --role rank` (role_rank): a timed
init from a common start, a 4 KiB and a 16 MiB all_reduce beside plain-socket floors taking
turns with them, each rank's TCP sockets and threads, and the store requests of init."""

from __future__ import annotations

import os
import secrets
import socket
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

import hostkit
from baselines import timed
from hostkit import (KIB, MIB, connect_retrying, recv_exactly, send_in_pieces, status_field,
                     tcp_sockets)
from mwrt.channels.tcp import tune  # raw sockets get the channel's settings

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_scale.py")
STORE_PORT = 29500  # each namespace is fresh; each k gets its own offset
RUN_TIMEOUT = 240.0


class RawRing:
    """Plain sockets from each rank to the next one: the bytes-only floor of a ring."""

    def __init__(self, rank: int, addrs: list, port: int):
        server = socket.create_server((addrs[rank], port))
        self.next = connect_retrying((addrs[(rank + 1) % len(addrs)], port))
        self.prev = server.accept()[0]
        server.close()
        for sock in (self.next, self.prev):
            tune(sock)
            sock.settimeout(RUN_TIMEOUT)
        self.spare: dict[int, tuple] = {}

    def inodes(self) -> set:
        return {str(os.fstat(s.fileno()).st_ino) for s in (self.next, self.prev)}

    def pass_on(self, nbytes: int) -> None:
        """Send nbytes to the next rank while receiving as many from the previous."""
        if nbytes not in self.spare:  # both prefaulted and reused, as a floor's should be
            self.spare[nbytes] = np.ones(nbytes, np.uint8), np.ones(nbytes, np.uint8)
        out, into = self.spare[nbytes]
        if nbytes <= 64 * KIB:  # fits the socket buffer: no thread needed to avoid a deadlock
            self.next.sendall(out)
            recv_exactly(self.prev, memoryview(into))
            return
        sender = threading.Thread(target=send_in_pieces, args=(self.next, out))
        sender.start()
        recv_exactly(self.prev, memoryview(into))
        sender.join()

    def close(self) -> None:
        self.next.close()
        self.prev.close()


def count_store_requests(serve: bool) -> dict:
    """Count TCPStore requests in this process from now on: the client's by op, new
    connections, and (on rank 0, which serves the store) every request served."""
    from mwrt.store import tcp_store_server as store_server
    from mwrt.store import tcp_store as store_tcp

    counts: dict = {"served": 0, "connects": 0}
    call, connect, handle = (store_tcp.TCPStore._call, store_tcp.TCPStore._connect,
                             store_server.handle)

    def counting_call(self, op, *args, **kwargs):
        counts[op] = counts.get(op, 0) + 1
        return call(self, op, *args, **kwargs)

    def counting_connect(self):
        counts["connects"] += 1
        return connect(self)

    def counting_handle(*args):
        counts["served"] += 1  # one thread per client: a lost increment is within the noise
        return handle(*args)

    store_tcp.TCPStore._call, store_tcp.TCPStore._connect = counting_call, counting_connect
    if serve:
        store_server.handle = counting_handle  # StoreServer._serve looks it up on each call
    return counts


def connect_echo(addr: str, port: int) -> float:
    """Seconds for a fresh TCP connection to rank 0's echo and one byte there and back."""
    start = time.perf_counter()
    with socket.create_connection((addr, port), timeout=30) as sock:
        sock.sendall(b"x")
        recv_exactly(sock, memoryview(bytearray(1)))
    return time.perf_counter() - start


def serve_echo(addr: str, port: int) -> set:
    """On rank 0: accept connections forever, echo one byte on each (the connect baseline);
    returns the listener's inode."""
    server = socket.create_server((addr, port))

    def loop():
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(1))

    threading.Thread(target=loop, daemon=True).start()
    return {str(os.fstat(server.fileno()).st_ino)}


def wait_for_file(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_scale: no go file {path} within {timeout} s")
        time.sleep(0.002)


def in_turns(dist, impls: dict, reps: int) -> dict:
    """Seconds per repetition of each fn, taking turns, each after a barrier, after two
    warm-ups of each (they fault in the buffers and open the TCP windows)."""
    for _ in range(2):
        for fn in impls.values():
            fn()
    times = {name: [] for name in impls}
    for _ in range(reps):
        for name, fn in impls.items():
            dist.barrier()  # every rank starts together: the slowest one's time counts
            times[name].append(timed(fn))
    return times


def role_rank(rank: int, addrs: list, port: int, go: str, reps: dict) -> dict:
    """One SPMD rank: timed init, then all_reduce and the raw floors in turn, socket counts."""
    import mwrt.distributed as dist

    counts = count_store_requests(serve=rank == 0)
    print("ready", flush=True)  # imported: the parent starts every rank's clock at once
    wait_for_file(go, 120)
    init = timed(lambda: dist.init_process_group("tcp", init_method=f"tcp://{addrs[0]}:{port}",
                                                 rank=rank, world_size=len(addrs), timeout=60))
    out = {"init": init, "requests": dict(counts), "sockets": {"init": tcp_sockets("self", port)},
           "threads": status_field("self", "Threads")}
    ours = serve_echo(addrs[0], port + 2) if rank == 0 else set()
    ring = RawRing(rank, addrs, port + 1)
    try:
        dist.barrier()
        out["connect"] = [connect_echo(addrs[0], port + 2) for _ in range(5)]
        for nbytes in (4 * KIB, 16 * MIB):
            buf = np.zeros(nbytes // 4, np.float32)  # zeros: the sums stay exact
            moved = nbytes if nbytes < MIB else 2 * (len(addrs) - 1) * nbytes // len(addrs)
            impls = {"mwrt": lambda: dist.all_reduce(buf), "raw": lambda: ring.pass_on(moved)}
            for name, times in in_turns(dist, impls, reps[nbytes]).items():
                out[f"{name}{nbytes}"] = times
            out["sockets"][nbytes] = tcp_sockets("self", port, ours | ring.inodes())
        out["requests_total"] = dict(counts)
        return out
    finally:
        ring.close()
        dist.destroy_process_group()


ROLES = {"rank": role_rank}


def launch(host, role: str, args: dict, env: dict):
    """bench_scale.py with `--role role` on `host` (hostkit.launch)."""
    return hostkit.launch(SCRIPT, host, role, args, env)


def await_ready(proc, what: str) -> None:
    """The role's 'ready' line (hostkit.await_ready, naming this benchmark)."""
    hostkit.await_ready(proc, what, "bench_scale")


def result(proc, what: str) -> dict:
    """The JSON a role printed last (hostkit.result, naming this benchmark)."""
    return hostkit.result(proc, what, "bench_scale")


def spmd_row(hosts, k: int, port: int, reps: dict, home: str) -> dict:
    """Run k ranks on hosts[:k], start their clocks together, gather their figures."""
    go = os.path.join(home, f"go-{k}")
    env = {"MWRT_JOB_SECRET": secrets.token_hex(16)}  # the same secret on every rank
    args = {"addrs": [h.addr for h in hosts[:k]], "port": port, "go": go,
            "reps": {str(n): r for n, r in reps.items()}}
    procs = [launch(h, "rank", dict(args, rank=r), env) for r, h in enumerate(hosts[:k])]
    try:
        for r, proc in enumerate(procs):
            await_ready(proc, f"rank {r} of {k}")
        open(go, "w").close()
        res = [result(proc, f"rank {r} of {k}") for r, proc in enumerate(procs)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return summarize(k, res)


def slowest(res: list, key: str) -> float:
    """Median over repetitions of the slowest rank's seconds."""
    return float(np.median(np.max([r[key] for r in res], axis=0)))


def summarize(k: int, res: list) -> dict:
    """Table 2's figures from every rank's JSON."""
    big = 16 * MIB
    factor = 2 * (k - 1) / k  # bus bandwidth: bytes each rank must send, over the time
    est = {stage: [r["sockets"][stage]["established"] - r["sockets"][stage]["store"]
                   for r in res] for stage in ("init", str(4 * KIB), str(big))}
    client = [sum(v for op, v in r["requests"].items() if op not in ("served", "connects"))
              for r in res]
    return {
        "init": (statistics.median(r["init"] for r in res), max(r["init"] for r in res)),
        "connect": statistics.median(t for r in res for t in r["connect"]),
        "small": slowest(res, f"mwrt{4 * KIB}"), "small_raw": slowest(res, f"raw{4 * KIB}"),
        "busbw": factor * big / slowest(res, f"mwrt{big}") / 1e9,
        "busbw_raw": factor * big / slowest(res, f"raw{big}") / 1e9,
        "requests": (statistics.median(client), max(client)),
        "served": res[0]["requests"]["served"],
        "connects": statistics.median(r["requests"]["connects"] for r in res),
        "store_conns": (res[0]["sockets"]["init"]["store"],
                        statistics.median(r["sockets"]["init"]["store"] for r in res[1:])),
        "est": {stage: (min(v), max(v)) for stage, v in est.items()},
        "listen": max(r["sockets"][str(big)]["listen"] for r in res),
        "threads": (min(r["threads"] for r in res), max(r["threads"] for r in res)),
        "ops": res[-1]["requests"],
    }


def spmd_table(sizes: list, reps: dict) -> None:
    """Table 2 on tests/support/hosts.py's simulated hosts, or the reason it cannot be made."""
    from tests.support.hosts import make_hosts, unavailable

    print(f"\n## SPMD, k simulated hosts, one rank each, tcp channel (4 KiB: median of "
          f"{reps[4 * KIB]}, 16 MiB: median of {reps[16 * MIB]}, the slowest rank's time)\n")
    reason = unavailable()
    if reason:
        print(f"skipped: {reason}")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="mwrt-bench-scale-") as home, \
            make_hosts(max(sizes)) as hosts:
        for i, k in enumerate(sizes):
            rows.append((k, spmd_row(hosts, k, STORE_PORT + 10 * i, reps, home)))
            print(f"# SPMD k={k}: rank {k - 1}'s store calls during init: {rows[-1][1]['ops']}",
                  file=sys.stderr)
    print("| k | init s median, max | baseline: TCP connect + 1-byte echo to host0 ms | "
          "store requests per rank median, max (rank 0 served) | "
          "channel TCP conns per rank after init; 4 KiB; 16 MiB (min-max) | "
          "store conns rank 0, others | threads per rank after init | "
          "4 KiB all_reduce µs | baseline: one 4 KiB hop µs | 16 MiB busbw GB/s | "
          "baseline: raw ring GB/s |")
    print("|" + "---|" * 11)
    for k, r in rows:
        conns = "; ".join(f"{lo}-{hi}" if lo != hi else f"{lo}" for lo, hi in r["est"].values())
        print(f"| {k} | {r['init'][0]:.2f}, {r['init'][1]:.2f} | {r['connect'] * 1e3:.2f} | "
              f"{r['requests'][0]:.0f}, {r['requests'][1]:.0f} ({r['served']}) | {conns} | "
              f"{r['store_conns'][0]}, {r['store_conns'][1]:.0f} | "
              f"{'-'.join(str(t) for t in sorted(set(r['threads'])))} | "
              f"{r['small'] * 1e6:.0f} | {r['small_raw'] * 1e6:.0f} | {r['busbw']:.2f} | "
              f"{r['busbw_raw']:.2f} |")
