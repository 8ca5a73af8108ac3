"""Point-to-point: rank 0 sends an array to rank 1, which sends it back doubled.

    mwrt-launch --nproc-per-node 2 examples/p2p_send_recv.py      # or: python examples/p2p_send_recv.py
"""

import os

import numpy as np

import mwrt.distributed as dist


def main():
    dist.init_process_group()
    rank = dist.get_rank()
    buf = np.zeros(4, np.float32)
    if rank == 0:
        dist.send(np.arange(4, dtype=np.float32), dst=1)
        dist.recv(buf, src=1)
        print(f"rank 0 got back {buf}")
    elif rank == 1:
        dist.recv(buf, src=0)
        dist.send(buf * 2, dst=0)
    dist.destroy_process_group()


def spawned_main(rank):
    """spawn's entry point (it must be importable): the rank comes from the environment."""
    main()


if __name__ == "__main__":
    if "RANK" in os.environ:  # started by mwrt-launch
        main()
    else:  # plain python: start the ranks ourselves
        dist.spawn(spawned_main, nprocs=int(os.environ.get("NPROC", "2")))
