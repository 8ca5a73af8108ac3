"""all_gather: every rank contributes a slice and receives everyone's.

    mwrt-launch --nproc-per-node 2 examples/all_gather.py      # or: python examples/all_gather.py
"""

import os

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


def spawned_main(rank):
    """spawn's entry point (it must be importable): the rank comes from the environment."""
    main()


if __name__ == "__main__":
    if "RANK" in os.environ:  # started by mwrt-launch
        main()
    else:  # plain python: start the ranks ourselves
        dist.spawn(spawned_main, nprocs=int(os.environ.get("NPROC", "2")))
