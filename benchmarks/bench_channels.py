"""Channel bandwidth and latency beside their physical limits, measured in the same run.

Two processes: this one (rank 0) and a spawned peer (rank 1). Bandwidth is one
message of N bytes from rank 0 to rank 1 followed by a 1-byte ack, timed on rank 0
(as in BASELINE.md); the tcp channel is set beside a raw loopback socket doing
sendall/recv_into, the shm channel beside np.copyto into a prefaulted array.
Latency is an 8-byte round trip. Every figure is the median of several repetitions.

    python benchmarks/bench_channels.py [--quick]
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mwrt import channels  # noqa: E402
from mwrt.store.stores import FileStore  # noqa: E402

SIZES = [1 << 20, 64 << 20, 256 << 20]
REPS = {1 << 20: 30, 64 << 20: 7, 256 << 20: 5}
PINGS = 500


def shared_store(path: str) -> FileStore:
    """The store both benchmark processes meet in: a file in their shared temporary folder."""
    return FileStore(os.path.join(path, "store"), timeout=30.0)


class RawSocket:
    """The baseline: one plain loopback TCP connection, blocking sendall/recv_into."""

    def __init__(self, rank, store):
        if rank == 1:
            listener = socket.create_server(("127.0.0.1", 0))
            store.set("raw/port", str(listener.getsockname()[1]))
            self.sock, _ = listener.accept()
            listener.close()
        else:
            port = int(store.get("raw/port"))
            self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, buf, peer, tag=0):
        self.sock.sendall(memoryview(buf).cast("B"))

    def recv(self, buf, peer, tag=0):
        view, got = memoryview(buf).cast("B"), 0
        while got < view.nbytes:
            got += self.sock.recv_into(view[got:])

    def close(self):
        self.sock.close()


def open_transport(kind, rank, store):
    if kind == "raw":
        return RawSocket(rank, store)
    return channels.create(kind, rank, 2, store=store, prefix=f"bench-{kind}", timeout=60)


def peer_main(path, kinds, sizes, reps):
    """Rank 1: receive and ack every message, echo every ping, in rank 0's order."""
    store, ack = shared_store(path), np.zeros(1, np.uint8)
    bufs = {n: np.empty(n, np.uint8) for n in sizes}
    for buf in bufs.values():
        buf.fill(0)  # prefault: BASELINE measures reused receive buffers
    for kind in kinds:
        ch = open_transport(kind, 1, store)
        for n in sizes:
            for _ in range(reps[n] + 1):
                ch.recv(bufs[n], 0)
                ch.send(ack, 0)
        ping = np.zeros(8, np.uint8)
        for _ in range(PINGS + 10):
            ch.recv(ping, 0, tag=1)
            ch.send(ping, 0, tag=1)
        ch.close()


def bandwidth(ch, n, reps) -> float:
    src, ack = np.ones(n, np.uint8), np.zeros(1, np.uint8)
    times = []
    for i in range(reps + 1):
        start = time.perf_counter()
        ch.send(src, 1)
        ch.recv(ack, 1)
        if i:  # the first one warms connections, mappings and page tables
            times.append(time.perf_counter() - start)
    return n / np.median(times) / 1e9


def latency(ch) -> tuple[float, float]:
    ping, times = np.zeros(8, np.uint8), []
    for i in range(PINGS + 10):
        start = time.perf_counter()
        ch.send(ping, 1, tag=1)
        ch.recv(ping, 1, tag=1)
        if i >= 10:
            times.append(time.perf_counter() - start)
    return np.percentile(times, 50) * 1e6, np.percentile(times, 99) * 1e6


def memcpy(n, reps) -> float:
    src, dst = np.ones(n, np.uint8), np.zeros(n, np.uint8)
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return n / np.median(times[1:]) / 1e9


def master_worker_rows() -> list[tuple[str, float, float]]:
    """The master-worker data paths (dist_send, .numpy(), .to(node=)) are in bench_ops.py."""
    return []


def main() -> None:
    quick = "--quick" in sys.argv
    sizes = SIZES[:2] if quick else SIZES
    kinds = ["raw", "tcp", "shm"]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mwrt-bench-") as path:
        ctx = multiprocessing.get_context("spawn")
        peer = ctx.Process(target=peer_main, args=(path, kinds, sizes, REPS), daemon=True)
        peer.start()
        try:
            store = shared_store(path)
            for kind in kinds:
                ch = open_transport(kind, 0, store)
                results[kind] = {n: bandwidth(ch, n, REPS[n]) for n in sizes}
                results[kind]["lat"] = latency(ch)
                ch.close()
            peer.join(60)
        finally:
            peer.kill()
            peer.join()
    copy = {n: memcpy(n, REPS[n]) for n in sizes}
    print_tables(sizes, results, copy)


def print_tables(sizes, results, copy) -> None:
    print("| size | tcp channel GB/s | raw socket GB/s | ratio | shm channel GB/s "
          "| np.copyto GB/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        tcp, raw, shm = results["tcp"][n], results["raw"][n], results["shm"][n]
        print(f"| {n >> 20} MiB | {tcp:.2f} | {raw:.2f} | {tcp / raw:.2f} | {shm:.2f} "
              f"| {copy[n]:.2f} | {shm / copy[n]:.2f} |")
    print()
    print("| 8 B round trip | p50 µs | p99 µs |")
    print("|---|---|---|")
    for kind, label in [("raw", "raw TCP socket"), ("tcp", "tcp channel"),
                        ("shm", "shm channel")]:
        p50, p99 = results[kind]["lat"]
        print(f"| {label} | {p50:.0f} | {p99:.0f} |")
    for label, value, base in master_worker_rows():
        print(f"| {label} | {value:.2f} | {base:.2f} |")


if __name__ == "__main__":
    main()
