"""Point-to-point: rank 0 sends an array to rank 1, which sends it back doubled.

    mwrt-launch --nproc-per-node 2 examples/p2p_send_recv.py      # or: python examples/p2p_send_recv.py
"""

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


if __name__ == "__main__":
    dist.run(main)  # this rank under mwrt-launch (or srun, mpirun); plain python: 2 ranks here
