"""NumPy's own functions on remote tensors: np.linalg, np.fft, np.einsum run on the worker.

Run: python examples/mw_numpy_functions.py   (starts 2 local worker daemons)
"""

import numpy as np

import mwrt

mwrt.init_master_worker()

rng = np.random.default_rng(0)
a = rng.standard_normal((256, 256)).astype(np.float32)
t = mwrt.dist_send(a @ a.T + 256 * np.eye(256, dtype=np.float32), node=1)  # lives on node 1

inv = np.linalg.inv(t)  # runs on node 1; returns at once
w, v = np.linalg.eigh(t)  # a tuple of tensors, as NumPy's
spectrum = np.fft.rfft(t, axis=0)
print("shapes known before any wait:", inv.shape, w.shape, v.shape, spectrum.shape,
      spectrum.dtype)

identity = np.einsum("ij,jk->ik", t, inv)  # still on node 1
print("t @ inv(t) is the identity:", np.allclose(identity.numpy(), np.eye(256), atol=1e-3))

values = np.linalg.eigvals(t)  # no shape rule: its dtype depends on the data, found on use
print("eigvals, issued:", repr(values))
print("eigvals, asked:", values.dtype, values.shape)  # asks the worker once

try:
    np.concatenate([t, mwrt.ones(2, 256, node=0)])
except ValueError as exc:
    print("error:", exc)
