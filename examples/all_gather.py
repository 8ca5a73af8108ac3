"""all_gather: every rank contributes a slice and receives everyone's.

    mwrt-launch --nproc-per-node 2 examples/all_gather.py      # or: python examples/all_gather.py
"""

import numpy as np

import mwrt.distributed as dist


def main():
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    parts = [np.zeros(2, np.int32) for _ in range(n)]
    dist.all_gather(parts, np.array([rank, rank * 10], np.int32))
    names = [None] * n
    dist.all_gather_object(names, f"worker-{rank}")
    print(f"rank {rank}: {np.concatenate(parts).tolist()} {names}")
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.run(main)  # this rank under mwrt-launch (or srun, mpirun); plain python: 2 ranks here
