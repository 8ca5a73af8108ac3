"""NCCL all_reduce SUM float32 bus bandwidth: mwrt's nccl channel beside CuPy's NCCL called
directly, in the same run, on the same communicator.

    python benchmarks/bench_gpu_nccl.py [--sizes 1M,16M,64M,256M] [--iters 20] [--fake]

Two ranks (processes), one GPU each; on a machine with one GPU, one rank, which measures
what mwrt adds per call (time, ratio) though a lone rank moves nothing (busbw 0). Per size, each rank times `iters` calls of
`dist.all_reduce` (mwrt: the call check, an NCCL all-gather the host waits for, then
NCCL's all_reduce on the current stream), then `iters` calls of the channel's own
`NcclCommunicator.allReduce` (CuPy, nothing of mwrt), each series ended by a stream
synchronize; the two take turns three times and the best of each is kept. time = per
call, rank 0's view; busbw = bytes / time * 2(n-1)/n, NCCL's convention. Where this machine
has no CUDA device it says so and exits 0; --fake runs the same program on
the fake GPU and fake NCCL (figures meaningless: for checking the script).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mwrt.distributed as dist  # noqa: E402
from mwrt import arrays  # noqa: E402

SIZES = {"4K": 4 << 10, "64K": 64 << 10, "1M": 1 << 20, "16M": 16 << 20, "64M": 64 << 20,
         "256M": 256 << 20}


def _series(call, stream, iters: int) -> float:
    """Seconds per call of `iters` calls, ended by a stream synchronize."""
    stream.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    stream.synchronize()
    return (time.perf_counter() - start) / iters


def _rank(rank: int, sizes: list, iters: int, queue) -> None:
    xp = arrays.gpu_module()
    xp.cuda.Device(rank).use()
    dist.init_process_group("nccl", timeout=60)
    try:
        channel = dist.process_groups.resolve_group(None).channel
        nccl, stream = channel.nccl, xp.cuda.get_current_stream()
        rows = []
        for nbytes in sizes:
            x = xp.ones(nbytes // 4, xp.float32)
            ptr = x.__cuda_array_interface__["data"][0]

            def direct():
                channel.comm.allReduce(ptr, ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                                       stream.ptr)

            def ours():
                dist.all_reduce(x)

            best = {"mwrt": float("inf"), "cupy": float("inf")}
            ours(), direct()  # warm up: NCCL sets up its channels on first use
            for _ in range(3):
                best["mwrt"] = min(best["mwrt"], _series(ours, stream, iters))
                best["cupy"] = min(best["cupy"], _series(direct, stream, iters))
            rows.append((nbytes, best["mwrt"], best["cupy"]))
        dist.barrier()
        if rank == 0:
            queue.put(rows)
    finally:
        dist.destroy_process_group()


def _entry(rank: int, sizes: list, iters: int, queue) -> None:
    _rank(rank, sizes, iters, queue)


def _real_gpus() -> int:
    os.environ.pop("MWRT_FAKE_GPUS", None)
    return arrays.device_count()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M,256M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--fake", action="store_true", help="fake GPUs and NCCL (checks the script)")
    args = ap.parse_args()
    sizes = [SIZES[s] for s in args.sizes.split(",")]
    if args.fake:
        n = 2
        os.environ["MWRT_FAKE_GPUS"] = str(n)
    else:
        n = min(_real_gpus(), 2)
        if n == 0:
            print("bench_gpu_nccl: no CUDA device with CuPy here: nothing measured")
            return 0
    queue = mp.get_context("spawn").SimpleQueue()
    dist.spawn(_entry, args=(sizes, args.iters, queue), nprocs=n, timeout=900)
    rows = queue.get()
    device = "fake GPU + fake NCCL (figures meaningless)" if args.fake else \
        arrays.devices()[0]["name"]
    print(f"NCCL all_reduce SUM float32, {n} rank(s), {device}; busbw = bytes/time * 2(n-1)/n"
          + ("; one GPU: the ratio is what mwrt adds per call" if n == 1 else ""))
    print(f"{'size':>8} {'mwrt ms':>9} {'cupy ms':>9} {'mwrt GB/s':>10} {'cupy GB/s':>10} "
          f"{'ratio':>6}")
    factor = 2 * (n - 1) / n
    for nbytes, ours, direct in rows:
        print(f"{nbytes / (1 << 20):>7.3g}M {ours * 1e3:>9.3f} {direct * 1e3:>9.3f} "
              f"{nbytes * factor / ours / 1e9:>10.2f} {nbytes * factor / direct / 1e9:>10.2f} "
              f"{direct / ours:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
