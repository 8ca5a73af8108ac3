"""GPU transfers beside CuPy's own calls, measured in the same run.

  H2D / D2H: the worker's staging loops (mwrt.staging: pinned buffers from the
      pool, chunks whose copies overlap) fed from / into host memory, beside CuPy's
      `cupy.asarray(host)` and `.get()` on the same array.
  D2D on one GPU: mwrt's `y.copy_(x)` issued from the master, 8 then one sync, beside
      `cupy.copyto` the same way.
  GPU to GPU (two GPUs): mwrt's `.to(device=1)`, beside `cupy.asarray` under Device(1).
  master -> GPU and GPU -> master, end to end: `dist_send(host, device=0)` and
  `.numpy()` (command, data channel, staging, copy), beside `cupy.asarray` / `.get()`.

Every figure is GB/s (1e9 bytes per second) of the array's bytes, the median of several
repetitions. Where no GPU exists it says so and exits 0; --fake runs the same code on
mwrt.testing.fakegpu (host memory posing as GPUs), which checks the benchmark, not a GPU.

    python benchmarks/bench_gpu.py [--quick] [--fake]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    parser.add_argument("--fake", action="store_true",
                        help="run on mwrt.testing.fakegpu (checks the benchmark, measures no GPU)")
    return parser.parse_args()


class _Done:
    """A Work that is complete already (the memory 'channel' copies at once)."""

    def wait(self, timeout=None) -> None:
        pass

    def is_completed(self) -> bool:
        return True

    def cancel(self) -> None:
        pass


class MemoryChannel:
    """A channel whose far end is host memory: a receive copies the next bytes out of
    `source`, a send copies into `sink`, so the staging loops run with no network."""

    def __init__(self, source=None, sink=None):
        self.source, self.sink, self.offset = source, sink, 0

    def send(self, view, peer, tag) -> None:
        self.sink[self.offset:self.offset + len(view)] = view
        self.offset += len(view)

    def irecv(self, view, peer, tag) -> _Done:
        view[:] = self.source[self.offset:self.offset + len(view)]
        self.offset += len(view)
        return _Done()


def median_seconds(fn, reps: int, sync) -> float:
    fn()  # warm: pools, pinned buffers, kernels
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def staging_rows(xp, size: int, reps: int) -> list:
    """H2D and D2H: the staging loops against CuPy's own copies, in this process."""
    from mwrt import staging

    host = np.random.default_rng(0).integers(0, 255, size, np.uint8)
    tag = staging.tag_for(1, size, True)
    with xp.cuda.Device(0):
        stream = xp.cuda.Stream(non_blocking=True)
        device = xp.asarray(host)
        back = np.empty_like(host)

        def staged_h2d():
            return staging.Receive(MemoryChannel(source=host), host.shape, host.dtype, 0, 0,
                                   tag).finish(xp, stream)

        def staged_d2h():
            staging.send_array(MemoryChannel(sink=back), device, 0, tag, stream)

        with stream:
            got = staged_h2d()
            if not np.array_equal(got.get(), host):
                raise SystemExit("bench_gpu: the staged H2D copy is wrong")
            rows = [
                ("H2D", median_seconds(staged_h2d, reps, stream.synchronize),
                 "cupy.asarray", median_seconds(lambda: xp.asarray(host), reps,
                                                stream.synchronize)),
                ("D2H", median_seconds(staged_d2h, reps, stream.synchronize),
                 ".get()", median_seconds(lambda: device.get(), reps, stream.synchronize)),
            ]
        if not np.array_equal(back, host):
            raise SystemExit("bench_gpu: the staged D2H copy is wrong")
    return [(f"{what} {_size(size)}, staged (pinned pool, chunks)", size / t, base, size / b)
            for what, t, base, b in rows]


D2D_BATCH = 8


def floors(xp, size: int, reps: int) -> dict:
    """What bounds the staged rows: the copy engine from and to pinned memory, and the host
    copy into pinned buffers of the staging's chunk size (GB/s)."""
    from mwrt import config

    chunk = min(config.get("staging_chunk_bytes"), size)
    host = np.random.default_rng(2).integers(0, 255, size, np.uint8)
    pinned = np.frombuffer(xp.cuda.alloc_pinned_memory(size), np.uint8, size)
    with xp.cuda.Device(0):
        stream = xp.cuda.Stream(non_blocking=True)
        device = xp.empty(size, np.uint8)
        h2d = median_seconds(lambda: device.set(pinned, stream=stream), reps, stream.synchronize)
        d2h = median_seconds(lambda: _download_all(device, pinned, stream), reps,
                             stream.synchronize)
    copy = median_seconds(lambda: [np.copyto(pinned[a:a + chunk], host[a:a + chunk])
                                   for a in range(0, size, chunk)], reps, lambda: None)
    return {"pinned H2D": size / h2d, "pinned D2H": size / d2h,
            f"host copy into pinned, {_size(chunk)} chunks": size / copy}


