"""Rank 0 enters all_reduce (argv[1] "recv": recv from rank 1); rank 1 does not until the
file argv[1] exists, or ever."""
import os
import sys
import time

import numpy as np

import mwrt.distributed as dist

dist.init_process_group("tcp")
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if dist.get_rank() == 1:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (mode and os.path.exists(mode)):
        time.sleep(0.05)
    if mode in ("", "recv"):
        time.sleep(3600)  # never calls: the others time out
print("entering", flush=True)
if mode == "recv":
    print("got", dist.recv(1))
print("result", dist.all_reduce(np.ones(4)).tolist(), flush=True)
dist.destroy_process_group()
