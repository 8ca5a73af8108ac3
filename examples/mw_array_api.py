"""Array-API code runs on remote tensors unchanged: a function written against the standard
(`xp = x.__array_namespace__()`) gives NumPy's answer on a NumPy array and on a tensor that
lives on node 1, where every one of its ops runs.

Run: python examples/mw_array_api.py   (starts 2 local worker daemons)
"""

import numpy as np

import mwrt


def ridge(X, y, alpha):
    """Ridge regression weights, in the Array API standard only."""
    xp = X.__array_namespace__()
    n_features = X.shape[1]
    gram = xp.matmul(xp.matrix_transpose(X), X) + alpha * xp.eye(n_features, device=X.device)
    return xp.linalg.solve(gram, xp.matmul(xp.matrix_transpose(X), y))


mwrt.init_master_worker()
xp = mwrt.array_api

rng = np.random.default_rng(0)
X = rng.standard_normal((200, 8))
y = X @ np.arange(8.0) + 0.01 * rng.standard_normal(200)

on_node_1 = xp.Device(node=1)
Xt, yt = xp.asarray(X, device=on_node_1), xp.asarray(y, device=on_node_1)
w = ridge(Xt, yt, 0.1)  # issued to node 1; nothing has come back yet
print("weights:", w.device, w.shape, w.dtype)
print("same result on NumPy and on node 1:", np.allclose(w.numpy(), ridge(X, y, 0.1)))

values, counts = xp.unique_counts(xp.round(yt / 10))  # the standard's named tuple
print("unique_counts:", type(xp.unique_counts(yt)).__name__, values.shape, counts.dtype)
