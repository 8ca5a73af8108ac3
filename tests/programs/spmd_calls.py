"""Every SPMD call, checked exactly on every rank: run by tests on simulated hosts.

    python spmd_calls.py [INIT_METHOD]   (default env://, as mwrt-launch sets it up)

Prints 'rank R of N: ok (BACKEND, peers on HOSTS)' when every check passed.
"""

from __future__ import annotations

import os
import socket
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.collective.test_random_collectives import SIZES, _step, data  # noqa: E402  (the tests' own checks)

import mwrt.distributed as dist  # noqa: E402
from mwrt.collective import hierarchy  # noqa: E402


OPS = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
       "AVG": np.add, "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def every_op_and_dtype(rank: int, size: int) -> None:
    """all_reduce of every ReduceOp on every dtype it takes, small and large (two-level on
    hosts with several ranks, MPI's own over mpi), checked exactly against NumPy."""
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.uint8):
        for name, ufunc in OPS.items():
            integral = np.issubdtype(dtype, np.integer)
            if (name == "AVG" and integral) or (name.startswith("B") and not integral):
                continue
            for n in (7, 30000):
                mine = [((np.arange(n) * (r + 3) + 1) % 5 + 1).astype(dtype) for r in range(size)]
                want = ufunc.reduce(np.stack(mine), axis=0).astype(dtype)
                if name == "AVG":
                    want = (want / size).astype(dtype)
                got = mine[rank].copy()
                dist.all_reduce(got, op=getattr(dist.ReduceOp, name))
                assert np.array_equal(got, want), (name, dtype, n)


def rooted_and_p2p(rank: int, size: int) -> None:
    """The calls the random sequence does not make: rooted ones, async p2p, objects."""
    got = np.zeros(3)
    dist.scatter(got, [np.full(3, p * 10.0) for p in range(size)] if rank == 0 else None, src=0)
    assert (got == rank * 10).all()
    gathered = [np.zeros(3) for _ in range(size)] if rank == size - 1 else None
    dist.gather(got, gathered, dst=size - 1)
    if rank == size - 1:
        assert [g[0] for g in gathered] == [p * 10.0 for p in range(size)]
    a = data(rank, 1000, 1)
    dist.reduce(a, dst=0)
    if rank == 0:
        assert np.array_equal(a, sum(data(r, 1000, 1) for r in range(size)))
    right, left = (rank + 1) % size, (rank - 1) % size
    inbox = np.zeros(300000)
    ops = [dist.P2POp(dist.isend, data(rank, 300000, 2), right),
           dist.P2POp(dist.irecv, inbox, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert np.array_equal(inbox, data(left, 300000, 2))
    sending = dist.isend(data(rank, 5, 3), right)
    box = np.zeros(5)
    dist.recv(box, left)  # blocking, while our own send is in flight
    sending.wait()
    assert np.array_equal(box, data(left, 5, 3))
    every_op_and_dtype(rank, size)
    for n in (5, 40000):  # an even all_gather, small and large (two-level across hosts)
        even = [np.zeros(n) for _ in range(size)]
        dist.all_gather(even, np.full(n, float(rank)))
        assert all((e == r).all() for r, e in enumerate(even)), "all_gather"
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "host": socket.gethostname()})
    assert [o["rank"] for o in objects] == list(range(size))
    box = [socket.gethostname() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    assert box[0] == objects[0]["host"]
    return sorted({o["host"] for o in objects})


def main() -> None:
    init = sys.argv[1] if len(sys.argv) > 1 else "env://"
    dist.init_process_group(os.environ.get("BACKEND") or None, init_method=init, timeout=60,
                            rank=int(os.environ.get("RANK", -1)),
                            world_size=int(os.environ.get("WORLD_SIZE", -1)))
    rank, size = dist.get_rank(), dist.get_world_size()
    hosts = rooted_and_p2p(rank, size)
    rng = np.random.default_rng(1234)  # the same sequence on every rank
    for it in range(int(os.environ.get("ITERATIONS", "60"))):
        kind, n = int(rng.integers(0, 8)), int(rng.choice(SIZES))
        _step(it, kind, n, rng, rank, size)
    dist.barrier()
    channel = dist.process_groups._state.channel  # which path the channel takes to each peer
    via = ",".join(f"{p}:{'shm' if channel.shares_host(p) else 'tcp'}"
                   for p in range(size) if p != rank) if channel.name == "auto" else ""
    two_level = hierarchy.levels(dist.process_groups._state.group) is not None
    print(f"rank {rank} of {size}: ok ({dist.get_backend()}, hosts {','.join(hosts)}, "
          f"paths {via}{', two-level' if two_level else ''})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
