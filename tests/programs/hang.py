"""Rank 0 enters all_reduce; rank 1 does not until the file argv[1] exists (or ever)."""
import os
import sys
import time

import numpy as np

import mwrt.distributed as dist

dist.init_process_group("tcp")
if dist.get_rank() == 1:
    go = sys.argv[1] if len(sys.argv) > 1 else None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (go and os.path.exists(go)):
        time.sleep(0.05)
    if not go:
        time.sleep(3600)  # never calls: the others time out
print("entering", flush=True)
print("result", dist.all_reduce(np.ones(4)).tolist(), flush=True)
dist.destroy_process_group()
