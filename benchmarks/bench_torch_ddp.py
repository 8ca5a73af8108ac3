"""A DDP training step on torch's "mwrt" backend beside gloo, in the same run.

    python benchmarks/bench_torch_ddp.py [--world 2] [--steps 40] [--quick]

Fresh ranks (spawned processes, env://) hold two DDP replicas of one model, one over a
gloo group and one over an "mwrt" group, and take turns: a step of one, then a step of the
other, each after a barrier, so both see the same load on a shared machine. step = forward,
backward (DDP all_reduces the gradient buckets as backward runs) and SGD, the max over
ranks, median over steps. Two models: a small MLP (latency: many small buckets) and a
larger one (bandwidth: 1 MiB buckets of ~9 MB of gradients). The PowerSGD row runs the
larger model with DDP's PowerSGD comm hook (its callbacks start collectives of their own),
in one bucket.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from queue import Empty

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = {"small MLP (37 K params)": (64, 128, 8), "MLP (2.4 M params)": (512, 1536, 64)}


def _model(torch, nn, sizes):
    torch.manual_seed(0)
    d_in, hidden, d_out = sizes
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                         nn.Tanh(), nn.Linear(hidden, d_out))


def _rank(rank: int, world: int, store: str, steps: int, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    import mwrt.torch  # noqa: F401 - registers "mwrt"

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    groups = {"gloo": dist.group.WORLD, "mwrt": dist.new_group(backend="mwrt")}
    rows = {}
    cases = [(name, sizes, False) for name, sizes in MODELS.items()]
    cases.append(("MLP + PowerSGD hook", MODELS["MLP (2.4 M params)"], True))
    for name, sizes, hook in cases:
        ddps = {}
        for backend, group in groups.items():
            # One bucket with the hook: its callbacks of two buckets would start collectives
            # in an order that differs between ranks (gloo aborts on it too).
            ddps[backend] = DDP(_model(torch, nn, sizes), process_group=group,
                                bucket_cap_mb=64 if hook else 1)
            if hook:
                state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=2,
                                               start_powerSGD_iter=2)
                ddps[backend].register_comm_hook(state, powerSGD.powerSGD_hook)
        opts = {b: torch.optim.SGD(m.parameters(), lr=0.01) for b, m in ddps.items()}
        gen = torch.Generator().manual_seed(rank)
        x, y = torch.randn(64, sizes[0], generator=gen), torch.randn(64, sizes[2], generator=gen)
        times = {b: [] for b in ddps}
        for step in range(steps + 5):
            for backend, model in ddps.items():
                dist.barrier()
                t0 = time.perf_counter()
                opts[backend].zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opts[backend].step()
                if step >= 5:
                    times[backend].append(time.perf_counter() - t0)
        worst = {}
        for backend, ts in times.items():  # the max over ranks, step by step
            t = torch.tensor(ts, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            worst[backend] = sorted(t.tolist())[len(ts) // 2]
        rows[name] = worst
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def collect(queue, procs, seconds: float, who: str = "bench_torch_ddp"):
    """Rank 0's result, or an error naming `who` as soon as a rank exits without it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=1.0)
        except Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise SystemExit(f"{who}: a rank exited with {dead[0]}; see above")
    raise SystemExit(f"{who}: no result after {seconds} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="8 steps")
    args = ap.parse_args()
    try:
        import torch.multiprocessing as tmp
    except ImportError:
        print("torch is not installed (pip install mwrt[torch]): nothing to compare")
        return
    steps = 8 if args.quick else args.steps
    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        procs = [ctx.Process(target=_rank, args=(r, args.world, store, steps, queue))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        try:
            rows = collect(queue, procs, 600)
        finally:
            for p in procs:
                p.join(60)
                if p.exitcode is None:
                    p.kill()
    print(f"DDP step on {args.world} ranks, median of {steps} steps (max over ranks), "
          "taking turns in the same processes")
    print(f"{'model':28s} {'mwrt ms':>9s} {'gloo ms':>9s} {'gloo/mwrt':>10s}")
    for name, worst in rows.items():
        print(f"{name:28s} {worst['mwrt'] * 1e3:9.2f} {worst['gloo'] * 1e3:9.2f} "
              f"{worst['gloo'] / worst['mwrt']:9.2f}x")


if __name__ == "__main__":
    main()
