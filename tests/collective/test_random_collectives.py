"""A seeded random sequence of every SPMD call, checked exactly on every rank, over real
channels: the interleavings that single-feature tests never line up (uneven sizes next to
even ones, async calls, any-source receives between collectives)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.support import machine
from tests.support.ranks import available

import mwrt.distributed as dist

pytestmark = pytest.mark.timeout(120)

SIZES = [0, 1, 7, 1000, 20000, 300000]


def data(rank: int, n: int, salt: int) -> np.ndarray:
    """Small integers as float64, so every sum is exact whatever the order."""
    return ((np.arange(n) * (rank + 3) + salt) % 7).astype(np.float64)


def _step(it: int, kind: int, n: int, rng, rank: int, size: int) -> None:
    if kind == 0:
        a = data(rank, n, it)
        dist.all_reduce(a)
        assert np.array_equal(a, sum(data(r, n, it) for r in range(size))), it
    elif kind == 1:
        root = int(rng.integers(0, size))
        a = data(rank, n, it) if rank == root else np.zeros(n)
        dist.broadcast(a, src=root)
        assert np.array_equal(a, data(root, n, it)), it
    elif kind == 2:
        counts = [int(c) for c in rng.integers(0, 50, size)]
        out = [np.zeros(c) for c in counts]
        dist.all_gather(out, data(rank, counts[rank], it))
        assert all(np.array_equal(o, data(r, counts[r], it)) for r, o in enumerate(out)), it
    elif kind == 3:
        sent = rng.integers(0, 4, (size, size))  # sent[a][b]: elements a sends b
        outs = [np.zeros(int(sent[p][rank])) for p in range(size)]
        dist.all_to_all(outs, [data(rank, int(sent[rank][p]), it + p) for p in range(size)])
        assert all(np.array_equal(outs[p], data(p, int(sent[p][rank]), it + rank))
                   for p in range(size)), it
    elif kind == 4:
        out = np.zeros(n)
        dist.reduce_scatter(out, [data(rank, n, it + p) for p in range(size)])
        assert np.array_equal(out, sum(data(r, n, it + rank) for r in range(size))), it
    elif kind == 5:
        dist.monitored_barrier(timeout=20) if it % 2 else dist.barrier()
    elif kind == 6:  # every rank sends rank 0 one message; it takes them from any source
        if rank:
            dist.send(data(rank, 3, it), dst=0, tag=it)
            return
        for _ in range(size - 1):
            got = np.zeros(3)
            src = dist.recv(got, tag=it)
            assert np.array_equal(got, data(src, 3, it)), it
    else:
        a = data(rank, n, it)
        dist.all_reduce(a, async_op=True).wait()
        assert np.array_equal(a, sum(data(r, n, it) for r in range(size))), it


def _run(rank: int, backend: str, iterations: int) -> None:
    dist.init_process_group(backend, timeout=30)
    rng = np.random.default_rng(1234)  # the same sequence on every rank
    for it in range(iterations):
        kind, n = int(rng.integers(0, 8)), int(rng.choice(SIZES))
        _step(it, kind, n, rng, rank, dist.get_world_size())
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", [b for b in ("tcp", "shm") if available(b)])
def test_a_random_sequence_of_calls_is_exact_on_every_rank(backend):
    dist.spawn(_run, args=(backend, 600), nprocs=3, timeout=machine.seconds(100, 800))
