"""The 2017 proposal's SPMD example, unchanged (numpy imported, the result printed)."""
import numpy as np

import mwrt.distributed as dist
dist.init_process_group(backend='tcp')
rank, n = dist.get_rank(), dist.get_num_processes()
if rank == 0:
    t = np.arange(4.0); dist.send(t, 1)
else:
    t = dist.recv(0)                    # a new array: shape and dtype sent ahead
result = dist.all_reduce(t)             # returns its tensor

print("proposal", rank, n, type(result).__name__, result.dtype, result.tolist(), flush=True)
dist.destroy_process_group()
