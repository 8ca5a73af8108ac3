"""Steps/s of data-parallel training on a mesh of workers, beside torch DDP on gloo.

The model and optimizer of examples/torch_training.py (an MLP 20-64-64-4, AdamW, a batch of
64 rows split evenly) train on 1, 2 and 4 local workers from one master (the model
replicated with mwrt.torch.module(model, mesh=m), the batch sent Shard(0) once), eager and
captured (one step in mwrt.graph(), replayed); and, in the same run, under torch DDP on
gloo with as many processes (spawned, file:// rendezvous), each with its rows. A step is
zero_grad, forward, loss, backward (the gradients' all_reduce), step; no value is read
until the last step (then one wait). steps/s = steps / seconds over the timed steps, after
warm-up steps; the ratio is mwrt's over DDP's (the goal: captured at least DDP's).

A second table trains the same model sharded: mwrt.torch.fully_shard on 2 or more workers
(each parameter Shard(0), gathered for the forward and the backward, freed after each, the
gradients reduce_scattered), beside torch's FSDP2 (fully_shard of each Linear, then of the
model) on gloo with as many processes, in the same run. Both tables of one mesh size train on
the same workers, and DDP and FSDP2 in the same ranks, one after the other: the processes
start once per size.

    python benchmarks/bench_torch_mesh.py [--quick] [--steps N] [--workers 1,2,4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402,F401
from bench_torch_ddp import collect  # noqa: E402
from examples.torch_training import make_model  # noqa: E402 - the example's MLP, not a copy

BATCH, WARMUP = 64, 3


def make_batch() -> tuple:
    g = torch.Generator().manual_seed(1)
    X = torch.randn(BATCH, 20, generator=g)
    return X, (X @ torch.randn(20, 4, generator=g)).argmax(1)


def mesh_rates(workers: int, steps: int, places: tuple) -> list[tuple[float, float]]:
    """(eager, captured) steps/s on a mesh of `workers` local workers for each way of placing
    the model in `places` (replicated, fully_shard), one after another on the same workers
    (their start-up is no part of a rate)."""
    mwrt.init_master_worker(local_workers=workers, timeout=60)
    try:
        return [_placed_rates(place, steps) for place in places]
    finally:
        mwrt.shutdown()


def _placed_rates(place, steps: int) -> tuple[float, float]:
    m = mwrt.mesh()
    model = place(make_model(), mesh=m)
    opt = mwrt.torch.optim.AdamW(model.parameters(), lr=3e-3)
    X, y = (mwrt.dist_send(t, mesh=m, shard=0) for t in make_batch())

    def step():
        opt.zero_grad()
        F.cross_entropy(model(X), y).backward()
        opt.step()
    eager = _rate(step, steps)
    with mwrt.graph() as graph:
        step()
    return eager, _rate(graph.replay, steps)


def _rate(step, steps: int) -> float:
    for _ in range(WARMUP):
        step()
    mwrt.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    mwrt.synchronize()
    return steps / (time.perf_counter() - start)


def ddp_rates(workers: int, steps: int, wraps: tuple) -> list[float]:
    """steps/s of the same training under torch DDP (wrap "ddp") or FSDP2 ("fsdp") on gloo,
    `workers` processes, for each wrap in `wraps`, one after another in the same processes."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        procs = [ctx.Process(target=_ddp_rank, args=(r, workers, store, steps, queue, wraps))
                 for r in range(workers)]
        for p in procs:
            p.start()
        try:
            return collect(queue, procs, 300, "bench_torch_mesh: DDP")
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()


def _ddp_rank(rank: int, world: int, store: str, steps: int, queue, wraps: tuple) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    rates = [_wrapped_rate(rank, world, steps, wrap) for wrap in wraps]
    if rank == 0:
        queue.put(rates)
    dist.destroy_process_group()


def _wrapped_rate(rank: int, world: int, steps: int, wrap: str) -> float:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model()
    if wrap == "fsdp":  # FSDP2's pattern: each layer with weights, then the root
        for layer in model.modules():
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    X, y = make_batch()
    rows = BATCH // world
    x, t = X[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
    for i in range(WARMUP + steps):
        if i == WARMUP:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), t).backward()
        opt.step()
    dist.barrier()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 workers, 5 steps")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per row")
    parser.add_argument("--workers", default="1,2,4", help="the mesh sizes, comma-separated")
    args = parser.parse_args()
    sizes = [2] if args.quick else [int(n) for n in args.workers.split(",")]
    steps = 5 if args.quick else args.steps
    rows, sharded = [], []
    for n in sizes:  # each world's workers and ranks start once, for both tables
        sharded_too = n >= 2
        wraps = ("ddp", "fsdp") if sharded_too else ("ddp",)
        places = (mwrt.torch.module, mwrt.torch.fully_shard) if sharded_too else \
            (mwrt.torch.module,)
        bases, meshes = ddp_rates(n, steps, wraps), mesh_rates(n, steps, places)
        rows.append((n, *meshes[0], bases[0]))
        if sharded_too:
            sharded.append((n, *meshes[1], bases[1]))
    print(f"training steps/s, MLP 20-64-64-4, AdamW, batch {BATCH} ({steps} steps over their "
          f"time, after {WARMUP}; load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, shared)")
    _table(rows, "replicated", "DDP gloo", "DDP")
    _table(sharded, "fully_shard", "FSDP2 gloo", "FSDP")


def _table(rows: list, kind: str, baseline: str, short: str) -> None:
    print(f"{kind}:\n{'workers':>7} {'mwrt eager':>11} {'mwrt captured':>14} {baseline:>10} "
          f"{'eager/' + short:>11} {'captured/' + short:>14}")
    for n, eager, captured, base in rows:
        print(f"{n:7d} {eager:11.1f} {captured:14.1f} {base:10.1f} {eager / base:11.2f} "
              f"{captured / base:14.2f}")


if __name__ == "__main__":
    main()
