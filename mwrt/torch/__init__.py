"""mwrt as a torch.distributed backend: `import mwrt.torch`, then init_process_group("mwrt").

Importing this package registers the backend "mwrt" with torch.distributed. Its process
group (mwrt.torch.backend_group) is a Python `torch.distributed.ProcessGroup` whose collectives
hand CPU tensors, as zero-copy DLPack views, to mwrt.collective over one of mwrt's
channels (MWRT_CHANNEL, "auto" by default: shared memory on a host, tcp between hosts).
Ranks find each other through the store torch made for the group (mwrt.torch.store), so
`init_method="env://"` under torchrun or mwrt-launch, `tcp://` and `file://` all work;
torch's DDP (comm hooks and Join included), FSDP2, DTensor, device meshes, functional
collectives, new_group and the usual calls then run unchanged, with mwrt's agreement checks
and error text. torch is an optional dependency: `pip install mwrt[torch]`.

It also names the constructors of torch handles in master-worker mode (`mwrt.torch.zeros`,
`ones`, `empty`, `full`, `randn`, `rand`, `tensor`, `manual_seed`), `module` and `optim`
(models and optimizers kept where their parameters live) and `fully_shard` (a model's
parameters sharded over a mesh), made by mwrt.master's torchcreation, torchmodule and
torchfsdp and loaded on first use, so an SPMD rank never loads them.
"""

from __future__ import annotations

import atexit

import numpy as np

try:
    import torch.distributed as dist
except ModuleNotFoundError as missing:  # torch is optional: say how to get it
    raise ModuleNotFoundError(f"mwrt.torch needs torch ({missing}): pip install 'mwrt[torch]'",
                              name="torch") from None

from .. import channels, config
from ..collective import api as C
from ..collective import watchdog
from ..collective.group import ProcessGroup as MwrtGroup
from ..protocol import auth
from ..store import rendezvous
from .backend_group import BACKEND, LIVE, MwrtProcessGroup
from .store import TorchStore
from .work import MwrtWork


@atexit.register
def _leave_at_exit() -> None:
    """A script that ends without destroy_process_group still leaves its peers cleanly."""
    for pg in list(LIVE):
        pg.channel.leave()


def create_process_group(opts, backend_options=None) -> MwrtProcessGroup:
    """torch's backend creator (its extended form, which tells the group's name and global
    ranks): rendezvous through torch's store, then connect an mwrt channel."""
    rank, size = opts.group_rank, opts.group_size
    seconds = (opts.timeout.total_seconds() if opts.timeout is not None
               else config.get("rendezvous_timeout"))
    mstore, prefix = TorchStore(opts.store, seconds), "mwrt"
    peers = rendezvous(mstore, rank, size, prefix=prefix, timeout=seconds)
    channel = channels.create(config.get("channel"), rank, size, store=mstore, prefix=prefix,
                              timeout=seconds, key=auth.job_secret())
    try:
        group = MwrtGroup(channel, store=mstore, prefix=prefix, peers=peers, timeout=seconds)
        # Errors name the group as torch knows it; their ranks are the group's.
        group.name = (f"torch group {opts.group_id} (global ranks "
                      f"{list(opts.global_ranks_in_group) or list(range(size))})")
        # Connect every pair now, while rank 0 (which serves torch's store) is sure to be up.
        probe = np.zeros(size, np.uint8)
        with watchdog.internal(group, "init_process_group"):  # no collective of the user's
            C.all_to_all(group, probe.copy(), probe)
    except BaseException:
        channel.close()
        raise
    return MwrtProcessGroup(group, channel, rank, size, name=str(opts.group_id))


dist.Backend.register_backend(BACKEND, create_process_group, extended_api=True,
                              devices=["cpu"])

_HANDLES = frozenset({"zeros", "ones", "empty", "full", "randn", "rand", "tensor",
                      "manual_seed", "TorchTensor", "module", "optim", "fully_shard"})


def __getattr__(name: str):
    """The constructors of torch handles (master-worker mode), loaded on first use."""
    if name not in _HANDLES:
        raise AttributeError(f"module 'mwrt.torch' has no attribute {name!r}")
    from ..master import torchcreation, torchfsdp, torchmeshmodule

    if name == "fully_shard":
        return torchfsdp.fully_shard
    return getattr(torchmeshmodule if name in ("module", "optim") else torchcreation, name)


__all__ = ["BACKEND", "MwrtProcessGroup", "MwrtWork", "TorchStore", "create_process_group"]
