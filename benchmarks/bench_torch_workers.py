"""The master's CPU per torch op on a torch handle, beside the same op on a NumPy handle.

Each row issues one op N times on one local worker and reads the master process's CPU time
(time.process_time, every thread of it) over the issuing only; the worker runs the ops
meanwhile, and a synchronize between rounds (not counted) keeps the queue short. The
baseline is the NumPy handle's op of the same shape in the same run; the ratio is torch's
over NumPy's (the goal: at most 1.5). The first round of each row is a warm-up (torch's
meta device runs once per new (op, input metadata); later rounds hit the cache).

    python benchmarks/bench_torch_workers.py [--quick] [--ops N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mwrt  # noqa: E402
import mwrt.torch  # noqa: E402,F401


def cpu_per_op(op, n: int, rounds: int) -> float:
    """Median over rounds of the master's CPU microseconds per call of `op` (issue only)."""
    results = []
    for i in range(rounds + 1):
        start = time.process_time()
        for _ in range(n):
            op()
        spent = time.process_time() - start
        mwrt.synchronize()
        if i:  # the first round warms the caches
            results.append(spent / n * 1e6)
    return statistics.median(results)


def rows(n: int, rounds: int) -> list[tuple[str, float, float]]:
    x0 = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    xn, wn = mwrt.dist_send(x0), mwrt.dist_send(x0.copy())
    xt, wt = mwrt.dist_send(torch.from_numpy(x0.copy())), mwrt.dist_send(torch.from_numpy(x0))
    keep: list = [None]

    def keeping(make):
        def op():
            keep[0] = make()  # the result lives until the next one: one free per op
        return op

    table = [
        ("x += 1.0 (in place)", lambda: xn.__iadd__(1.0), lambda: xt.add_(1.0)),
        ("y = x * 2.0 (new result)", keeping(lambda: xn * 2.0), keeping(lambda: xt * 2.0)),
        ("y = x @ w", keeping(lambda: xn @ wn), keeping(lambda: xt @ wt)),
        ("y = x[1:, ::2] (a view)", keeping(lambda: xn[1:, ::2]),
         keeping(lambda: xt[1:, ::2])),
        ("y = relu(x) (np.maximum / F.relu)", keeping(lambda: np.maximum(xn, 0)),
         keeping(lambda: F.relu(xt))),
        ("y = x.sum(1)", keeping(lambda: xn.sum(1)), keeping(lambda: xt.sum(1))),
    ]
    return [(name, cpu_per_op(numpy_op, n, rounds), cpu_per_op(torch_op, n, rounds))
            for name, numpy_op, torch_op in table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few ops and rounds")
    parser.add_argument("--ops", type=int, default=2000, help="ops per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per row")
    args = parser.parse_args()
    n, rounds = (200, 2) if args.quick else (args.ops, args.rounds)
    mwrt.init_master_worker(local_workers=1, timeout=60)
    try:
        table = rows(n, rounds)
    finally:
        mwrt.shutdown()
    print(f"master CPU per op, us (median of {rounds} rounds of {n}; load "
          f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)")
    print(f"{'op':38} {'NumPy handle':>13} {'torch handle':>13} {'ratio':>6}")
    for name, numpy_us, torch_us in table:
        print(f"{name:38} {numpy_us:13.2f} {torch_us:13.2f} {torch_us / numpy_us:6.2f}")


if __name__ == "__main__":
    main()
