"""MPI's own collectives behind mwrt's: run by tests under `mpiexec -n N`.

Every collective goes to MPI (counted), results match NumPy's, a float16 sum declines to
mwrt's algorithms, a subgroup gets its own communicator, and ranks that disagree get
CollectiveMismatchError instead of MPI's undefined behaviour. Prints 'rank R of N: mpi
collectives ok'.
"""

from __future__ import annotations

import numpy as np

import mwrt.distributed as dist
from mwrt.collective import mpi_ops
from mwrt.errors import CollectiveMismatchError

calls = []
_run = mpi_ops.MpiCollectives.run


def counted(self, kind, call, *args):
    done = _run(self, kind, call, *args)
    calls.append((kind, done))
    return done


mpi_ops.MpiCollectives.run = counted


def main() -> None:
    dist.init_process_group("mpi", timeout=60)
    rank, size = dist.get_rank(), dist.get_world_size()
    a = np.arange(10, dtype=np.float32) + rank
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    assert np.allclose(a, np.arange(10) + (size - 1) / 2), a
    b = np.full(3, rank + 1, np.int64)
    dist.all_reduce(b, op=dist.ReduceOp.PRODUCT)
    assert (b == np.prod(np.arange(1, size + 1))).all()
    out = [np.zeros(2, np.float64) for _ in range(size)]
    dist.all_gather(out, np.full(2, rank, np.float64))
    assert [o[0] for o in out] == list(range(size))
    c = np.full(4, 7 if rank == 0 else 0, np.uint8)
    dist.broadcast(c, src=0)
    assert (c == 7).all()
    assert all(done for _, done in calls), calls
    half = np.ones(5, np.float16)
    dist.all_reduce(half)  # MPI has no float16 sum here: mwrt's ring does it
    assert (half == size).all() and calls[-1] == ("all_reduce", False)
    evens = dist.new_group([r for r in range(size) if r % 2 == 0])
    if rank % 2 == 0:
        d = np.ones(6, np.int32)
        dist.all_reduce(d, group=evens)
        assert (d == len(range(0, size, 2))).all()
    try:
        dist.all_reduce(np.zeros(3 + rank, np.float32))
        raise AssertionError("ranks with different shapes were not told")
    except CollectiveMismatchError as exc:
        assert "ranks disagree" in str(exc), exc
    dist.barrier()
    print(f"rank {rank} of {size}: mpi collectives ok ({len(calls)} calls)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
