"""Going on after a lost worker: save in the background, replace the node, load, finish.

A least-squares model is trained data-parallel on two local workers and saved every few
steps with mwrt.save(..., wait=False): each worker writes its own tensors while the loop
goes on. Halfway, node 1's daemon is killed; mwrt.replace_node(1) starts a new one, and
mwrt.load puts the last checkpoint back. The run ends at the weights of a run that lost
nothing.
"""

import tempfile
import time

import numpy as np

import mwrt

STEPS, SAVE_EVERY, KILL_AT = 20, 5, 12
rng = np.random.default_rng(0)
X = [rng.standard_normal((64, 8)) for _ in range(2)]
Y = [x @ np.arange(8.0) for x in X]


def train(folder: str | None, kill_at: int | None = None) -> np.ndarray:
    """Run STEPS steps (from the last checkpoint after a loss); returns the weights."""
    data = [(mwrt.dist_send(X[i], node=i), mwrt.dist_send(Y[i], node=i)) for i in range(2)]
    w = [mwrt.zeros(8, dtype=np.float64, node=i) for i in range(2)]
    step, handle = 0, None
    while step < STEPS:
        grads = [x.T @ (x @ wi - y) for (x, y), wi in zip(data, w)]
        mwrt.all_reduce(grads)  # worker to worker
        for wi, g in zip(w, grads):
            wi -= 0.002 * g
        step += 1
        if folder and step % SAVE_EVERY == 0:
            handle = mwrt.save(folder, {"w0": w[0], "w1": w[1],
                                        "step": mwrt.dist_send(np.array(step))}, wait=False)
        if step == kill_at and handle is not None:
            handle.wait()
            cluster = mwrt.master.cluster.current()
            cluster.local[1].process.kill()  # a machine fails
            while cluster.nodes[1].lost is None:
                time.sleep(0.05)
            print(f"step {step}: node 1 lost; replacing it and loading the last checkpoint")
            mwrt.replace_node(1)
            state = mwrt.load(folder)
            w, step = [state["w0"], state["w1"]], int(state["step"].numpy())
            data = [(mwrt.dist_send(X[i], node=i), mwrt.dist_send(Y[i], node=i))
                    for i in range(2)]
            kill_at = None  # once
            print(f"resumed at step {step}")
    if handle is not None:
        handle.wait()  # the last save is in the folder before it goes
    return w[0].numpy()


if __name__ == "__main__":
    mwrt.init_master_worker(local_workers=2)
    clean = train(None)
    with tempfile.TemporaryDirectory() as folder:
        resumed = train(folder, kill_at=KILL_AT)
    print("same weights as the run that lost nothing:", np.array_equal(clean, resumed))
    mwrt.shutdown()
