"""A master driving workers on other hosts: run by tests on simulated hosts.

    MWRT_WORKERS=b:7070,c:7070 MWRT_KEY_FILE=~/keys/master.key python mw_calls.py

64 MiB there and back, ops, a worker-to-worker move, a master-issued all_reduce and a
shipped function (and one that fails there, named by file and line); prints 'ok: ...' with the nodes' hostnames when every check passed.
"""

from __future__ import annotations

import numpy as np

import mwrt


def main() -> None:
    mwrt.init_master_worker()
    cluster = mwrt.master.cluster.current()
    big = np.random.default_rng(0).standard_normal(8 << 20)  # 64 MiB of float64
    t = mwrt.dist_send(big, node=0)
    assert np.array_equal(t.numpy(), big), "64 MiB round trip to node 0"
    u = (t * 2 + 1).sum()
    assert np.isclose(float(u), float((big * 2 + 1).sum())), "ops on node 0"
    moved = t.to(node=1)  # worker to worker: the master sends two commands
    assert moved.get_node() == 1 and np.array_equal(moved.numpy(), big), "move 0 -> 1"
    with mwrt.node(1):
        ones = mwrt.ones(1 << 20)  # made where `with node` says
    parts = [mwrt.full(1 << 20, 3.0, dtype=np.float32, node=0), ones]
    mwrt.all_reduce(parts)
    assert all((p.numpy() == 4.0).all() for p in parts), "all_reduce over nodes 0 and 1"
    shipped = mwrt.remote(lambda a: a + 1)(parts[1])
    assert shipped.get_node() == 1 and (shipped.numpy() == 5.0).all(), "remote on node 1"
    failed_there(parts[1])
    print(f"ok: nodes on {[n.info.hostname for n in cluster.nodes]}, channel "
          f"{cluster.channel_name}", flush=True)
    mwrt.shutdown()


def failed_there(tensor) -> None:
    """A shipped function failing on another host: the master names its file and line."""
    def fails(a):
        raise ValueError("shipped and failed")
    try:
        mwrt.remote(fails)(tensor).numpy()
    except mwrt.RemoteError as exc:
        text = exc.remote_traceback
        assert __file__ in text and 'raise ValueError("shipped and failed")' in text, text
    else:
        raise AssertionError("a failing shipped function raised nothing")


if __name__ == "__main__":
    main()
