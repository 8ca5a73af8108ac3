"""Mesh tensors' cost on the master, each row beside its baseline measured in the same run.

1. N local daemons (1, 2, 4, 8; --full: 1 to 128; --nodes picks): the master's CPU per op
   for `X += 1.0` and `Y = X * 2.0` on a tensor sharded over the N nodes, beside the same
   op on a 1-node mesh of the same session (in turns: the same load), the cost per extra
   node and its ratio to the goal (1 us for an in-place op, 2 us for a new result), the op
   written as a loop over the N shards (`for x in X.shards(): x += 1.0`); per node, beside a
   loop of pyzmq sends (one 48-byte message on each of N DEALER sockets per op, the
   master's CPU, its I/O thread's included, as mwrt's) and the floor in Python (appending
   one bytes object to N lists); the fan-out round (the op, then every node synchronized)
   beside one 16-byte pyzmq DEALER/ROUTER echo to each of N echo processes. One session of
   the largest N's daemons serves every row (each row's mesh is its first N nodes), started
   once, a few at a time, each daemon with one BLAS thread and a small receive pool; each
   measurement runs about as many commands on the workers at every N (fewer ops at large
   N), so that N = 128 finishes on 2 cores.
2. A captured step of 100 mesh ops (50 times `t = X * 1.0001; w += t`) on 64 nodes (--full;
   8 otherwise): the master's CPU per replay beside the same 100 ops issued eagerly.
3. examples/mesh_training.py's step on 4 nodes (1024 x 8 float64 rows split over them):
   steps/s and the master's CPU per step, eager and captured (mwrt.graph, replayed), beside
   the hand-placed program (a tensor per node, a loop over nodes for every line, and
   mwrt.all_reduce of the gradient list), and beside torch's DistributedDataParallel over
   gloo on as many processes (each its block of rows), where torch is installed.
4. k-means (8 clusters of 8-D float64 points, one chunk per worker of 1 MiB and of 64 MiB)
   on a 2-node mesh, beside the same iteration with dask.array on a
   distributed.LocalCluster of 2 single-threaded worker processes, where Dask is installed:
   iterations/s (Dask computes each iteration's counts and sums to the client, its usual
   loop; the mesh keeps the centres on the workers and reads them at the end). Both start
   from the same centres and must end at the same ones.

Everything runs on this machine's cores: with more daemons than cores the workers and the
master share them, so wall times are the CPU's, not a cluster's.

    python benchmarks/bench_mesh.py [--quick | --full] [--nodes 1,2,64] [--only ops,...]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from baselines import EchoFarm, SendSink, timed  # noqa: E402

import mwrt  # noqa: E402


def cpu_per_op(fn, ops: int, nodes=None) -> float:
    """The master's CPU seconds per call of fn (all its threads), after a synchronize of
    `nodes` (every node if None)."""
    mwrt.synchronize(nodes)
    cpu = time.process_time()
    for _ in range(ops):
        fn()
    cpu = time.process_time() - cpu
    mwrt.synchronize(nodes)
    return cpu / ops


def in_turns(impls: dict, reps: int, measure) -> dict:
    """The median of `reps` measurements of each impl, taken in turns (the same load)."""
    got = {name: [] for name in impls}
    for _ in range(reps):
        for name, fn in impls.items():
            got[name].append(measure(fn))
    return {name: statistics.median(v) for name, v in got.items()}


def op_row(n: int, echoes: EchoFarm, sink: SendSink, reps: int, ops: int) -> dict:
    """Table 1's figures on the session's first n daemons."""
    nodes = list(range(n))
    mesh = mwrt.mesh(nodes=nodes)
    X = mwrt.zeros(64 * n, mesh=mesh, shard=0)
    one = mwrt.zeros(64, mesh=mwrt.mesh(nodes=[0]), shard=0)  # the 1-node mesh
    shards = X.shards()
    held: list = []

    def new(T):
        def make():
            held.append(T * 2.0)
            if len(held) > 64:
                held.clear()
        return make

    def hand_inplace():
        for x in shards:
            x += 1.0

    def hand_new():
        held.append([x * 2.0 for x in shards])
        if len(held) > 64:
            held.clear()

    row = in_turns({"mesh +=": lambda: X.__iadd__(1.0), "one +=": lambda: one.__iadd__(1.0),
                    "loop +=": hand_inplace, "mesh *": new(X), "one *": new(one),
                    "loop *": hand_new, "sends": lambda: sink.send_to(n)}, reps,
                   lambda fn: cpu_per_op(fn, ops, nodes))
    held.clear()

    def fan_out():
        X.__iadd__(1.0)
        mwrt.synchronize(nodes)

    row.update(in_turns({"round": fan_out, "echo": lambda: echoes.round(n)}, reps * 5,
                        timed))
    row["floor"] = append_floor(n)
    return row  # X and the rest freed as it returns


def append_floor(n: int, ops: int = 2000) -> float:
    """Seconds per op of the least a mesh op can do in Python: one bytes object appended to
    each of n lists (each node's batch), the lists emptied as batches are."""
    body, batches = b"x" * 48, [[] for _ in range(n)]
    best = float("inf")
    for _ in range(5):
        cpu = time.thread_time()
        for i in range(ops):
            for batch in batches:
                batch.append(body)
            if i % 64 == 63:
                for batch in batches:
                    batch.clear()
        best = min(best, (time.thread_time() - cpu) / ops)
    return best


GOALS = {"+=": 1e-6, "*": 2e-6}  # master CPU per extra node: an in-place op, a new result


# What the op table's many local daemons are given: a thread for NumPy's BLAS each (they
# share the host's cores with the master), a small receive pool (they receive no bulk),
# and a minute's silence before one is taken for lost (128 of them on 2 loaded cores).
_LARGE_SESSION = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                  "MWRT_RECV_POOL_BYTES": str(4 << 20), "MWRT_HEARTBEAT_TIMEOUT": "60"}


