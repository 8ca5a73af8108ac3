"""Non-blocking point-to-point: every rank passes its rank to the right, around a ring.

    mwrt-launch --nproc-per-node 2 examples/p2p_isend_irecv.py      # or: python examples/p2p_isend_irecv.py
"""

import numpy as np

import mwrt.distributed as dist


def main():
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    got = np.zeros(1, np.int64)
    send = dist.isend(np.array([rank]), dst=(rank + 1) % n)  # returns at once
    recv = dist.irecv(got, src=(rank - 1) % n)
    send.wait()
    recv.wait()  # read `got` only after wait()
    print(f"rank {rank} received {got[0]} from its left neighbour")
    dist.destroy_process_group()


if __name__ == "__main__":
    dist.run(main)  # this rank under mwrt-launch (or srun, mpirun); plain python: 2 ranks here
