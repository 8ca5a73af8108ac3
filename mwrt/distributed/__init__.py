"""mwrt.distributed: torch.distributed's SPMD API over mwrt channels, with arrays for tensors.

    import mwrt.distributed as dist
    dist.init_process_group("tcp")            # env:// (set by mwrt-launch or dist.spawn)
    dist.all_reduce(arr, op=dist.ReduceOp.SUM)
"""

from ..reduce_ops import ReduceOp
from ..rendezvous import FileStore, HashStore, Store, TCPStore
from .api import (
                  GroupMember,
                  Work,
                  destroy_process_group,
                  get_backend,
                  get_process_group_ranks,
                  get_rank,
                  get_world_size,
                  init_process_group,
                  irecv,
                  is_initialized,
                  isend,
                  new_group,
                  recv,
                  send,
)
from .collective import (
                  all_gather,
                  all_gather_into_tensor,
                  all_gather_object,
                  all_reduce,
                  all_to_all,
                  all_to_all_single,
                  barrier,
                  broadcast,
                  broadcast_object_list,
                  gather,
                  monitored_barrier,
                  reduce,
                  reduce_scatter,
                  reduce_scatter_tensor,
                  scatter,
)
from .spawn import RankFailedError, spawn

__all__ = [
    "ReduceOp", "Store", "HashStore", "TCPStore", "FileStore", "GroupMember", "Work",
    "init_process_group", "destroy_process_group", "is_initialized", "get_rank",
    "get_world_size", "get_backend", "get_process_group_ranks", "new_group",
    "send", "recv", "isend", "irecv", "broadcast", "all_reduce", "reduce", "gather", "scatter",
    "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "all_gather_object",
    "broadcast_object_list",
    "spawn", "RankFailedError",
]
