"""broadcast: rank 0's array (and a Python object) reach every rank.

    mwrt-launch --nproc-per-node 2 examples/broadcast.py      # or: python examples/broadcast.py
"""

import numpy as np

import mwrt.distributed as dist


def main():
    dist.init_process_group()
    rank = dist.get_rank()
    weights = np.random.default_rng(rank).standard_normal(4).astype(np.float32)
    dist.broadcast(weights, src=0)  # now identical everywhere
    config = [{"lr": 0.1, "epochs": 3}] if rank == 0 else [None]
    dist.broadcast_object_list(config, src=0)
    print(f"rank {rank}: weights {np.round(weights, 3)} config {config[0]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.run(main)  # this rank under mwrt-launch (or srun, mpirun); plain python: 2 ranks here