def _download_all(device, out, stream) -> None:
    try:
        device.get(stream=stream, out=out, blocking=False)
    except TypeError:  # CuPy < 13: a given stream makes it asynchronous
        device.get(stream=stream, out=out)


def session_rows(mwrt, xp, size: int, reps: int, gpus: int) -> list:
    """D2D and master<->GPU end to end, through a session with one local worker."""
    n = size // 4
    host = np.random.default_rng(1).random(n, dtype=np.float32)
    x, y = mwrt.dist_send(host, device=0), mwrt.empty(n, device=0)
    rows = []
    with xp.cuda.Device(0):
        a, b = xp.asarray(host), xp.empty(n, np.float32)
        sync = xp.cuda.Device(0).synchronize
        # Copies issued back to back and one sync, as a program issues them: a sync's round
        # trip (~0.1 ms) would otherwise weigh more than a 256 MiB copy on a GPU (~0.2 ms).
        rows.append((f"D2D {_size(size)} on one GPU: y.copy_(x), {D2D_BATCH} per sync",
                     D2D_BATCH * size / median_seconds(
                         lambda: [y.copy_(x) for _ in range(D2D_BATCH)], reps, mwrt.synchronize),
                     "cupy.copyto", D2D_BATCH * size / median_seconds(
                         lambda: [xp.copyto(b, a) for _ in range(D2D_BATCH)], reps, sync)))
        if gpus > 1:
            def peer():
                with xp.cuda.Device(1):
                    xp.asarray(a)
            rows.append((f"GPU 0 -> GPU 1 {_size(size)}: .to(device=1)",
                         size / median_seconds(lambda: x.to(device=1), reps, mwrt.synchronize),
                         "cupy.asarray on 1", size / median_seconds(peer, reps, sync)))
        rows.append((f"master -> GPU {_size(size)}: dist_send(device=0)",
                     size / median_seconds(lambda: mwrt.dist_send(host, device=0), reps,
                                           mwrt.synchronize),
                     "cupy.asarray", size / median_seconds(lambda: xp.asarray(host), reps, sync)))
        if not np.array_equal(x.numpy(), host):
            raise SystemExit("bench_gpu: master -> GPU -> master changed the bytes")
        rows.append((f"GPU -> master {_size(size)}: .numpy()",
                     size / median_seconds(x.numpy, reps, lambda: None),
                     ".get()", size / median_seconds(a.get, reps, lambda: None)))
    return rows


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> int:
    args = parse()
    if args.fake:
        os.environ["MWRT_FAKE_GPUS"] = "2"
        os.environ.setdefault("MWRT_FAKE_GPU_BYTES", str(2 << 30))
    from mwrt import arrays

    gpus = arrays.device_count()
    if gpus == 0:
        print("bench_gpu: no GPU here (no CuPy with a CUDA device); nothing to measure. Run it "
              "on a GPU machine (pip install mwrt[cuda12]), or with --fake to check the "
              "benchmark itself.")
        return 0
    import mwrt

    xp = arrays.gpu_module()
    size = (16 << 20) if args.quick else (256 << 20)
    reps = 3 if args.quick else 7
    rows = staging_rows(xp, size, reps)
    limits = floors(xp, size, reps)
    mwrt.init_master_worker(local_workers=1, timeout=60)
    try:
        rows += session_rows(mwrt, xp, size, reps, min(gpus, mwrt.device_count(0)))
    finally:
        mwrt.shutdown()
    name = arrays.devices()[0]["name"]
    print(f"bench_gpu on {name}" + (" (mwrt.testing.fakegpu: host memory, no GPU measured)"
                                    if args.fake else ""))
    print(f"{'what':50} {'mwrt GB/s':>10}   {'baseline (same run)':>26} {'ratio':>7}")
    for what, ours, base, theirs in rows:
        print(f"{what:50} {ours / 1e9:>10.2f}   {base + f' {theirs / 1e9:.2f}':>26} "
              f"{ours / theirs:>6.2f}x")
    print("floors, same run: " + ", ".join(f"{what} {rate / 1e9:.2f} GB/s"
                                            for what, rate in limits.items()))
    print()
    return nccl_table(args)


def nccl_table(args) -> int:
    """NCCL all_reduce bus bandwidth beside CuPy's NCCL: bench_gpu_nccl.py, in its own ranks."""
    command = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "bench_gpu_nccl.py")]
    if args.quick:
        command += ["--sizes", "1M", "--iters", "3"]
    if args.fake:
        command.append("--fake")
    sys.stdout.flush()  # this table before the ranks' one, also when piped
    return subprocess.run(command, check=False, timeout=900).returncode


if __name__ == "__main__":
    sys.exit(main())