def ops_for(n: int, ops: int) -> int:
    """Ops per measurement on n nodes: about as many commands for the workers to run at
    every N (ops at 8 nodes and fewer), at least 100 ops."""
    return max(100, min(ops, ops * 8 // max(n, 1)))


def op_table(sizes: list, reps: int, ops: int) -> None:
    """Table 1: one session of max(sizes) daemons, started once (a few at a time, each
    row's mesh its first N nodes, the idle ones only heartbeating), beside the baselines."""
    top = max(sizes)
    for name, value in _LARGE_SESSION.items():
        os.environ.setdefault(name, value)
    started = time.monotonic()
    echoes, sink = EchoFarm(top), SendSink(top)
    mwrt.init_master_worker(local_workers=top, timeout=120)
    try:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {top} daemons "
              f"and {top} echo processes started in {time.monotonic() - started:.1f} s; "
              "master CPU per op in us, per extra node: (N-node mesh - 1-node mesh) / (N - 1)")
        print("| N | op | mesh us | 1-node mesh us | per extra node us | vs goal | loop over "
              "shards us | per node us | pyzmq send per node us | floor per node us |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for n in sizes:
            r = op_row(n, echoes, sink, reps, ops_for(n, ops))
            for op, goal in GOALS.items():
                mesh, one = r[f"mesh {op}"], r[f"one {op}"]
                extra = (mesh - one) / (n - 1) if n > 1 else None
                per = "- | -" if extra is None else f"{extra * 1e6:.2f} | {extra / goal:.2f}x"
                print(f"| {n} | `X {op} {'1.0' if op == '+=' else '2.0'}` | {mesh * 1e6:.1f} | "
                      f"{one * 1e6:.1f} | {per} | "
                      f"{r[f'loop {op}'] * 1e6:.1f} | {mesh / n * 1e6:.2f} | "
                      f"{r['sends'] / n * 1e6:.2f} | {r['floor'] / n * 1e6:.3f} |", flush=True)
            print(f"| {n} | fan-out round {r['round'] * 1e3:.2f} ms, N pyzmq echoes "
                  f"{r['echo'] * 1e3:.2f} ms | load {os.getloadavg()[0]:.1f} |", flush=True)
    finally:
        mwrt.shutdown()
        echoes.close()
        sink.close()


def training(n: int, steps: int, reps: int) -> None:
    """Table 2: the training step three ways, on one session of n daemons."""
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal(8)
    x = rng.standard_normal((1024, 8))
    y = x @ true_w + 0.01 * rng.standard_normal(1024)
    mwrt.init_master_worker(local_workers=n, timeout=120)
    try:
        mesh = mwrt.mesh()
        X, Y = mwrt.dist_send(x, mesh=mesh, shard=0), mwrt.dist_send(y, mesh=mesh, shard=0)
        w = mwrt.zeros(8, dtype=np.float64, mesh=mesh)
        xs, ys = X.shards(), Y.shards()
        ws = [mwrt.zeros(8, dtype=np.float64, node=i) for i in range(n)]

        def eager():
            err = X @ w - Y
            w.__isub__(0.1 * (2 * X.T @ err / len(y)))

        wg = mwrt.zeros(8, dtype=np.float64, mesh=mesh)
        with mwrt.graph() as g:
            err = X @ wg - Y
            wg -= 0.1 * (2 * X.T @ err / len(y))

        def hand():
            grads = []
            for i in range(n):
                e = xs[i] @ ws[i] - ys[i]
                grads.append(2 * xs[i].T @ e / len(y))
            mwrt.all_reduce(grads)
            for i in range(n):
                ws[i] -= 0.1 * grads[i]

        impls = {"mesh eager": eager, "mesh captured": g.replay, "hand-placed": hand}

        def measure(fn):
            mwrt.synchronize()
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                fn()
            mwrt.synchronize()
            return time.perf_counter() - start, time.process_time() - cpu

        got = {name: [] for name in impls}
        for _ in range(reps):
            for name, fn in impls.items():
                got[name].append(measure(fn))
        same = np.allclose(w.numpy(), ws[0].numpy()) and np.allclose(wg.numpy(), w.numpy())
    finally:
        mwrt.shutdown()
    ddp = ddp_steps(n, x, y, steps, reps)
    print(f"\n{n} nodes, {steps} steps a run, median of {reps} runs; the three reach the "
          f"same weights: {same}")
    print("| step | steps/s | master CPU per step ms | vs hand-placed (CPU) |")
    print("|---|---|---|---|")
    base = statistics.median(c for _, c in got["hand-placed"]) / steps
    for name, runs in got.items():
        wall = statistics.median(s for s, _ in runs)
        cpu = statistics.median(c for _, c in runs) / steps
        print(f"| {name} | {steps / wall:,.0f} | {cpu * 1e3:.3f} | {cpu / base:.2f}x |")
    if ddp is None:
        print("(torch DDP: skipped, torch is not installed)")
        return
    seconds, weights = ddp
    ref = np.zeros(x.shape[1])
    for _ in range((reps + 1) * steps):  # what DDP's processes ran, in NumPy
        ref -= 0.1 * (2 * x.T @ (x @ ref - y) / len(y))
    print(f"| torch DDP (gloo), {n} processes | {1 / seconds:,.0f} | (its own processes) | "
          f"- |\n(DDP ends at NumPy's weights: {np.allclose(weights, ref)})")


def captured_step(n: int, reps: int) -> None:
    """Table 2: a 100-op step on an n-node mesh, captured and replayed, beside eager."""
    mwrt.init_master_worker(local_workers=n, timeout=300)
    try:
        mesh = mwrt.mesh()
        X = mwrt.zeros(16 * n, mesh=mesh, shard=0)
        w = mwrt.zeros(16 * n, mesh=mesh, shard=0)

        def step():
            for _ in range(50):
                t = X * 1.0001
                w.__iadd__(t)

        with mwrt.graph() as g:
            step()
        got = in_turns({"captured": g.replay, "eager": step}, reps,
                       lambda fn: cpu_per_op(fn, 10))
    finally:
        mwrt.shutdown()
    print(f"\n100 mesh ops on {n} nodes, master CPU per step (median of {reps} runs of 10)")
    print("| step | master CPU ms | per node us | vs eager |")
    print("|---|---|---|---|")
    for name, cpu in got.items():
        print(f"| {name} | {cpu * 1e3:.3f} | {cpu / n * 1e6:.2f} | "
              f"{cpu / got['eager']:.2f}x |", flush=True)


def _ddp_rank(rank: int, world: int, store: str, x, y, steps: int, reps: int, queue) -> None:
    """One DDP process: its block of rows, the mesh example's model and step."""
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    rows = np.array_split(np.arange(len(y)), world)[rank]
    X, Y = torch.from_numpy(x[rows]), torch.from_numpy(y[rows])
    linear = nn.Linear(x.shape[1], 1, bias=False, dtype=torch.float64)
    nn.init.zeros_(linear.weight)
    model = nn.parallel.DistributedDataParallel(linear)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    times = []
    for rep in range(reps + 1):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            ((model(X)[:, 0] - Y) ** 2).mean().backward()  # DDP averages over the blocks
            opt.step()
        dist.barrier()
        if rep:  # the first run warms up
            times.append(time.perf_counter() - start)
    if rank == 0:
        queue.put((statistics.median(times), linear.weight.detach().numpy()[0].copy()))
    dist.destroy_process_group()


def ddp_steps(n: int, x, y, steps: int, reps: int):
    """(seconds per step, final weights) of torch DDP over gloo on n processes, or None."""
    try:
        import torch.multiprocessing as tmp
    except ImportError:
        return None
    import tempfile

    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        procs = [ctx.Process(target=_ddp_rank, args=(r, n, os.path.join(folder, "store"), x,
                                                      y, steps, reps, queue))
                 for r in range(n)]
        for p in procs:
            p.start()
        try:
            seconds, weights = queue.get(timeout=600)
        finally:
            for p in procs:
                p.join(60)
                if p.exitcode is None:
                    p.kill()
    return seconds / steps, weights


def kmeans_step(P, P2, C):
    """One k-means iteration, written once for mesh tensors and dask arrays alike: the
    new centres' sums and counts (Partial on a mesh, lazy in Dask)."""
    dist = P2 - 2 * (P @ C.T) + (C ** 2).sum(axis=1)
    near = dist == dist.min(axis=1, keepdims=True)
    return near.T.astype(np.float64) @ P, near.sum(axis=0)


def kmeans_data(mib: int, n: int, k: int = 8, d: int = 8):
    rng = np.random.default_rng(0)
    rows = (mib << 20) // (d * 8) * n
    centres = rng.uniform(-10, 10, (k, d))
    points = centres[rng.integers(0, k, rows)] + rng.standard_normal((rows, d))
    return points, points[rng.choice(rows, k, replace=False)]


def kmeans_mesh(points, start, n: int, iters: int):
    mwrt.init_master_worker(local_workers=n, timeout=120)
    try:
        mesh = mwrt.mesh()
        P = mwrt.dist_send(points, mesh=mesh, shard=0)
        P2 = (P ** 2).sum(axis=1, keepdims=True)
        C = mwrt.dist_send(start, mesh=mesh)
        sums, counts = kmeans_step(P, P2, C)
        C = sums / np.maximum(counts, 1)[:, None]
        mwrt.synchronize()
        begin = time.perf_counter()
        for _ in range(iters):
            sums, counts = kmeans_step(P, P2, C)
            C = sums / np.maximum(counts, 1)[:, None]
        final = C.numpy()
        return iters / (time.perf_counter() - begin), final
    finally:
        mwrt.shutdown()


def kmeans_dask(points, start, n: int, iters: int, rows: int):
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster):
        P = da.from_array(points, chunks=(rows, points.shape[1])).persist()
        P2 = (P ** 2).sum(axis=1, keepdims=True).persist()
        sums, counts = dask.compute(*kmeans_step(P, P2, start))
        C = sums / np.maximum(counts, 1)[:, None]
        begin = time.perf_counter()
        for _ in range(iters):
            sums, counts = dask.compute(*kmeans_step(P, P2, C))
            C = sums / np.maximum(counts, 1)[:, None]
        return iters / (time.perf_counter() - begin), C


def kmeans_table(sizes: list, n: int, iters: int) -> None:
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        print("\nk-means beside Dask: skipped (pip install 'dask[array]' distributed)")
        return
    print(f"\nk-means, {n} workers, {iters} iterations a run")
    print("| chunk per worker | mesh iterations/s | Dask iterations/s | ratio | same centres |")
    print("|---|---|---|---|---|")
    for mib in sizes:
        points, start = kmeans_data(mib, n)
        ours, mine = kmeans_mesh(points, start, n, iters)
        theirs, dasks = kmeans_dask(points, start, n, iters, len(points) // n)
        print(f"| {mib} MiB | {ours:,.1f} | {theirs:,.1f} | {ours / theirs:.1f}x | "
              f"{np.allclose(mine, dasks)} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N <= 2, few repetitions")
    ap.add_argument("--full", action="store_true", help="N up to 128, the step at 64 nodes")
    ap.add_argument("--nodes", help="the op table's N, comma-separated (e.g. 64,128)")
    ap.add_argument("--only", help="tables to run: ops,step,training,kmeans")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else {"ops", "step", "training", "kmeans"}
    started = time.monotonic()
    if args.quick:
        sizes, reps, ops, step_n, train, mibs, iters = [1, 2], 3, 300, 2, (2, 20, 2), [1], 3
    else:
        sizes = [1, 2, 4, 8, 16, 32, 64, 128] if args.full else [1, 2, 4, 8]
        reps, ops, step_n, train, mibs, iters = 5, 3000, 64 if args.full else 8, \
            (4, 100, 5), [1, 64], 10
    if args.nodes:
        sizes = [int(v) for v in args.nodes.split(",")]
    if "ops" in only:
        op_table(sizes, reps=reps, ops=ops)
    if "step" in only:
        captured_step(step_n, reps=reps)
    if "training" in only:
        training(*train)
    if "kmeans" in only:
        kmeans_table(mibs, 2, iters=iters)
    print(f"# {time.monotonic() - started:.1f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
