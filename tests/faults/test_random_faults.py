"""A rank killed at a random point of a random sequence of collectives: every survivor
raises an error naming it, and nobody hangs."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import pytest
from tests.support.ranks import available
from tests.collective.test_random_collectives import SIZES, _step

import mwrt.distributed as dist

pytestmark = pytest.mark.timeout(120)

COLLECTIVE_KINDS = [0, 1, 2, 3, 4, 5, 7]  # _step's kinds but the point-to-point one


def _rank(rank, env, backend, victim, at, seed, reports):
    os.environ.update(env)
    dist.init_process_group(backend, timeout=5)
    rng = np.random.default_rng(seed)
    try:
        for it in range(at + 200):
            if rank == victim and it == at:
                os._exit(9)  # a crash: no goodbye
            kind = int(rng.choice(COLLECTIVE_KINDS))
            _step(it, kind, int(rng.choice(SIZES)), rng, rank, dist.get_world_size())
        reports.put((rank, "finished without an error"))
    except Exception as e:  # noqa: BLE001 - reported to the test
        reports.put((rank, f"{type(e).__name__}: {e}"))
    time.sleep(60)  # stay up, as a survivor that leaves would look dead to the others


@pytest.mark.parametrize("backend,size,victim,at,seed", [
    ("tcp", 3, 1, 37, 11), ("tcp", 4, 3, 80, 12), ("shm", 3, 0, 55, 13), ("shm", 4, 2, 21, 14)])
def test_a_rank_killed_mid_sequence_is_named_by_every_survivor(backend, size, victim, at,
                                                                 seed):
    if not available(backend):
        pytest.skip(f"channel {backend!r} is not available")
    from mwrt.store.launchers import free_port, rank_env

    ctx = mp.get_context("spawn")
    reports, port, procs = ctx.SimpleQueue(), free_port(), []
    try:
        for r in range(size):
            env = rank_env(r, size, r, size, "127.0.0.1", port)
            procs.append(ctx.Process(target=_rank, args=(r, env, backend, victim, at, seed,
                                                         reports)))
            procs[-1].start()
        got, deadline = {}, time.monotonic() + 60
        while len(got) < size - 1 and time.monotonic() < deadline:
            if not reports.empty():
                rank, text = reports.get()
                got[rank] = text
            time.sleep(0.05)
    finally:
        for p in procs:
            p.kill()
            p.join()
    assert sorted(got) == [r for r in range(size) if r != victim], f"hung: {got}"
    for rank, text in got.items():
        assert f"rank {victim}" in text or f"ranks [{victim}]" in text, (rank, text)
