"""Train an MLP classifier with torch on a worker, written as a torch user writes it.

The same `train` function runs twice: on local torch tensors, and on torch handles whose
model, data, AdamW optimizer and cosine schedule live on node 1 of two local workers. Every
op returns at once and runs on node 1; `loss.item()` is the one wait per step. The losses
of the two runs are equal bit for bit.

With --mesh, the same function trains data parallel on a mesh of 4 local workers: the model
replicated at every place, each batch sent Shard(0) (16 rows to each), the gradients summed
by an all_reduce between the workers at each step; and beside it, the same model under torch
DDP on gloo with 4 processes, each given the same 16 rows. The losses agree within float
tolerance (the sums run in another order). --ranks N trains on N workers beside N processes.

    python examples/torch_training.py [--mesh [--ranks 4]]
"""

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F

import mwrt
import mwrt.torch

STEPS, BATCH, RANKS = 40, 64, 4


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 4))


def make_data() -> tuple:
    """512 points in 20 dimensions, labelled by which of 4 directions they lean to most."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(512, 20, generator=g)
    y = (X @ torch.randn(20, 4, generator=g)).argmax(1)
    return X, y


def batches(X, y, send=lambda t: t):
    """The step's batch of 64 rows, each sent as `send` does."""
    def batch(step: int) -> tuple:
        i = (step * BATCH) % len(X)
        return send(X[i:i + BATCH]), send(y[i:i + BATCH])
    return batch


def train(model, opt, sched, batch, X, y) -> tuple[list, float]:
    """Plain torch: forward, loss, backward, step; the same code for every run."""
    losses = []
    for step in range(STEPS):
        xb, yb = batch(step)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    with torch.no_grad():
        accuracy = (model(X).argmax(1) == y).float().mean().item()
    return losses, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", action="store_true", help="data parallel, beside DDP")
    parser.add_argument("--ranks", type=int, default=RANKS, help="--mesh: workers and ranks")
    args = parser.parse_args()
    if args.mesh:
        return main_mesh(args.ranks)
    X, y = make_data()

    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    local, local_accuracy = train(model, opt, sched, batches(X, y), X, y)

    mwrt.init_master_worker(local_workers=2)
    try:
        model = mwrt.torch.module(make_model(), node=1)  # its parameters live on node 1
        opt = mwrt.torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
        sched = mwrt.torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
        Xr, yr = mwrt.dist_send(X, node=1), mwrt.dist_send(y, node=1)
        remote, accuracy = train(model, opt, sched, batches(Xr, yr), Xr, yr)
    finally:
        mwrt.shutdown()

    for step in range(0, STEPS, 10):
        print(f"step {step:2d}: loss {remote[step]:.6f} on node 1, {local[step]:.6f} local")
    print(f"accuracy after {STEPS} steps: {accuracy:.3f} on node 1, {local_accuracy:.3f} local")
    print(f"same losses as local torch, bit for bit: {remote == local}")



def main_mesh(ranks: int) -> None:
    """Data parallel on a mesh of `ranks` workers, beside torch DDP on gloo with as many
    processes."""
    if ranks < 1 or BATCH % ranks:
        raise SystemExit(f"torch_training: --ranks must divide the batch of {BATCH} (got "
                         f"{ranks}, expected 1, 2, 4, 8, ...)")
    X, y = make_data()
    ddp = run_ddp(X, y, ranks)
    mwrt.init_master_worker(local_workers=ranks)
    try:
        m = mwrt.mesh()  # the nodes' host memory
        model = mwrt.torch.module(make_model(), mesh=m)  # a replica at every place
        opt = mwrt.torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
        sched = mwrt.torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)

        def send(t):  # BATCH // ranks rows to each place
            return mwrt.dist_send(t, mesh=m, shard=0)
        meshed, accuracy = train(model, opt, sched, batches(X, y, send), send(X), send(y))
    finally:
        mwrt.shutdown()
    for step in range(0, STEPS, 10):
        print(f"step {step:2d}: loss {meshed[step]:.6f} on the mesh, {ddp[step]:.6f} under DDP")
    print(f"accuracy after {STEPS} steps: {accuracy:.3f} on the mesh")
    worst = max(abs(a - b) / abs(b) for a, b in zip(meshed, ddp))
    print(f"largest relative difference: {worst:.2e}")
    print(f"same losses as DDP within 1e-05: {worst < 1e-5}")


def run_ddp(X, y, ranks: int) -> list:
    """The losses of the same training under torch DDP, gloo, `ranks` processes."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        procs = [ctx.Process(target=ddp_rank, args=(r, ranks, store, X, y, queue))
                 for r in range(ranks)]
        for p in procs:
            p.start()
        try:
            losses = queue.get(timeout=300)
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    return losses


def ddp_rank(rank: int, ranks: int, store: str, X, y, queue) -> None:
    """One DDP rank: the model, AdamW and schedule as above, rows of each batch its own."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=ranks)
    model = DDP(make_model())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    rows = BATCH // ranks
    losses = []
    for step in range(STEPS):
        xb, yb = batches(X, y)(step)
        loss = F.cross_entropy(model(xb[rank * rows:(rank + 1) * rows]),
                               yb[rank * rows:(rank + 1) * rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # the loss over the whole batch
        losses.append(mean.item())
    if rank == 0:
        queue.put(losses)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
