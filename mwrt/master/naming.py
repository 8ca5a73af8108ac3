"""mwrt.attached(): the named tensors of a session a new master re-attached to.

A named session (`init_master_worker(session="name")`) outlives its master for
MWRT_SESSION_GRACE seconds; a master with the same name and key that connects in that
time gets the session back, and here, handles to the tensors the program had named
(`t.name = "w"`, or the names given to mwrt.save).
"""

from __future__ import annotations

import numpy as np

from ..ops import Spec
from .cluster import current
from .tensor import DistributedTensor


def attached() -> dict:
    """The named tensors of the re-attached session, by name (empty for a new session)."""
    cluster = current()
    if cluster.attached is None:
        cluster.attached = {}
        for node in cluster.nodes:
            for name, (ref, shape, dtype, device) in (node.resumed or {}).get("names",
                                                                               {}).items():
                key = name if name not in cluster.attached else f"{name} (node {node.index})"
                t = DistributedTensor(node, device, ref, Spec(tuple(shape), np.dtype(dtype)),
                                      device)
                t.name = name
                cluster.attached[key] = t
    return dict(cluster.attached)
