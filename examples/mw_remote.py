"""Ship a function to the worker that holds its tensors; errors name the place and your line.

    python examples/mw_remote.py
"""


import mwrt

mwrt.init_master_worker()


@mwrt.remote
def normalize(a):
    return (a - a.mean()) / a.std()


with mwrt.node(1):
    x = mwrt.randn(1000)
y = normalize(x)  # runs on node 1, returns at once
print("mean, std on node 1:", float(y.mean()), float(y.std()))

broken = mwrt.remote(lambda a: a.reshape(7, 7))(x)
try:
    broken.numpy()
except mwrt.RemoteError as err:
    print("RemoteError:", str(err).splitlines()[0])
    print("  issued at:", err.issued_at)
mwrt.shutdown()
