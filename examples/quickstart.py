"""The proposal's master-worker example: tensors on two local workers, driven from here.

Run: python examples/quickstart.py   (starts 2 local worker daemons and stops them at exit)
"""

import numpy as np

import mwrt

mwrt.init_master_worker()  # no workers named: 2 local daemons on loopback

x = mwrt.FloatTensor(20, 20).fill_(4)  # node 0, host memory (device -1)
y = mwrt.dist_send(np.random.randn(20, 20).astype(np.float32))  # to the current node, 0
z = x + y  # returns at once; runs on node 0
assert (z.get_node(), z.get_device()) == (0, -1)

with mwrt.node(1):
    a = mwrt.FloatTensor(10).fill_(1)  # node 1
    b = (a * 3).sum()  # runs where a lives: node 1
print("sum on node 1:", float(b))

if mwrt.device_count(0) > 0:  # the GPU half of the proposal's example
    cuda_x = x.cuda()  # node 0, GPU 0
    cuda_y = y.cuda()
    q = cuda_x + cuda_y
    print("on GPU", q.get_device(), "of node", q.get_node(), ":", q.numpy()[0, :3])
else:
    print("no GPU on node 0: the .cuda() half of the example is skipped")

print("z[0, :5] =", z.numpy()[0, :5])  # a sync point: copies to the master
print("matches NumPy:", np.allclose(z.numpy(), 4 + y.numpy()))
mwrt.shutdown()
