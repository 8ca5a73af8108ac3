"""mwrt.distributed: torch.distributed's SPMD API over mwrt channels, with arrays for tensors.

    import mwrt.distributed as dist
    dist.init_process_group("tcp")            # env:// (set by mwrt-launch or dist.spawn)
    dist.all_reduce(arr, op=dist.ReduceOp.SUM)
"""

from ..collective.reduce_ops import ReduceOp
from ..errors import AuthError as AuthError
from ..errors import ChannelClosedError as ChannelClosedError
from ..errors import ChannelError as ChannelError
from ..errors import ChannelTimeoutError as ChannelTimeoutError
from ..errors import CollectiveMismatchError as CollectiveMismatchError
from ..errors import ConfigError as ConfigError
from ..errors import MwrtError as MwrtError
from ..errors import RendezvousError as RendezvousError
from ..errors import RendezvousTimeoutError as RendezvousTimeoutError
from ..errors import WireError as WireError
from ..store import FileStore, HashStore, PrefixStore, Store, TCPStore
from .backends import Backend, is_gloo_available, is_mpi_available, is_nccl_available
from .collective import (
                  all_gather,
                  all_gather_into_tensor,
                  all_reduce,
                  all_to_all,
                  all_to_all_single,
                  barrier,
                  broadcast,
                  gather,
                  monitored_barrier,
                  reduce,
                  reduce_scatter,
                  reduce_scatter_tensor,
                  scatter,
)
from .objects import (
                  all_gather_object,
                  broadcast_object_list,
                  gather_object,
                  recv_object_list,
                  scatter_object_list,
                  send_object_list,
)
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .process_groups import (
                  GroupMember,
                  Work,
                  destroy_process_group,
                  get_backend,
                  get_global_rank,
                  get_group_rank,
                  get_node_local_rank,
                  get_num_processes,
                  get_process_group_ranks,
                  get_rank,
                  get_world_size,
                  group,
                  init_process_group,
                  is_available,
                  is_initialized,
                  new_group,
                  new_subgroups,
                  new_subgroups_by_enumeration,
)
from .spawn import RankFailedError, run, spawn

__all__ = [
    "ReduceOp", "Store", "HashStore", "TCPStore", "FileStore", "PrefixStore", "GroupMember", "Work",
    "Backend", "is_gloo_available", "is_nccl_available", "is_mpi_available", "group",
    "init_process_group", "destroy_process_group", "is_available", "is_initialized", "get_rank",
    "get_world_size", "get_num_processes",
    "get_backend", "get_process_group_ranks", "get_group_rank",
    "get_global_rank", "get_node_local_rank", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration",
    "send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv",
    "broadcast", "all_reduce", "reduce", "gather", "scatter",
    "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "barrier", "monitored_barrier",
    "all_gather_object", "gather_object", "scatter_object_list", "broadcast_object_list",
    "send_object_list", "recv_object_list", "spawn", "run", "RankFailedError",
    # the errors a rank meets (mwrt.errors; those of a master's workers are mwrt's alone)
    "MwrtError", "ConfigError", "WireError", "AuthError", "ChannelError", "ChannelClosedError",
    "ChannelTimeoutError", "CollectiveMismatchError", "RendezvousError",
    "RendezvousTimeoutError",
]
