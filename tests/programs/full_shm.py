"""A host whose /dev/shm is full: run by tests on a simulated host (its /dev/shm is a tmpfs
of its own). Master-worker transfers both ways and between workers, and an SPMD all_reduce
over shm, still work (through sockets); prints 'ok: ...' when every check passed."""

from __future__ import annotations

import subprocess

import numpy as np

import mwrt
import mwrt.distributed as dist


def fill_dev_shm() -> None:
    """Take all of /dev/shm but 64 KiB."""
    subprocess.run(["sh", "-c", "fallocate -l $(( $(df --output=avail -B1 /dev/shm | tail -1) "
                    "- 65536 )) /dev/shm/filler"], check=True)


def master_worker() -> None:
    mwrt.init_master_worker(local_workers=2)
    big = np.arange(1 << 20, dtype=np.float32)
    for _ in range(2):  # the first warns, the second goes the same way
        t = mwrt.dist_send(big, node=0)
        assert np.array_equal(t.numpy(), big)
        assert np.array_equal(t.to(node=1).numpy(), big)
    mwrt.shutdown()


def spmd_rank(rank: int) -> None:
    dist.init_process_group("shm")
    a = np.ones(1 << 20, np.float32)
    dist.all_reduce(a)
    assert (a == 2).all()
    dist.destroy_process_group()


if __name__ == "__main__":
    fill_dev_shm()
    try:
        master_worker()
        dist.spawn(spmd_rank, nprocs=2, timeout=60)
    finally:
        subprocess.run(["rm", "-f", "/dev/shm/filler"])
    print("ok: a full /dev/shm cost speed, not the session", flush=True)
