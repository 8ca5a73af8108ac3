"""Load (issue 6): two workers, mixed commands at a steady rate for a bounded time, then
checksums that prove no command was lost or run twice, and no free was lost either.

MWRT_LOAD_SECONDS (default 10) runs it longer; MWRT_LOAD_RATE sets the ops issued per second.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from tests.support.faultkit import TALLY

import mwrt

SECONDS = float(os.environ.get("MWRT_LOAD_SECONDS", "10"))
RATE = float(os.environ.get("MWRT_LOAD_RATE", "500"))
N = 1024  # elements per counter
LARGE = 16 * N  # int64 elements: 128 KiB, over MWRT_INLINE_BYTES: the data channel

pytestmark = pytest.mark.timeout(max(120, SECONDS * 4))


@pytest.fixture
def two_workers():
    mwrt.shutdown()
    mwrt.init_master_worker(local_workers=2, timeout=30)
    yield
    mwrt.shutdown()


class Load:
    """Counters on both nodes and their expected values, kept on the master in NumPy."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.counters = [mwrt.zeros(N, dtype=np.int64, node=n) for n in (0, 1)]
        self.expected = [np.zeros(N, np.int64) for _ in (0, 1)]
        self.bump = mwrt.remote(lambda a: a + 1, spec=((N,), np.int64))
        self.ops = 0

    def step(self) -> None:
        """One random op that changes a counter by an amount only this op adds."""
        rng, n = self.rng, int(self.rng.integers(2))
        c, e, k = self.counters, self.expected, int(rng.integers(1, 1000))
        kind = int(rng.integers(10))
        if kind == 0:  # create, then an in-place op with it
            c[n] += mwrt.full((N,), k, dtype=np.int64, node=n)
            e[n] += k
        elif kind == 1:  # in-place with a scalar
            c[n] += k
            e[n] += k
        elif kind == 2:  # a small array from the master, inline
            v = rng.integers(0, 1000, N)
            c[n] += mwrt.dist_send(v, node=n)
            e[n] += v
        elif kind == 3:  # a large one, over the data channel
            v = rng.integers(0, 1000, LARGE)
            c[n] += mwrt.dist_send(v, node=n)[:N]
            e[n] += v[:N]
        elif kind == 4:  # a shipped function; the old counter is freed
            c[n] = self.bump(c[n])
            e[n] += 1
        elif kind == 5:  # worker to worker, small and large
            size = N if rng.integers(2) else LARGE
            c[1 - n] += mwrt.full((size,), k, dtype=np.int64, node=n).to(node=1 - n)[:N]
            e[1 - n] += k
        elif kind == 6:  # an out-of-place op replacing the counter (a free of the old one)
            c[n] = c[n] * 1 + k
            e[n] += k
        elif kind == 7:  # read back: the master checks as it goes
            np.testing.assert_array_equal(c[n].numpy(), e[n])
        elif kind == 8:  # a large read back over the data channel
            big = mwrt.full((LARGE,), k, dtype=np.int64, node=n)
            assert int(big.numpy()[-1]) == k
        else:  # a reduction, read as a scalar
            assert int(c[n].sum()) == int(e[n].sum())
        self.ops += 1


def test_mixed_commands_under_load_lose_nothing_and_run_nothing_twice(two_workers):
    load = Load(seed=int(os.environ.get("MWRT_LOAD_SEED", "6")))
    start = time.monotonic()
    deadline = start + SECONDS
    while time.monotonic() < deadline:
        load.step()
        ahead = load.ops / RATE - (time.monotonic() - start)  # a steady rate, not a burst
        if ahead > 0:
            time.sleep(ahead)
    elapsed = time.monotonic() - start
    for n in (0, 1):
        np.testing.assert_array_equal(load.counters[n].numpy(), load.expected[n])
    ops, rows = load.ops, sum(next(node.ids) for node in mwrt.master.cluster.current().nodes)
    del load
    for n in (0, 1):  # every handle is gone, so every tensor was freed on its worker
        stats = mwrt.memory_stats(n)
        assert stats["tensors"] == 0, stats
    TALLY.load = (f"2 workers x {elapsed:.0f} s, {ops} ops ({ops / elapsed:.0f}/s, ~{rows} "
                  "commands), 0 lost, 0 run twice, every free done")
