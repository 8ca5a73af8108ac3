"""Train an MLP classifier with torch on a worker, written as a torch user writes it.

The same `train` function runs twice: on local torch tensors, and on torch handles whose
model, data, AdamW optimizer and cosine schedule live on node 1 of two local workers. Every
op returns at once and runs on node 1; `loss.item()` is the one wait per step. The losses
of the two runs are equal bit for bit.

    python examples/torch_training.py
"""

import torch
import torch.nn.functional as F

import mwrt
import mwrt.torch

STEPS, BATCH = 40, 64


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


def train(model, opt, sched, X, y) -> tuple[list, float]:
    """Plain torch: forward, loss, backward, step; the same code for both runs."""
    losses = []
    for step in range(STEPS):
        i = (step * BATCH) % len(X)
        loss = F.cross_entropy(model(X[i:i + BATCH]), y[i:i + BATCH])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    with torch.no_grad():
        accuracy = (model(X).argmax(1) == y).float().mean().item()
    return losses, accuracy


def main() -> None:
    X, y = make_data()

    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    local, local_accuracy = train(model, opt, sched, X, y)

    mwrt.init_master_worker(local_workers=2)
    try:
        model = mwrt.torch.module(make_model(), node=1)  # its parameters live on node 1
        opt = mwrt.torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
        sched = mwrt.torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
        Xr, yr = mwrt.dist_send(X, node=1), mwrt.dist_send(y, node=1)
        remote, accuracy = train(model, opt, sched, Xr, yr)
    finally:
        mwrt.shutdown()

    for step in range(0, STEPS, 10):
        print(f"step {step:2d}: loss {remote[step]:.6f} on node 1, {local[step]:.6f} local")
    print(f"accuracy after {STEPS} steps: {accuracy:.3f} on node 1, {local_accuracy:.3f} local")
    print(f"same losses as local torch, bit for bit: {remote == local}")


if __name__ == "__main__":
    main()
