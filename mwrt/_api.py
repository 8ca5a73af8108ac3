"""The public API of mwrt's package root, loaded on its first use (mwrt/__init__.py).

Every name a user reaches as `mwrt.NAME`, imported from where it is defined: the master's,
the dashboard's and the Array API namespace's. A worker daemon or an SPMD rank imports the
package root too, and never loads this.
"""

from . import channels
from .arrays import HOST
from .collective.reduce_ops import ReduceOp
from .dashboard import dashboard
from .errors import (
    AuthError,
    ChannelClosedError,
    ChannelError,
    ChannelTimeoutError,
    CollectiveMismatchError,
    ConfigError,
    MwrtError,
    QuotaError,
    RemoteError,
    RendezvousError,
    RendezvousTimeoutError,
    WireError,
    WorkerLostError,
)
from .master.checkpoint import SaveHandle, load, save
from .master.cluster import init_master_worker, is_initialized, replace_node, shutdown
from .master.collectives import (
    all_gather,
    all_reduce,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from .master.context import Device, current_device, current_node, device, node
from .master.creation import (
    TYPED_CONSTRUCTORS,
    arange,
    empty,
    full,
    manual_seed,
    ones,
    rand,
    randn,
    remote,
    zeros,
)
from .master.creation import put as dist_send
from .master.graph import Graph, graph
from .master.mesh.device_mesh import Mesh, mesh
from .master.mesh.placement import (
    Partial,
    Placement,
    PlacementError,
    PlacementWarning,
    Replicate,
    Shard,
)
from .master.profile import profile
from .master.queries import (
    cancel,
    device_count,
    devices,
    memory_stats,
    num_nodes,
    status,
    synchronize,
)
from .master.reattach import attached
from .master.streams import Event, Stream, current_stream, stream
from .master.tensor import DistributedTensor, ShardedTensor
from .master.waits import stats

# isort: split
from . import array_api  # over the master's modules above, after them

globals().update(TYPED_CONSTRUCTORS)

__all__ = [
    "init_master_worker", "shutdown", "is_initialized", "num_nodes", "node", "device",
    "current_node", "current_device", "DistributedTensor", "dist_send", "empty", "zeros", "ones",
    "full", "arange", "rand", "randn", "manual_seed", "remote", "synchronize", "cancel",
    "memory_stats", "stats", "device_count", "ReduceOp", "all_reduce", "broadcast", "reduce",
    "all_gather", "gather", "scatter", "Stream", "Event", "stream", "current_stream", "profile",
    "graph", "Graph", "devices", "status", "dashboard", "channels", "array_api", "Device",
    "HOST", "MwrtError", "RemoteError", "WorkerLostError", "ChannelError",
    "ChannelClosedError", "CollectiveMismatchError", "WireError", "QuotaError", "ConfigError",
    "AuthError", "ChannelTimeoutError", "RendezvousError", "RendezvousTimeoutError",
    "mesh", "Mesh", "ShardedTensor", "Shard", "Replicate", "Partial", "Placement",
    "PlacementError", "PlacementWarning", "reduce_scatter",
]
__all__ += list(TYPED_CONSTRUCTORS)  # float32, int64...: zeros and kin of one dtype
__all__ += ["save", "load", "SaveHandle", "replace_node", "attached"]  # going on after a failure
