"""all_reduce over the whole world, then over a subgroup made with new_group.

    mwrt-launch --nproc-per-node 2 examples/all_reduce_subgroup.py      # or: python examples/all_reduce_subgroup.py
"""

import numpy as np

import mwrt.distributed as dist


def main():
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    x = np.full(3, float(rank + 1))
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    print(f"rank {rank}: world sum {x}")
    evens = dist.new_group(range(0, n, 2))  # every rank calls new_group, members or not
    y = np.full(3, float(rank + 1))
    if dist.get_rank(evens) >= 0:
        dist.all_reduce(y, op=dist.ReduceOp.MAX, group=evens)
        print(f"rank {rank}: max over even ranks {y}")
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.run(main)  # this rank under mwrt-launch (or srun, mpirun); plain python: 2 ranks here
