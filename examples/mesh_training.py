"""Data-parallel training over a mesh: examples/data_parallel_training.py's model, written
once for every worker. X's rows are split over the nodes; the gradient is a Partial sum
that an all_reduce between the workers makes real when the weights take it.

    python examples/mesh_training.py
"""

import numpy as np

import mwrt


def main():
    mwrt.init_master_worker(local_workers=2)
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal(8)
    x = rng.standard_normal((1024, 8))
    y = x @ true_w + 0.01 * rng.standard_normal(1024)

    mesh = mwrt.mesh()                           # every node
    X = mwrt.dist_send(x, mesh=mesh, shard=0)    # rows split over the nodes
    Y = mwrt.dist_send(y, mesh=mesh, shard=0)
    w = mwrt.zeros(8, dtype=np.float64, mesh=mesh)  # replicated
    for step in range(60):
        err = X @ w - Y                          # Shard(0): every node its rows
        w -= 0.1 * (2 * X.T @ err / len(y))      # Partial(sum), all_reduced as w takes it
        if step % 10 == 0:
            print(f"step {step:2d}  loss {float((err ** 2).mean()):.5f}")
    loss = float((err ** 2).mean())
    print(f"final loss {loss:.5f}; weight error {np.abs(w.numpy() - true_w).max():.4f}")

    # The same step captured once and replayed: one command per node per step.
    w2 = mwrt.zeros(8, dtype=np.float64, mesh=mesh)
    with mwrt.graph() as step_graph:
        err2 = X @ w2 - Y
        w2 -= 0.1 * (2 * X.T @ err2 / len(y))
    for _ in range(60):
        step_graph.replay()
    print(f"captured: final loss {float((err2 ** 2).mean()):.5f}; same weights as eager: "
          f"{np.allclose(w2.numpy(), w.numpy())}")
    mwrt.shutdown()


if __name__ == "__main__":
    main()
