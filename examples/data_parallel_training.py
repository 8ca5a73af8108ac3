"""Data-parallel training: each rank fits a linear model on its shard, averaging gradients.

    mwrt-launch --nproc-per-node 2 examples/data_parallel_training.py      # or: python examples/data_parallel_training.py
"""

import numpy as np

import mwrt.distributed as dist


def main():
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal(8)
    x = rng.standard_normal((1024, 8))
    y = x @ true_w + 0.01 * rng.standard_normal(1024)
    x, y = x[rank::n], y[rank::n]  # this rank's shard of the data
    w = np.zeros(8)
    dist.broadcast(w, src=0)  # every replica starts from the same weights
    for step in range(60):
        err = x @ w - y
        grad = 2 * x.T @ err / len(y)
        dist.all_reduce(grad, op=dist.ReduceOp.AVG)  # the data-parallel step
        w -= 0.1 * grad
        loss = np.array([np.mean(err ** 2)])
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        if rank == 0 and step % 10 == 0:
            print(f"step {step:2d}  loss {loss[0]:.5f}")
    if rank == 0:
        print(f"final loss {loss[0]:.5f}; weight error {np.abs(w - true_w).max():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.run(main)  # this rank under mwrt-launch (or srun, mpirun); plain python: 2 ranks here
