"""torch's DDP, unchanged, on mwrt: `import mwrt.torch` registers the "mwrt" backend.

    mwrt-launch --nproc-per-node 2 examples/torch_ddp.py   # or torchrun; plain python: 2 ranks here
"""

try:
    import torch
except ModuleNotFoundError:
    raise SystemExit("torch_ddp.py needs torch, which mwrt does not: pip install 'mwrt[torch]' "
                     "(or torch's CPU build: pip install torch --index-url "
                     "https://download.pytorch.org/whl/cpu)") from None
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import mwrt.distributed
import mwrt.torch  # noqa: F401 - registers the "mwrt" torch.distributed backend


def main():
    dist.init_process_group("mwrt", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # every replica builds the same model; DDP broadcasts rank 0's anyway
    true_w = torch.randn(8, 1)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)  # each rank its own shard of the data
    for step in range(60):
        x = torch.randn(32, 8, generator=gen)
        loss = nn.functional.mse_loss(model(x), x @ true_w)
        opt.zero_grad()
        loss.backward()  # DDP all_reduces the gradients over mwrt as backward runs
        opt.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step:2d}  loss {loss.item():.5f}")
    err = (model.module.weight.detach().T - true_w).abs().max().item()
    if rank == 0:
        print(f"{n} ranks on {dist.get_backend()}: weight error {err:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mwrt.distributed.run(main)  # a rank under mwrt-launch or torchrun; plain python: 2 ranks
