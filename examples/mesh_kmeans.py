"""k-means over a mesh: the points are split over the nodes and never move; each step the
workers count and sum their points per cluster (Partial sums, all_reduced between them)
and every node updates the replicated centres.

    python examples/mesh_kmeans.py
"""

import numpy as np

import mwrt


def main():
    mwrt.init_master_worker(local_workers=2)
    rng = np.random.default_rng(1)
    truth = rng.uniform(-10, 10, (4, 2))
    points = np.concatenate([c + rng.standard_normal((500, 2)) for c in truth])

    mesh = mwrt.mesh()
    P = mwrt.dist_send(points, mesh=mesh, shard=0)            # (2000, 2), rows split
    C = mwrt.dist_send(points[rng.choice(len(points), 4, replace=False)], mesh=mesh)
    for step in range(10):
        d = ((P[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)   # (n, k): Shard(0)
        near = d == d.min(axis=1, keepdims=True)                 # one-hot nearest centre
        counts = near.sum(axis=0)                                # Partial(sum)
        sums = near.T.astype(np.float64) @ P                     # Partial(sum)
        C = sums / np.maximum(counts, 1)[:, None]                # replicated again
        inertia = float(d.min(axis=1).sum())
        print(f"step {step}  inertia {inertia:.1f}")
    found = np.sort(C.numpy(), axis=0)
    print(f"centres found within 0.2 of the truth: "
          f"{np.allclose(found, np.sort(truth, axis=0), atol=0.2)}")
    mwrt.shutdown()


if __name__ == "__main__":
    main()
