"""Two streams on one worker overlap; an event on node 1 orders a stream on node 0.

    python examples/mw_streams_events.py
"""

import time

import numpy as np

import mwrt


def slow_square(a):
    time.sleep(0.5)  # stands for a long kernel
    return a * a


mwrt.init_master_worker()
x = mwrt.dist_send(np.arange(4.0))
a, b = mwrt.Stream(), mwrt.Stream()  # two streams on node 0: their ops may overlap
for s in (a, b):  # as in CUDA: x was made on the default stream, so wait for it first
    s.wait_stream(mwrt.current_stream())
start = time.perf_counter()
with mwrt.stream(a):
    ya = mwrt.remote(slow_square)(x)
with mwrt.stream(b):
    yb = mwrt.remote(slow_square)(x)
a.synchronize(), b.synchronize()
print(f"two 0.5 s ops on two streams took {time.perf_counter() - start:.2f} s")

with mwrt.node(1):  # an event recorded on node 1 ...
    s1 = mwrt.Stream()
    with mwrt.stream(s1):
        z = mwrt.remote(slow_square)(mwrt.ones(3))
    done = s1.record_event()
a.wait_event(done)  # ... holds stream a of node 0; the master does not wait
with mwrt.stream(a):
    after = ya + 1  # runs once node 1's work is done
print("node 0 after node 1's event:", after.numpy())

with mwrt.profile() as prof:
    (x @ x).numpy()
print(prof.table())
mwrt.shutdown()
