"""scatter rows of a matrix from rank 0, square them locally, gather them back.

    mwrt-launch --nproc-per-node 2 examples/scatter_gather.py      # or: python examples/scatter_gather.py
"""

import numpy as np

import mwrt.distributed as dist


def main():
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = [np.full(3, float(i)) for i in range(n)] if rank == 0 else None
    mine = np.zeros(3)
    dist.scatter(mine, rows, src=0)
    mine **= 2
    back = [np.zeros(3) for _ in range(n)] if rank == 0 else None
    dist.gather(mine, back, dst=0)
    if rank == 0:
        print("gathered squares:", np.stack(back).tolist())
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.run(main)  # this rank under mwrt-launch (or srun, mpirun); plain python: 2 ranks here
