"""Checkpoints: mwrt.save / mwrt.load GB/s beside NumPy writing and reading the same bytes.

Rows, each with its baseline measured in the same run:
- save: every worker writes its tensor (fsync'd), against as many fresh processes each
  np.save-ing (and fsync-ing) the same bytes to the same disk at once: the disk's floor;
  and against the save a user has today, every array through the master (.numpy() +
  np.save);
- load: every worker reads and checks its part, against fresh processes np.load-ing;
- wait=False: a training step's time with a background save every 25 steps, beside the
  same step with no checkpoint (goal < 5%).

    python benchmarks/bench_checkpoint.py [--workers 2] [--mb 256] [--quick]

--quick: 4 MB a worker, one round of each NumPy baseline, 30 steps a row with a save every
10: that every row runs, not figures to keep.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mwrt

_NUMPY_WRITER = """
import os, sys, time, numpy as np
a = np.ones(int(sys.argv[2]) // 8)
path = sys.argv[1]
t = time.perf_counter()
if sys.argv[3] == "save":
    with open(path, "wb") as f:
        np.save(f, a)
        f.flush()
        os.fsync(f.fileno())
else:
    b = np.load(path)
print(time.perf_counter() - t)
"""


def numpy_floor(directory: str, workers: int, nbytes: int, what: str, reps: int = 3) -> float:
    """GB/s of `workers` fresh processes saving (or loading) nbytes each, at once: the best
    of `reps` rounds, as mwrt's rows are (a shared disk's fsync varies 2-3x run to run)."""
    best = float("inf")
    for rep in range(reps):  # new files each round, as each save writes new ones
        paths = [os.path.join(directory, f"np{rep if what == 'save' else 0}-{i}.npy")
                 for i in range(workers)]
        procs = [subprocess.Popen([sys.executable, "-c", _NUMPY_WRITER, p, str(nbytes), what],
                                  stdout=subprocess.PIPE, text=True) for p in paths]
        best = min(best, max(float(p.communicate()[0]) for p in procs))
    return workers * nbytes / best / 1e9


def through_master(directory: str, tensors: dict) -> float:
    """GB/s of today's user-side save: every array to the master, then np.save."""
    t = time.perf_counter()
    for name, tensor in tensors.items():
        with open(os.path.join(directory, f"{name}.npy"), "wb") as f:
            np.save(f, tensor.numpy())
            f.flush()
            os.fsync(f.fileno())
    return sum(x.nbytes for x in tensors.values()) / (time.perf_counter() - t) / 1e9


def timed_gbps(fn, nbytes: int, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def step_ms(w, x, y, steps: int, save_dir: str | None, every: int = 25) -> float:
    """Mean ms per step of a least-squares update on each node (a save every `every` steps
    if asked)."""
    times = []
    handle = None
    for step in range(steps):
        t = time.perf_counter()
        for wi, xi, yi in zip(w, x, y):
            wi -= 1e-6 * (xi.T @ (xi @ wi - yi))
        if save_dir is not None and step % every == 0:
            if handle is not None:
                handle.wait()
            handle = mwrt.save(save_dir, {f"w{i}": wi for i, wi in enumerate(w)}, wait=False)
        for wi in w:  # the step's own streams (synchronize() would wait for the save's too)
            wi.numpy()
        times.append(time.perf_counter() - t)
    if handle is not None:
        handle.wait()
    return float(np.mean(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mb", type=int, default=256, help="MB each worker holds")
    parser.add_argument("--quick", action="store_true", help="4 MB, 30 steps: a short run")
    opts = parser.parse_args()
    if opts.quick:
        opts.mb = 4
    rounds, steps, every = (1, 30, 10) if opts.quick else (3, 100, 25)
    nbytes = opts.mb << 20
    with tempfile.TemporaryDirectory(dir=os.environ.get("MWRT_BENCH_DIR")) as directory:
        floor_save = numpy_floor(directory, opts.workers, nbytes, "save", rounds)
        floor_load = numpy_floor(directory, opts.workers, nbytes, "load", rounds)
        mwrt.init_master_worker(local_workers=opts.workers)
        tensors = {}
        for i in range(opts.workers):
            with mwrt.node(i):
                tensors[f"t{i}"] = mwrt.ones(nbytes // 8, dtype=np.float64)
        total = nbytes * opts.workers
        ckpt = os.path.join(directory, "ckpt")
        save = timed_gbps(lambda: mwrt.save(ckpt, tensors), total)
        load = timed_gbps(lambda: mwrt.load(ckpt), total)
        master = through_master(directory, tensors)
        tensors.clear()  # their memory back before the training rows
        x, y, w = [], [], []
        for i in range(opts.workers):
            with mwrt.node(i):
                x.append(mwrt.randn(2048, 1024))
                y.append(mwrt.randn(2048))
                w.append(mwrt.zeros(1024))
        step_ms(w, x, y, 10, None)  # warm: the first steps fault their pages in
        plain = step_ms(w, x, y, steps, None)
        saving = step_ms(w, x, y, steps, os.path.join(directory, "steps"), every)
        mwrt.shutdown()
    n = opts.workers
    print(f"checkpoint: {n} local workers, {opts.mb} MB each, fsync'd, on {directory}'s disk")
    print(f"{'what':44} {'mwrt':>10} {'baseline':>10} {'ratio':>7}  goal")
    print(f"{'save, GB/s (all workers)':44} {save:10.2f} {floor_save:10.2f} "
          f"{save / floor_save:6.2f}x  >= 0.9x (np.save in {n} processes)")
    print(f"{'save, GB/s, vs .numpy() + np.save':44} {save:10.2f} {master:10.2f} "
          f"{save / master:6.2f}x  (today's save through the master)")
    print(f"{'load, GB/s (all workers, CRC32 checked)':44} {load:10.2f} {floor_load:10.2f} "
          f"{load / floor_load:6.2f}x  >= 0.9x (np.load in {n} processes)")
    print(f"{f'step, save(wait=False) every {every} steps, ms':44} {saving:10.2f} {plain:10.2f} "
          f"{saving / plain:6.2f}x  < 1.05x (the step without checkpoints)")


if __name__ == "__main__":
    main()
