"""Sorting along a sharded axis: the merge-split plan beside replicate-then-sort.

A (rows, cols) float64 tensor sharded on its rows over `--nodes` local daemons is sorted
along the rows, in turns in the same session, `--reps` times each: `np.sort(X, axis=0)`
(mesh/sorting.py: each place sorts its block, neighbours merge theirs; the result stays
sharded, no place holds more than two blocks) and `np.sort(X.replicate(), axis=0)` (every
place gathers the whole and sorts it); then the same for a stable argsort. Printed: the
best and median wall time of each from issue to every node done, and the ratio (plan over
replicate). Local daemons share this machine's cores: wall times are the CPU's.

    python benchmarks/bench_mesh_sort.py [--nodes 3] [--rows 4000] [--cols 500] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import mwrt  # noqa: E402  (after the path above)


def timed(fn) -> float:
    """Seconds from issuing fn() until every node has run it."""
    mwrt.synchronize()
    start = time.perf_counter()
    fn()
    mwrt.synchronize()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--cols", type=int, default=500)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a small tensor, two turns")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.cols, args.reps = 300, 20, 2
    x = np.random.default_rng(0).standard_normal((args.rows, args.cols))
    mwrt.init_master_worker(local_workers=args.nodes, timeout=120)
    try:
        X = mwrt.dist_send(x, mesh=mwrt.mesh(), shard=0)
        rows = [("sort", lambda: np.sort(X, axis=0),
                 lambda: np.sort(X.replicate(), axis=0)),
                ("argsort stable", lambda: np.argsort(X, axis=0, kind="stable"),
                 lambda: np.argsort(X.replicate(), axis=0, kind="stable"))]
        np.testing.assert_array_equal(np.sort(X, axis=0).numpy(), np.sort(x, axis=0))
        print(f"{args.rows} x {args.cols} float64 on {args.nodes} local nodes, "
              f"{args.reps} turns, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print("| op | plan best / median ms | replicate best / median ms | ratio (median) |")
        print("|---|---|---|---|")
        for name, plan, replicate in rows:
            times: dict = {"plan": [], "replicate": []}
            for _ in range(args.reps):
                times["plan"].append(timed(plan))
                times["replicate"].append(timed(replicate))
            p, r = (statistics.median(times[k]) for k in ("plan", "replicate"))
            print(f"| {name} | {min(times['plan']) * 1e3:.0f} / {p * 1e3:.0f} | "
                  f"{min(times['replicate']) * 1e3:.0f} / {r * 1e3:.0f} | {p / r:.2f} |")
    finally:
        mwrt.shutdown()


if __name__ == "__main__":
    main()
