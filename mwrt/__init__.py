"""mwrt: a master-worker remote-tensor runtime.

The master (this script) holds DistributedTensor handles; the arrays live on worker
daemons. Every op returns at once; copies to the master are the sync points.
"""

from . import channels
from .arrays import HOST
from .cluster import init_master_worker, is_initialized, shutdown
from .context import current_device, current_node, device, node
from .creation import TYPED_CONSTRUCTORS, arange, empty, full, manual_seed, ones, rand, randn, zeros
from .errors import (
                       ChannelClosedError,
                       ChannelError,
                       CollectiveMismatchError,
                       MwrtError,
                       RemoteError,
                       WireError,
                       WorkerLostError,
)
from .profile import profile
from .reduce_ops import ReduceOp
from .remote import remote
from .streams import Event, Stream, current_stream, stream
from .tensor import DistributedTensor
from .tensor_collectives import all_gather, all_reduce, broadcast, gather, reduce, scatter
from .transfer import put as dist_send
from .worker_api import device_count, memory_stats, num_nodes, synchronize

globals().update(TYPED_CONSTRUCTORS)

__version__ = "0.1.0"
__all__ = [
    "init_master_worker", "shutdown", "is_initialized", "num_nodes", "node", "device",
    "current_node", "current_device", "DistributedTensor", "dist_send", "empty", "zeros", "ones",
    "full", "arange", "rand", "randn", "manual_seed", "remote", "synchronize", "memory_stats",
    "device_count", "ReduceOp", "all_reduce", "broadcast", "reduce", "all_gather", "gather",
    "scatter", "Stream", "Event", "stream", "current_stream", "profile",
    "channels", "HOST", "MwrtError", "RemoteError", "WorkerLostError", "ChannelError",
    "ChannelClosedError", "CollectiveMismatchError", "WireError", *TYPED_CONSTRUCTORS,
]
