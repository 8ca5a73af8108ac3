"""Rank 3 calls all_reduce with another shape than ranks 0-2: run by tests on 2 simulated
hosts x 2 ranks, where all_reduce goes two-level. Prints each rank's error type and text."""

from __future__ import annotations

import numpy as np

import mwrt.distributed as dist


def main() -> None:
    dist.init_process_group(timeout=30)
    rank = dist.get_rank()
    a = np.ones(1000 if rank != 3 else 1001, np.float32)
    try:
        dist.all_reduce(a)
        print(f"rank {rank}: no error", flush=True)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
