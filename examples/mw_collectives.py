"""Collectives the master issues over tensors on several workers (data moves worker to worker).

    python examples/mw_collectives.py
"""

import numpy as np

import mwrt

mwrt.init_master_worker(local_workers=3)
grads = [mwrt.dist_send(np.full(4, float(i + 1)), node=i) for i in range(3)]
mwrt.all_reduce(grads)  # every node now holds the sum
print("all_reduce on node 2:", grads[2].numpy())

gathered = mwrt.gather([mwrt.full(2, i, node=i) for i in range(3)], dst=0)
print("gather on node 0:\n", gathered.numpy())

parts = mwrt.scatter(mwrt.dist_send(np.arange(6).reshape(3, 2), node=0), nodes=[0, 1, 2])
print("scatter:", [(p.get_node(), p.numpy().tolist()) for p in parts])

big = mwrt.rand(1 << 20, node=0)
moved = big.to(node=2)  # worker to worker over the data channel, not through the master
print("moved", moved.nbytes >> 20, "MiB to node", moved.get_node())
mwrt.shutdown()
