"""A mesh program run by a master on one simulated host over workers on others (MWRT_WORKERS):
shards, Partial sums (read, and reduce_scattered to a Shard), redistribution and a large
replicated send, checked against NumPy."""

import socket

import numpy as np

import mwrt

mwrt.init_master_worker()
mesh = mwrt.mesh()
rng = np.random.default_rng(0)
x = rng.standard_normal((601, 256)).astype(np.float32)  # blocks beyond the inline limit
X = mwrt.dist_send(x, mesh=mesh, shard=0)
W = mwrt.dist_send(x[:256].T.copy(), mesh=mesh)  # replicated: sent once, then broadcast
checks = {
    "values": np.array_equal(X.numpy(), x),
    "matmul": np.allclose((X @ W).numpy(), x @ x[:256].T, rtol=1e-4, atol=1e-3),
    "partial": np.allclose((X.T @ X).numpy(), x.T @ x, rtol=1e-4, atol=1e-2),
    "reduce_scatter": np.allclose((X.T @ X).redistribute(shard=1).numpy(), x.T @ x, rtol=1e-4,
                                  atol=1e-2),
    "redistribute": np.array_equal(X.redistribute(shard=1).numpy(), x),
    "replicate": all(np.array_equal(s.numpy(), x) for s in X.replicate().shards()),
    "sum": np.isclose(float(X.sum()), float(x.sum()), rtol=1e-3),
}
hosts = sorted({s.get_node() for s in X.shards()})
print(f"on {socket.gethostname()}: nodes {hosts}: {checks}")
print("ok mesh" if all(checks.values()) else "mesh FAILED")
mwrt.shutdown()
