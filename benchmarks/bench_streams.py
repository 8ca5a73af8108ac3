"""Streams and events: the cost of record/wait_event per op pair, and the overlap of two streams.

The baseline for the event cost is the same op pair issued without events, in the same
run; the overlap is the time of two matmuls on one stream over their time on two streams
(BLAS limited to one thread per op, so two streams can use two cores). --quick: fewer
repetitions and smaller matmuls, for a test that the script still runs.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mwrt  # noqa: E402


def timed(fn) -> float:
    mwrt.synchronize()
    t = time.perf_counter()
    fn()
    mwrt.synchronize()
    return time.perf_counter() - t


def event_overhead(n: int = 2000) -> tuple[float, float]:
    a, b = mwrt.Stream(), mwrt.Stream()
    with mwrt.stream(a):
        xa = mwrt.zeros(16)
    with mwrt.stream(b):
        xb = mwrt.zeros(16)

    def plain():
        for _ in range(n):
            with mwrt.stream(a):
                xa.add_(1)
            with mwrt.stream(b):
                xb.add_(1)

    def with_events():
        for _ in range(n):
            with mwrt.stream(a):
                xa.add_(1)
            b.wait_event(a.record_event())
            with mwrt.stream(b):
                xb.add_(1)
    base = statistics.median(timed(plain) for _ in range(3)) / n * 1e6
    evented = statistics.median(timed(with_events) for _ in range(3)) / n * 1e6
    return base, evented


def overlap(size: int = 1024, reps: int = 4) -> tuple[float, float]:
    x = mwrt.rand(size, size)
    y = mwrt.rand(size, size)
    a, b = mwrt.Stream(), mwrt.Stream()

    def serial():
        for _ in range(reps):
            x @ x
            y @ y

    def overlapped():
        for _ in range(reps):
            with mwrt.stream(a):
                x @ x
            with mwrt.stream(b):
                y @ y
    return (statistics.median(timed(serial) for _ in range(3)),
            statistics.median(timed(overlapped) for _ in range(3)))


def main(quick: bool = False) -> None:
    mwrt.init_master_worker(local_workers=1)
    base, evented = event_overhead(200) if quick else event_overhead()
    size = 256 if quick else 1024
    serial, overlapped = overlap(size) if quick else overlap()
    mwrt.shutdown()
    print(f"{'what':52} {'mwrt':>14}   {'baseline (same run)':>26}")
    print(f"{'op pair on 2 streams + record/wait_event':52} {evented:>11.1f} µs   "
          f"{'without events ' + f'{base:.1f} µs':>26}")
    print(f"{'  event overhead per pair':52} {evented - base:>11.1f} µs")
    print(f"{f'2x4 matmuls {size}^2 f32, two streams':52} {overlapped * 1e3:>11.1f} ms   "
          f"{'one stream ' + f'{serial * 1e3:.1f} ms':>26}")
    print(f"{'  overlap (serial / two streams)':52} {serial / overlapped:>13.2f}x")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
