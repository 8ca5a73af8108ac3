"""One rank of the torch-backend tests: `python torch_ranks.py MODES BACKEND OUT` under env://.

MODES names one mode or several, comma-separated, run in that order in one process group
(a rank imports torch once for all of them); OUT gets {mode: its result, "backend": ...}.
ddp trains a small model with torch's DDP and gives its weights; calls runs the usual
collectives through torch.distributed and gives what they returned; mismatch all_reduces
tensors of different shapes on the two ranks and gives the error text (the group is broken
after it: it comes last); peer_dies has rank DEAD_RANK exit at once and gives the other's
all_reduce error.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import mwrt.torch  # noqa: F401 - registers the "mwrt" backend


def ddp(rank: int) -> dict:
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)),
                bucket_cap_mb=0.0001)  # several buckets, so several overlapping all_reduces
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(5):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


def calls(rank: int) -> dict:
    n = dist.get_world_size()
    x = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(x)
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=1)
    parts = [torch.empty(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(parts, torch.tensor([rank, rank * 10]))
    m = torch.tensor([float(rank)])
    work = dist.all_reduce(m, op=dist.ReduceOp.MAX, async_op=True)
    work.wait()
    dist.barrier()
    out = torch.empty(2 * n)
    dist.all_gather_into_tensor(out, torch.tensor([rank, rank + 0.5]))
    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0]), dst=1)
        got = torch.zeros(2)
    else:
        got = torch.zeros(2)
        dist.recv(got, src=0)
    return {"all_reduce": x, "broadcast": b, "all_gather": torch.stack(parts), "max": m,
            "into_tensor": out, "recv": got, **more_calls(rank, n)}


def more_calls(rank: int, n: int) -> dict:
    r = torch.tensor([1.0 + rank, 2.0])
    dist.reduce(r, dst=1)
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * n) * (rank + 1))
    rl = torch.empty(1, dtype=torch.int32)
    dist.reduce_scatter(rl, [torch.tensor([rank + 10 * p], dtype=torch.int32) for p in range(n)])
    a2a = torch.empty(n)
    dist.all_to_all_single(a2a, torch.arange(float(n)) + 10 * rank)
    sub = dist.new_group([0, 1])
    avg = torch.tensor([float(rank)])
    dist.all_reduce(avg, op=dist.ReduceOp.AVG, group=sub)
    gathered = [torch.empty(2) for _ in range(n)] if rank == 0 else None
    dist.gather(torch.tensor([rank, -rank], dtype=torch.float32), gathered, dst=0)
    scattered = torch.empty(1)
    dist.scatter(scattered, [torch.tensor([5.0 + p]) for p in range(n)] if rank == 1 else None,
                 src=1)
    return {"gather": torch.stack(gathered) if rank == 0 else None, "scatter": scattered,
            "reduce": r, "reduce_scatter_tensor": rs, "reduce_scatter": rl, "all_to_all": a2a,
            "subgroup_avg": avg}


def mismatch(rank: int) -> dict:
    try:
        dist.all_reduce(torch.ones(3 + rank))
    except Exception as exc:  # noqa: BLE001 - the test reads its text
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": ""}


def peer_dies(rank: int) -> dict:
    if rank == int(os.environ["DEAD_RANK"]):
        os._exit(3)  # gone without a word, as a crashed rank is
    try:
        dist.all_reduce(torch.ones(1000))
    except Exception as exc:  # noqa: BLE001 - the test reads its text
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": ""}


def main() -> None:
    modes, backend, out = sys.argv[1].split(","), *sys.argv[2:4]
    dist.init_process_group(backend, init_method="env://")
    rank = dist.get_rank()
    known = {"ddp": ddp, "calls": calls, "mismatch": mismatch, "peer_dies": peer_dies}
    result = {mode: known[mode](rank) for mode in modes}
    result["backend"] = dist.get_backend()
    torch.save(result, f"{out}.{rank}")
    if modes[-1] in ("ddp", "calls"):
        dist.barrier()  # gloo may abort a rank whose peer tears down first
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
